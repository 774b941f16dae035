import time

import pynvml
import pytest

from controlplane.agent.gpu_names import gpu_class
from controlplane.agent.nvml import NvmlInventory, check_health, discover, node_fabric
from tests.agent.fake_nvml import FakeGPU, FakeNvml

CLUSTER = bytes.fromhex("0123456789abcdef0123456789abcdef")
UP = (CLUSTER, 7, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)


@pytest.mark.parametrize(
    "name, memory, expected",
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", 40536, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB-PCIE"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB-NVL"),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("NVIDIA B200", 183359, "B200-180GB"),
        ("Tesla T4", 15360, "T4-16GB"),
        (b"NVIDIA L4", 23034, "L4-24GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "GeForce-RTX-4090-24GB"),
    ],
)
def test_names_become_classes(name, memory, expected):
    assert gpu_class(name, memory) == expected


def test_discovery_with_and_without_fabric():
    nvml = FakeNvml([FakeGPU(fabric=UP), FakeGPU(fabric=UP)])
    gpus = discover(nvml)
    assert [(g.index, g.uuid, g.gpu_class, g.memory_mb) for g in gpus] == [
        (0, "GPU-fake-0", "H100-80GB", 81559),
        (1, "GPU-fake-1", "H100-80GB", 81559),
    ]
    assert node_fabric(gpus, "ib-a", "n1") == "nvl-01234567-89ab-cdef-0123-456789abcdef.7"
    starting = FakeNvml(
        [
            FakeGPU(
                fabric=(CLUSTER, 7, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS)
            )
        ]
    )
    assert node_fabric(discover(starting), "ib-a", "n1") == "ib-a"
    assert node_fabric(discover(FakeNvml([FakeGPU()])), None, "n1") == "n1"


@pytest.mark.parametrize(
    "gpu, reason",
    [
        (FakeGPU(), ""),
        (FakeGPU(ecc_uncorrected=2), "2 uncorrectable ECC error(s) since the last reset"),
        (FakeGPU(remap_failed=True), "row remapping failed: the GPU needs service"),
        (FakeGPU(retired_pages=61), "61 retired pages (limit 60)"),
        (FakeGPU(retirement_pending=True), "a page retirement is pending: the GPU needs a reset"),
        (FakeGPU(lost=True), "GPU has fallen off the bus"),
        (
            FakeGPU(
                fabric=(
                    CLUSTER,
                    1,
                    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                    pynvml.NVML_ERROR_UNKNOWN,
                )
            ),
            "GPU fabric registration failed",
        ),
        (FakeGPU(not_supported={"ecc", "remap", "retired", "fabric"}), ""),
    ],
)
def test_health_classification(gpu, reason):
    healthy, got = check_health(FakeNvml([gpu]), 0)
    assert healthy == (reason == "")
    assert got.startswith(reason)


def test_not_supported_is_not_a_fault_but_other_checks_still_run():
    gpu = FakeGPU(ecc_uncorrected=1, not_supported={"remap", "retired", "fabric"})
    assert check_health(FakeNvml([gpu]), 0) == (
        False,
        "1 uncorrectable ECC error(s) since the last reset",
    )


def test_critical_xids_mark_the_gpu_but_application_xids_do_not():
    nvml = FakeNvml([FakeGPU(), FakeGPU(), FakeGPU()])
    inventory = NvmlInventory(nvml, "n1", "127.0.0.1", "ib-a")
    try:
        nvml.events += [(0, 13), (1, 79), (2, 43)]
        deadline = time.monotonic() + 5
        while nvml.events and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        health = {g["index"]: (g["healthy"], g["reason"]) for g in inventory.health()}
    finally:
        inventory.close()
    assert health == {0: (True, ""), 1: (False, "critical XID 79"), 2: (True, "")}
    described = inventory.describe()
    assert described["fabric"] == "ib-a" and len(described["gpus"]) == 3


def test_host_memory_is_read_from_meminfo(tmp_path):
    from controlplane.agent.nvml import host_memory_mb

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2113470464 kB\nMemFree:        1000 kB\n")
    assert host_memory_mb(str(meminfo)) == 2063936
    assert host_memory_mb(str(tmp_path / "missing")) == 0
