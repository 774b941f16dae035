"""A throwaway PostgreSQL server for a test: its own data directory, port and socket, stopped
(and its directory removed) at the end. Debian's binaries; PostgreSQL refuses to run as root,
so as root the server runs as the `postgres` user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.harness import free_port, wait_for_port

PG_BIN = Path(os.environ.get("GPUFLEET_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PostgresServer:
    def __init__(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL's binaries are not in {PG_BIN} (GPUFLEET_PG_BIN)")
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = None
        if os.geteuid() == 0:
            self.user = pwd.getpwnam("postgres")
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self._run(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        self.start()

    @property
    def dsn(self) -> str:
        return self.dsn_of("postgres")

    def dsn_of(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        """A fresh, empty database `name` (dropped first if a rerun left one)."""
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')

    def psql(self, *statements: str, database: str = "postgres") -> str:
        answer = subprocess.run(
            [
                str(PG_BIN / "psql"),
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.dsn_of(database),
            ]
            + [arg for statement in statements for arg in ("-c", statement)],
            check=True,
            capture_output=True,
            text=True,
        )
        return answer.stdout

    def _run(self, argv: list[str]) -> None:
        command = [str(PG_BIN / argv[0]), *argv[1:]]
        if self.user is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, cwd=self.root)

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
            " -c max_connections=50"
        )
        self._run(
            [
                "pg_ctl",
                "-D",
                str(self.data),
                "-o",
                options,
                "-l",
                str(self.root / "log"),
                "-w",
                "start",
            ]
        )
        wait_for_port(self.port)

    def stop(self, mode: str = "fast") -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"])

    def close(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)
