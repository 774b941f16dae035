"""The count of requests in flight that a router's workers share (router/tenancy/inflight.py),
compiled and interpreted: never past the limit however the workers race, a worker's part given
back when it dies, one cell per tenant name in every worker."""

import os
import time

import pytest

from router.tenancy import _inflight, inflight_py

IMPLEMENTATIONS = [
    pytest.param(_inflight.SharedInFlight, id="compiled"),
    pytest.param(inflight_py.SharedInFlight, id="interpreted"),
]


def forked(work) -> int:
    """Run `work()` in a child process; its exit code (0: `work` returned)."""
    pid = os.fork()
    if pid == 0:
        try:
            work()
        except BaseException:
            os._exit(1)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("shared_in_flight", IMPLEMENTATIONS)
def test_racing_workers_never_hold_more_than_the_limit(shared_in_flight):
    workers, limit = 4, 3
    shared = shared_in_flight(workers + 1, capacity=16)  # the last part is the watcher's
    cell = shared.cell("team")
    # Counted apart from `cell`, by the workers themselves: how many hold a place now, how
    # often one found more holding than the limit, how often one was refused.
    holding = shared.cell("holding")
    over = shared.cell("over the limit")
    refused = shared.cell("refused")
    unbounded = 1 << 40
    deadline = time.monotonic() + 1.0

    def race(worker):
        def work():
            shared.worker = worker
            while time.monotonic() < deadline:
                if shared.acquire(cell, limit):
                    shared.acquire(holding, unbounded)
                    if shared.total(holding) > limit:
                        shared.acquire(over, unbounded)
                    shared.release(holding)
                    shared.release(cell)
                else:
                    shared.acquire(refused, unbounded)

        return work

    pids = []
    for worker in range(workers):
        pid = os.fork()
        if pid == 0:
            race(worker)()
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert shared.total(over) == 0, "more than the limit in flight at once"
    assert shared.total(refused) > 0, "the workers never met the limit: nothing was tested"
    assert shared.total(cell) == 0, "every place taken was given back"


@pytest.mark.parametrize("shared_in_flight", IMPLEMENTATIONS)
def test_a_dead_workers_requests_are_given_back_and_no_one_elses(shared_in_flight):
    shared = shared_in_flight(3, capacity=16)
    cell = shared.cell("team")

    def hold(count):
        def work():
            shared.worker = 1
            for _ in range(count):
                assert shared.acquire(cell, 5)
            os._exit(0)  # killed with them in flight: no release

        return work

    forked(hold(3))
    shared.worker = 2
    assert shared.acquire(cell, 5)  # a live worker's own
    assert shared.total(cell) == 4
    assert shared.reclaim(1) == 3
    assert shared.total(cell) == 1, "the live worker's request is still counted"
    assert shared.reclaim(1) == 0, "given back once"
    with pytest.raises(ValueError):
        shared.reclaim(3)


@pytest.mark.parametrize("shared_in_flight", IMPLEMENTATIONS)
def test_every_worker_finds_a_tenant_in_the_same_cell_until_the_cells_run_out(shared_in_flight):
    shared = shared_in_flight(2, capacity=4)
    read, write = os.pipe()

    def claim():
        os.write(write, str(shared.cell("team-b")).encode())

    assert forked(claim) == 0
    claimed_in_child = int(os.read(read, 16))
    os.close(read)
    os.close(write)
    assert shared.cell("team-b") == claimed_in_child
    cells = {shared.cell(name) for name in ("team-a", "team-b", "team-c", "team-d")}
    assert cells == {0, 1, 2, 3}
    assert shared.cell("team-e") == -1, "full: that tenant falls back to its own share"
