"""gpurouter: the data plane of gpufleet."""

from router.compiled import install_switch

install_switch()
