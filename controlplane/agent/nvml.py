"""GPU discovery and health through NVML (the `nvidia-ml-py` distribution, imported as pynvml).

Health follows DCGM's classification: uncorrectable volatile ECC errors, a failed row remap,
too many retired pages or a retirement pending, critical XID events (but not the XIDs an
application causes), a GPU lost from the bus, and an unhealthy GPU fabric. An answer of
NotSupported is not a fault: the check does not apply to that part.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass

from controlplane.agent.gpu_names import gpu_class

log = logging.getLogger("gpufleet.agent.nvml")

# XIDs caused by applications (bad kernels, illegal addresses, user-requested resets): the GPU
# is fine, the program is not.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
RETIRED_PAGES_LIMIT = 60  # DCGM's default limit on retired pages


@dataclass
class DiscoveredGPU:
    index: int
    uuid: str
    name: str
    gpu_class: str
    memory_mb: int
    fabric: str | None  # "<cluster uuid>/<clique id>" when the GPU fabric is up


def host_memory_mb(meminfo: str = "/proc/meminfo") -> int:
    """The node's memory in MiB (MemTotal), where level-1 sleepers keep their weights; 0 when
    it cannot be read."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def load_nvml():
    """The pynvml module, initialised; None when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            pynvml.nvmlShutdown()
            return None
    except pynvml.NVMLError as exc:
        log.info("NVML unavailable: %s", exc)
        return None
    return pynvml


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _not_supported(nvml, exc) -> bool:
    return getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED


def fabric_of(nvml, handle) -> str | None:
    """The NVLink domain (cluster UUID and clique), as NVIDIA's feature discovery names it."""
    try:
        info = nvml.c_nvmlGpuFabricInfo_t()
        nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except (nvml.NVMLError, AttributeError):
        return None
    if info.state != nvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != nvml.NVML_SUCCESS:
        return None
    cluster = bytes(info.clusterUuid).hex()
    if not cluster.strip("0"):
        return None
    uuid = f"{cluster[:8]}-{cluster[8:12]}-{cluster[12:16]}-{cluster[16:20]}-{cluster[20:32]}"
    return f"{uuid}.{info.cliqueId}"


def discover(nvml) -> list[DiscoveredGPU]:
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
        gpus.append(
            DiscoveredGPU(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=name,
                gpu_class=gpu_class(name, memory_mb),
                memory_mb=memory_mb,
                fabric=fabric_of(nvml, handle),
            )
        )
    return gpus


def node_fabric(gpus: list[DiscoveredGPU], flag: str | None, node_name: str) -> str:
    """NVML fabric when every GPU agrees on one, else the operator's label, else the node."""
    fabrics = {g.fabric for g in gpus}
    if len(fabrics) == 1 and None not in fabrics:
        return "nvl-" + fabrics.pop()
    return flag or node_name


def process_memory(nvml, indexes: list[int]) -> dict[tuple[int, int], int]:
    """(pid, GPU index) -> MiB that compute process holds there; a GPU or driver that cannot
    say (NOT_SUPPORTED, no permission, memory not reported) gives nothing for it."""
    out: dict[tuple[int, int], int] = {}
    for index in indexes:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError:
            continue
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            if isinstance(used, int) and used >= 0:
                key = (int(process.pid), index)
                out[key] = out.get(key, 0) + used // (1024 * 1024)
    return out


def engine_of(pid: int, leaders, proc: str = "/proc") -> tuple[int | None, str]:
    """The engine (its first process's pid, one of `leaders`) that NVML's process `pid`
    belongs to, and how it was found: its process group (an engine is started as a session
    leader: vLLM's workers are its children and share its group), else its parents in the
    process tree (a worker that made a group of its own, or where getpgid is refused), else
    none: a pid of another PID namespace (a container that sees the host's NVML) names no
    process here."""
    try:
        if os.getpgid(pid) in leaders:
            return os.getpgid(pid), "process group"
    except OSError:
        pass
    current = pid
    for _ in range(64):  # a chain of parents is short; a loop in a racing /proc is not
        if current in leaders:
            return current, "process tree"
        current = parent_pid(current, proc)
        if current <= 1:
            break
    return None, ""


def parent_pid(pid: int, proc: str = "/proc") -> int:
    """`pid`'s parent from /proc/PID/stat (0 when it cannot be read)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # The name (field 2) may hold spaces and parentheses: fields after its last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return 0


def check_health(nvml, index: int) -> tuple[bool, str]:
    """(healthy, reason) of one GPU from its counters; see the module doc for the rules."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        return False, f"GPU lost: {exc}"
    checks = (_ecc, _row_remap, _retired_pages, _fabric_health)
    for check in checks:
        try:
            problem = check(nvml, handle)
        except nvml.NVMLError as exc:
            if _not_supported(nvml, exc):
                continue
            if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                return False, "GPU has fallen off the bus"
            log.warning("GPU %d: %s failed: %s", index, check.__name__, exc)
            continue
        if problem:
            return False, problem
    return True, ""


