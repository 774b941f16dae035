"""llama-server built while the other tests run. A machine with no cached build spends about 6
minutes compiling it; the tests that need it run last of the tests (before the perf gates), so
the build, at the lowest CPU priority, takes only the time the other tests leave idle, and the
run does not wait for it. The perf gates wait for it to end, so that it takes nothing from
their timings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.llama_cpp.build import Build, pinned_version

REPO = Path(__file__).resolve().parents[2]


def _lowest_priority() -> None:
    """Run in the build's process before exec, after it made its session. Linux weighs each
    session (an autogroup) alike whatever its processes' nice, so a niced build in a session of
    its own took half the CPU from the tests (a simulated-clock gate ran 3x as long in a cold
    run); the autogroup's own nice is what makes it yield."""
    os.nice(19)
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:
        pass  # a kernel without autogroups: nice alone ranks it


class BackgroundBuild:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        build = Build(pinned_version())
        if build.ready():
            return
        build.directory.mkdir(parents=True, exist_ok=True)
        with open(build.directory / "background-build.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.llama_cpp.build"],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_lowest_priority,
                start_new_session=True,  # cmake's compilers are stopped with it
            )

    def wait(self) -> None:
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        """Ends the build if it still runs (its scratch folder goes with it)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
