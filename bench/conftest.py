import os

import pytest

from bench.figures import FIGURES
from tests.conftest import procs  # noqa: F401  real processes, stopped when a gate ends

BENCH = os.path.dirname(os.path.abspath(__file__)) + os.sep


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("perf figures (same-run comparisons)")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the mark
def pytest_collection_modifyitems(items):
    """Every gate needs the machine to itself (`machine_alone`) but those that measure on a
    virtual clock (`virtual_clock`: bench/fleetsim.py), whose figures no neighbour moves."""
    for item in items:
        if str(item.path).startswith(BENCH) and item.get_closest_marker("virtual_clock") is None:
            item.add_marker(pytest.mark.machine_alone)


def pytest_runtest_setup(item):
    """A gate's timings share the machine with nothing of the run's own: a build of
    llama-server still under way (tests/llama_cpp/background.py) ends first, and no other test
    runs beside it."""
    if item.get_closest_marker("machine_alone") is None:
        return
    if hasattr(item.config, "workerinput"):
        pytest.fail("the timed perf gates run alone, never in pytest-xdist's workers: select"
                    " them with -m machine_alone and run them without -n")  # fmt: skip
    background = getattr(item.config, "llama_background", None)
    if background is not None:
        background.wait()


def pytest_sessionfinish(session):
    """A worker's figures go to the run's controller, which prints them."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["figures"] = list(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    FIGURES.extend(getattr(node, "workeroutput", {}).get("figures", []))
