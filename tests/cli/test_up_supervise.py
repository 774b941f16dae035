"""gpuctl up's supervisor: a part that keeps dying is restarted ever more slowly, and the rest
of the fleet stays up meanwhile."""

import sys
import threading
import time

from cli.up import RESTARTS_PER_MINUTE, STOP_GRACE_S, Console, FleetUp, Part
from tests.harness import wait_until


def empty_fleet(tmp_path, said: list) -> FleetUp:
    """A FleetUp with no part yet, its folders made, what it says kept in `said`."""
    up = FleetUp(
        tmp_path,
        ("127.0.0.1", 1),
        ("127.0.0.1", 2),
        ("127.0.0.1", 3),
        simulate=True,
        fleet_file=None,
        tick_s=1.0,
        echo=lambda text, **kw: said.append(text),
    )
    for folder in (up.logs, up.pids):
        folder.mkdir(parents=True)
    return up


def test_a_part_that_keeps_dying_backs_off_and_the_rest_stays_up(tmp_path):
    said = []
    up = empty_fleet(tmp_path, said)
    steady = Part("control plane", [sys.executable, "-c", "import time; time.sleep(60)"], "")
    crashing = Part("router", [sys.executable, "-c", "raise SystemExit(3)"], "")
    up.parts = [steady, crashing]
    launches = []
    launch = up.launch
    up.launch = lambda part: (launches.append(part.name), launch(part))
    for part in up.parts:
        launch(part)
    supervisor = threading.Thread(target=lambda: said.append(up.supervise()))
    supervisor.start()
    time.sleep(8)
    up.stopping = True
    supervisor.join(5)
    try:
        assert said[-1] == 0, "the supervisor never gives the fleet up"
        assert steady.proc.poll() is None, "the control plane stayed up"
        # 5 quick restarts, then pauses of 2 s and 4 s: about 7 in 8 s, never a busy loop.
        assert RESTARTS_PER_MINUTE <= launches.count("router") <= RESTARTS_PER_MINUTE + 2
        assert any("next try in 2 s" in line for line in said if isinstance(line, str))
    finally:
        up.stop()
    assert steady.proc.poll() is not None


def stubborn_fleet(tmp_path, said: list) -> FleetUp:
    """A fleet of one part that ignores SIGTERM, launched."""
    up = empty_fleet(tmp_path, said)
    ignores_term = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('ready', flush=True); time.sleep(60)"
    )
    up.parts = [Part("router", [sys.executable, "-c", ignores_term], "")]
    up.launch(up.parts[0])
    wait_until(lambda: "ready" in (up.logs / "router.log").read_text(), 10, "the part")
    return up


def test_a_second_signal_cuts_the_stops_waits_short(tmp_path):
    up = stubborn_fleet(tmp_path, [])
    stopper = threading.Thread(target=up.stop)
    stopper.start()
    time.sleep(0.5)
    assert stopper.is_alive(), "a part that ignores SIGTERM is waited for"
    up.hurry = True  # what the second Ctrl-C sets
    # Without the hurry the stop waits out its grace for the part (20 s) and would still be
    # waiting here: the join's limit only keeps a broken stop from hanging the test.
    stopper.join(STOP_GRACE_S / 2)
    assert not stopper.is_alive(), "the hurry ended the wait"
    assert up.parts[0].proc.poll() is not None, "killed, not left behind"


def test_a_stop_whose_output_is_gone_still_stops_everything(tmp_path):
    def dead_pipe(text, **kw):
        raise BrokenPipeError(32, "Broken pipe")

    up = stubborn_fleet(tmp_path, [])
    up.echo = Console(dead_pipe)
    up.hurry = True
    up.stop()
    assert up.parts[0].proc.poll() is not None
    assert up.echo.gone == {False}
    up.echo("dropped, not raised")
