"""llama-server's background build (tests/llama_cpp/background.py) yields the CPU to the
tests: its session's autogroup is niced, not only its processes, since Linux weighs sessions
alike whatever their processes' nice. Here, not under tests/llama_cpp, so that running it
alone starts no build."""

import subprocess
from pathlib import Path

from tests.llama_cpp.background import _lowest_priority


def test_the_build_runs_niced_in_a_session_whose_autogroup_is_niced_too():
    shown = subprocess.run(
        ["sh", "-c", "nice; cat /proc/self/autogroup 2>/dev/null || true"],
        preexec_fn=_lowest_priority, start_new_session=True,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    nice, *group = shown.stdout.splitlines()
    assert nice == "19"
    if Path("/proc/self/autogroup").exists():
        assert group and group[0].endswith("nice 19"), group
