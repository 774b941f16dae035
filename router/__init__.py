"""gpurouter: the data plane of gpufleet."""