def _ecc(nvml, handle) -> str:
    count = nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
    )
    return f"{count} uncorrectable ECC error(s) since the last reset" if count else ""


def _row_remap(nvml, handle) -> str:
    _corrected, _uncorrected, _pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
    return "row remapping failed: the GPU needs service" if failed else ""


def _retired_pages(nvml, handle) -> str:
    total = 0
    for cause in (
        nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    ):
        total += len(nvml.nvmlDeviceGetRetiredPages(handle, cause))
    if total >= RETIRED_PAGES_LIMIT:
        return f"{total} retired pages (limit {RETIRED_PAGES_LIMIT})"
    if nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
        return "a page retirement is pending: the GPU needs a reset"
    return ""


def _fabric_health(nvml, handle) -> str:
    info = nvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    if info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED and info.status != nvml.NVML_SUCCESS:
        return f"GPU fabric registration failed (NVML status {info.status})"
    return ""


class XidWatcher:
    """A thread on nvmlEventSetWait that records critical XIDs per GPU index."""

    def __init__(self, nvml, indexes: list[int]) -> None:
        self.nvml = nvml
        self.faults: dict[int, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._uuid_to_index = {}
        self._event_set = nvml.nvmlEventSetCreate()
        for index in indexes:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self._uuid_to_index[_text(nvml.nvmlDeviceGetUUID(handle))] = index
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except nvml.NVMLError as exc:
                if not _not_supported(nvml, exc):
                    raise
        self.thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)

    def start(self) -> XidWatcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        nvml = self.nvml
        while not self._stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(self._event_set, 1000)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("XID watch stopped: %s", exc)
                return
            self.record(_text(nvml.nvmlDeviceGetUUID(event.device)), int(event.eventData))

    def record(self, uuid: str, xid: int) -> None:
        if xid in APPLICATION_XIDS:
            return
        index = self._uuid_to_index.get(uuid)
        if index is not None:
            with self._lock:
                self.faults.setdefault(index, f"critical XID {xid}")

    def fault(self, index: int) -> str:
        with self._lock:
            return self.faults.get(index, "")


class NvmlInventory:
    """The agent's view of a real node's GPUs."""

    def __init__(
        self,
        nvml,
        name: str,
        address: str,
        fabric_flag: str | None,
        labels: dict[str, str] | None = None,
        watch_xids: bool = True,
    ) -> None:
        self.nvml = nvml
        self.name = name
        self.address = address
        self.gpus = discover(nvml)
        self.fabric = node_fabric(self.gpus, fabric_flag, name)
        self.labels = labels or {}
        self.xids = XidWatcher(nvml, [g.index for g in self.gpus]).start() if watch_xids else None
        self.memory_source = ""  # how the last reading tied NVML's processes to engines

    def describe(self) -> dict:
        return {
            "name": self.name,
            "address": self.address,
            "fabric": self.fabric,
            "labels": self.labels,
            "host_memory_mb": host_memory_mb(),
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "gpu_class": g.gpu_class,
                    "memory_mb": g.memory_mb,
                }
                for g in self.gpus
            ],
        }

    def replica_memory(self, running: dict) -> dict[str, int]:
        """MiB each replica's engine holds on the fullest of its cards, from NVML's compute
        processes, each found to be an engine's (`engine_of`); `memory_source` says how the
        last reading found them."""
        leaders = {run.pid: replica for replica, run in running.items()}
        held: dict[tuple[str, int], int] = {}
        sources = set()
        for (pid, index), mb in process_memory(self.nvml, [g.index for g in self.gpus]).items():
            leader, source = engine_of(pid, leaders)
            if leader is None:
                continue
            sources.add(source)
            key = (leaders[leader], index)
            held[key] = held.get(key, 0) + mb
        source = " and ".join(sorted(sources)) or "none found"
        if source != self.memory_source:
            log.info("engines' GPU memory found by %s", source)
            self.memory_source = source
        out: dict[str, int] = {}
        for (replica, _), mb in held.items():
            out[replica] = max(out.get(replica, 0), mb)
        return out

    def refuse_over(self, running: dict, stopping: dict) -> list[tuple[str, str]]:
        """A real card refuses an allocation past its memory by itself (the engine exits with
        CUDA's out-of-memory error): nothing to do here."""
        return []

    def health(self) -> list[dict]:
        report = []
        for gpu in self.gpus:
            healthy, reason = check_health(self.nvml, gpu.index)
            xid = self.xids.fault(gpu.index) if self.xids else ""
            if healthy and xid:
                healthy, reason = False, xid
            report.append({"index": gpu.index, "healthy": healthy, "reason": reason})
        return report

    def close(self) -> None:
        if self.xids is not None:
            self.xids.stop()
