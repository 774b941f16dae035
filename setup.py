import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from router.compiled import COMPILED_MODULES  # noqa: E402

# llhttp, the C parser the request reader (router/protocol/_wire.pyx) is built on, from the source
# distribution of httptools, which carries it: the same parser the rest of the router uses
# through httptools, pinned by version and checksum.
LLHTTP_CARRIER = "httptools==0.9.0"
LLHTTP_CARRIER_SHA256 = "d484ebb7e3a3f3597b0f645fbd1b85633674ca808c1f5ba11c2caf7c66f5c8b6"
LLHTTP = ROOT / "build" / "llhttp"


def fetch_llhttp() -> Path:
    """build/llhttp/{include,src}, fetched once with pip from the package index."""
    if (LLHTTP / "include" / "llhttp.h").exists():
        return LLHTTP
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                scratch,
                LLHTTP_CARRIER,
            ],
            check=True,
        )
        (archive,) = Path(scratch).glob("*.tar.gz")
        data = archive.read_bytes()
    if hashlib.sha256(data).hexdigest() != LLHTTP_CARRIER_SHA256:
        raise SystemExit(f"{archive.name} does not have the expected checksum")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            _, _, inside = member.name.partition("/vendor/llhttp/")
            if member.isfile() and inside.split("/")[0] in ("include", "src", "LICENSE-MIT"):
                target = LLHTTP / inside
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    return LLHTTP


# GPUFLEET_CYTHON_DEBUG=1: no optimisation, debug symbols, and the annotated HTML beside the source.
debug = os.environ.get("GPUFLEET_CYTHON_DEBUG") == "1"
flags = ["-O0", "-g"] if debug else ["-O3"]
llhttp = fetch_llhttp()
# The extension carries llhttp's code, so the package carries its licence (MIT).
(ROOT / "router" / "LICENSE-llhttp").write_bytes((llhttp / "LICENSE-MIT").read_bytes())
extensions = [
    Extension("router.path._fastpath", ["router/path/_fastpath.pyx"], extra_compile_args=flags),
    Extension(
        "router.protocol._bodyscan",
        ["router/protocol/_bodyscan.pyx"],
        extra_compile_args=flags,
    ),
    Extension(
        "router.protocol._wire",
        ["router/protocol/_wire.pyx", *sorted(str(c) for c in (llhttp / "src").glob("*.c"))],
        include_dirs=[str(llhttp / "include")],
        # llhttp's symbols stay inside this extension: httptools carries its own copy.
        extra_compile_args=[*flags, "-fvisibility=hidden"],
    ),
    Extension(
        "router.tenancy._inflight", ["router/tenancy/_inflight.pyx"], extra_compile_args=flags
    ),
    Extension(
        "router.load._loadread",
        ["router/load/_loadread.pyx", *sorted(str(c) for c in (llhttp / "src").glob("*.c"))],
        include_dirs=[str(llhttp / "include")],
        extra_compile_args=[*flags, "-fvisibility=hidden"],
    ),
]
# The request path: plain Python modules, typed by the .pxd beside each (pure Python mode).
extensions += [
    Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=flags)
    for name in COMPILED_MODULES
]

jobs = os.cpu_count() or 1
setup(
    # Both steps on every core: the C of the request path's modules is large, and a fresh
    # clone compiles all of it.
    options={"build_ext": {"parallel": jobs}},
    ext_modules=cythonize(
        extensions,
        nthreads=jobs,
        annotate=debug,
        # The .pxd files type the modules, not their annotations; the .pyx files set their own
        # bounds-check directives, and the .py modules keep Python's.
        compiler_directives={"language_level": 3, "annotation_typing": False},
        # build_ext --force regenerates the C too: cythonize misses some .pxd dependencies (a
        # .pxd cimported by another module's .pxd), and `make` forces when a .pxd changed.
        force="--force" in sys.argv,
    )
)
