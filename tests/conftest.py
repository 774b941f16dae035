import pytest

from router import _fastpath, fastpath_py

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
