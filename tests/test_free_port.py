"""The test harness's ports: two workers of a parallel run are never handed the same one."""

from tests import harness


def test_each_worker_takes_only_its_share_of_the_ports(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    for worker in (0, 1):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        ports = [harness.free_port() for _ in range(20)]
        assert all(port // 2 % 2 == worker for port in ports), ports
        assert len(set(ports)) == len(ports)
