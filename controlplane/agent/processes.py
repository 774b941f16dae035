"""The processes an agent runs: their ports, their argv, and whether one still runs."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.agent.supervisor import Supervisor


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EnginePorts:
    """Hands each engine a port that no other engine of this agent holds.

    A port the kernel calls free is free only at that moment: the engine binds it seconds, or
    for a large model minutes, later, and meanwhile the kernel may offer it again, to the next
    replica of the same pass or of another node of a simulated fleet. So a port stays taken for
    as long as a record of its replica runs or stops, on every node this agent serves.
    """

    TRIES = 64

    def __init__(self) -> None:
        self._supervisors: list[Supervisor] = []

    def join(self, supervisor: Supervisor) -> None:
        self._supervisors.append(supervisor)

    def held(self) -> set[int]:
        return {
            run.port
            for supervisor in self._supervisors
            for run in (*supervisor.running.values(), *supervisor.stopping.values())
        }

    def take(self) -> int:
        held = self.held()
        for _ in range(self.TRIES):
            port = free_port()
            if port not in held:
                return port
        raise OSError(f"no free port found in {self.TRIES} tries ({len(held)} held by engines)")


def expand(template: list[str], values: dict[str, str]) -> list[str]:
    """Fill {placeholders} in each argument; the result is an argv, never a shell line."""
    out = []
    for arg in template:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


def resolve(program: str) -> str:
    """The program's path; gpufleet's own commands are found beside this Python first."""
    here = os.path.dirname(sys.executable)
    found = shutil.which(program, path=here + os.pathsep + os.environ.get("PATH", ""))
    if found is None:
        raise FileNotFoundError(f"{program}: not found on PATH")
    return found


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return None


def same_program(running: list[str] | None, argv: list[str]) -> bool:
    """Whether a live process is the one we started, not a stranger that reused its pid.

    A script started by path runs as `interpreter script args`, so argv may be a suffix.
    """
    return running is not None and running[-len(argv) :] == argv
