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
