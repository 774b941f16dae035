import os
import sys
import threading
from pathlib import Path

import pytest

from router.path import _fastpath, fastpath_py

IMPLEMENTATIONS = {"cython": _fastpath, "python": fastpath_py}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def fastpath(request):
    """Each fast-path test runs against the extension and against its pure-Python twin."""
    return IMPLEMENTATIONS[request.param]


@pytest.fixture
def procs(tmp_path):
    """Real processes on loopback ports, each stopped by its PID when the test ends."""
    from tests.harness import Processes

    started = Processes(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the whole run (tests/postgres.py); each test that wants one
    gets a database of its own on it (`postgres_dsn`)."""
    from tests.postgres import PostgresServer

    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture
def postgres_dsn(postgres_server, request):
    import re

    name = "t_" + re.sub(r"\W", "_", request.node.name.lower())[:50]
    postgres_server.create_database(name)
    return postgres_server.dsn_of(name)


EXIT_WAIT_S = 60.0
LLAMA_TESTS = os.path.join("tests", "llama_cpp") + os.sep


def _group(item) -> int:
    """The order of a run: the perf gates on a simulated clock (work for a core that the tests'
    waiting leaves idle), the tests, those that need llama-server, then the timed gates."""
    path = str(item.path.relative_to(item.config.rootpath))
    if path.startswith("bench" + os.sep):
        return -1 if item.get_closest_marker("virtual_clock") else 2
    return 1 if path.startswith(LLAMA_TESTS) else 0


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_group)  # stable: each group keeps its order


def _start_background_build(config) -> None:
    from tests.llama_cpp.background import BackgroundBuild

    config.llama_background = BackgroundBuild()
    config.llama_background.start()


def _in_a_worker(config) -> bool:
    return hasattr(config, "workerinput")  # pytest-xdist's worker processes


def pytest_collection_finish(session):
    """llama-server, if it must be built, is built while the other tests run
    (tests/llama_cpp/background.py)."""
    if _in_a_worker(session.config):
        return  # the run's controller builds it, once for all its workers
    if any(_group(item) == 1 for item in session.items):
        _start_background_build(session.config)


def _names_llama_tests(config) -> bool:
    """Whether the run's arguments take in tests/llama_cpp: a controller of workers collects
    nothing, so it knows the run only by its arguments."""
    llama = (config.rootpath / LLAMA_TESTS).resolve()
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == llama or path in llama.parents or llama in path.parents:
            return True
    return False


def pytest_sessionstart(session):
    """With workers (`-n`), the controller starts the build; the llama tests in the workers
    wait on its lock (tests/llama_cpp/build.py)."""
    config = session.config
    if config.pluginmanager.hasplugin("dsession") and not _in_a_worker(config):
        if _names_llama_tests(config):
            _start_background_build(config)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A run must end: the interpreter joins every non-daemon thread before it exits, so one
    left looping by a test that failed midway would hold the run (and the CI job) forever. Once
    pytest is done, a watchdog gives the threads a minute, then names them and ends the
    process, failing it. The minute counts from the interpreter's shutdown (its main thread
    done): a pytest-xdist worker, done before the others, waits on its controller first."""
    status = getattr(config, "exit_status", 1)
    background = getattr(config, "llama_background", None)
    if background is not None:
        background.stop()

    def watchdog() -> None:
        main = threading.main_thread()
        while main.is_alive():
            main.join(1.0)
        threading.Event().wait(EXIT_WAIT_S)
        names = [t.name for t in threading.enumerate() if not t.daemon and t.is_alive()]
        print(f"\nthe run could not end: threads still running {names}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(status or 1)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()


def pytest_sessionfinish(session, exitstatus):
    session.config.exit_status = int(exitstatus)
