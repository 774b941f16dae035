import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router.compiled import COMPILED_MODULES  # noqa: E402

# GPUFLEET_CYTHON_DEBUG=1: no optimisation, debug symbols, and the annotated HTML beside the source.
debug = os.environ.get("GPUFLEET_CYTHON_DEBUG") == "1"
compile_args = ["-O0", "-g"] if debug else ["-O3"]

fastpath = cythonize(
    [Extension("router._fastpath", ["router/_fastpath.pyx"], extra_compile_args=compile_args)],
    annotate=debug,
    compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False},
)
# The per-request path: plain Python modules, typed by the .pxd beside each (Cython's pure
# Python mode), compiled to extensions that Python imports in place of the .py files. They
# keep Python's semantics (negative indices, bounds checks): the same code runs interpreted.
request_path = cythonize(
    [
        Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=compile_args)
        for name in COMPILED_MODULES
    ],
    annotate=debug,
    # The .pxd files type these modules; their annotations stay documentation.
    compiler_directives={"language_level": 3, "annotation_typing": False},
)

setup(ext_modules=fastpath + request_path)
