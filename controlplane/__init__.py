"""gpufleet controlplane."""
