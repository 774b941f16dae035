"""gpufleet controlplane.agent."""
