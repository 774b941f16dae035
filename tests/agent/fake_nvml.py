"""A test double of NVML's Python API (pynvml): the same names, constants and error classes,
answering from a table of fake GPUs instead of a driver."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml


@dataclass
class FakeGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    uuid: str = ""
    ecc_uncorrected: int = 0
    remap_failed: bool = False
    retired_pages: int = 0
    retirement_pending: bool = False
    fabric: tuple | None = None  # (cluster uuid bytes, clique, state, status)
    lost: bool = False
    not_supported: set = field(default_factory=set)


class FakeNvml:
    def __init__(self, gpus: list[FakeGPU]) -> None:
        self.gpus = gpus
        for i, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-fake-{i}"
        self.events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.registered = set()
        self.processes: dict[int, list[tuple[int, int | None]]] = {}  # index -> (pid, bytes)

    def __getattr__(self, name):
        # Constants, structures and error classes are NVML's own.
        return getattr(pynvml, name)

    def _check(self, handle, call: str) -> FakeGPU:
        gpu = self.gpus[handle]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in gpu.not_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, handle):
        return self._check(handle, "name").name

    def nvmlDeviceGetUUID(self, handle):
        return self.gpus[handle].uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._check(handle, "processes")
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self.processes.get(handle, [])
        ]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Memory", (), {"total": self._check(handle, "memory").memory_mib * 2**20})

    def nvmlDeviceGetGpuFabricInfo(self, handle, info_ref):
        gpu = self._check(handle, "fabric")
        if gpu.fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = info_ref._obj
        cluster, clique, state, status = gpu.fabric
        ctypes.memmove(info.clusterUuid, cluster, len(cluster))
        info.cliqueId, info.state, info.status = clique, state, status
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        return self._check(handle, "ecc").ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle):
        gpu = self._check(handle, "remap")
        return (0, 0, 0, int(gpu.remap_failed))

    def nvmlDeviceGetRetiredPages(self, handle, cause):
        gpu = self._check(handle, "retired")
        if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return [0x1000 * i for i in range(gpu.retired_pages)]
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        return int(self._check(handle, "retired").retirement_pending)

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle, types, event_set):
        self._check(handle, "events")
        self.registered.add(handle)

    def nvmlEventSetWait(self, event_set, timeout_ms):
        if not self.events:
            import time

            time.sleep(min(timeout_ms, 20) / 1000)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self.events.pop(0)
        return type(
            "Event",
            (),
            {"device": index, "eventData": xid, "eventType": pynvml.nvmlEventTypeXidCriticalError},
        )
