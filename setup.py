import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router.compiled import COMPILED_MODULES  # noqa: E402

# GPUFLEET_CYTHON_DEBUG=1: no optimisation, debug symbols, and the annotated HTML beside the source.
debug = os.environ.get("GPUFLEET_CYTHON_DEBUG") == "1"
sources = {"router._fastpath": "router/_fastpath.pyx"}
# The request path: plain Python modules, typed by the .pxd beside each (pure Python mode).
sources.update({name: name.replace(".", "/") + ".py" for name in COMPILED_MODULES})

setup(
    ext_modules=cythonize(
        [
            Extension(name, [path], extra_compile_args=["-O0", "-g"] if debug else ["-O3"])
            for name, path in sources.items()
        ],
        annotate=debug,
        # The .pxd files type the modules, not their annotations; _fastpath.pyx sets its own
        # bounds-check directives, and the .py modules keep Python's.
        compiler_directives={"language_level": 3, "annotation_typing": False},
    )
)
