"""Print what the agent's NVML discovery and health checks see on this machine.

    python bench/gpu_check.py          # on a GPU node; exits 1 when NVML finds no GPU

It is the same code the agent runs (controlplane/agent/nvml.py): names to classes, fabric,
and each health check with its raw answer, so that a new GPU model or driver can be checked
by hand before it joins a fleet.
"""

import json
import sys
import time

from controlplane.agent.nvml import (
    NvmlInventory,
    _ecc,
    _fabric_health,
    _retired_pages,
    _row_remap,
    check_health,
    load_nvml,
)


def main() -> int:
    nvml = load_nvml()
    if nvml is None:
        print("NVML found no NVIDIA GPU (no driver, or no device)")
        return 1
    print("driver", nvml.nvmlSystemGetDriverVersion(), "NVML", nvml.nvmlSystemGetNVMLVersion())
    inventory = NvmlInventory(nvml, "this-node", "127.0.0.1", None)
    try:
        print(json.dumps(inventory.describe(), indent=2))
        for gpu in inventory.gpus:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            print(f"\nGPU {gpu.index}: {gpu.name!r} -> {gpu.gpu_class}, fabric {gpu.fabric}")
            for check in (_ecc, _row_remap, _retired_pages, _fabric_health):
                try:
                    answer = check(nvml, handle) or "ok"
                except nvml.NVMLError as exc:
                    answer = f"NVML error: {exc}"
                print(f"  {check.__name__.strip('_'):<14} {answer}")
            print(f"  {'verdict':<14} {check_health(nvml, gpu.index)}")
        time.sleep(2)  # let the XID watcher see any event already queued
        print("\nhealth report:", json.dumps(inventory.health()))
    finally:
        inventory.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
