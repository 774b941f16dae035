import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# GPUFLEET_CYTHON_DEBUG=1: no optimisation, debug symbols, and the annotated HTML beside the .pyx.
debug = os.environ.get("GPUFLEET_CYTHON_DEBUG") == "1"

extension = Extension(
    "router._fastpath",
    ["router/_fastpath.pyx"],
    extra_compile_args=["-O0", "-g"] if debug else ["-O3"],
)

setup(
    ext_modules=cythonize(
        [extension],
        annotate=debug,
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False},
    )
)
