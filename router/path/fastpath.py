"""The one place that decides which EndpointTable the router uses.

The Cython extension unless `GPUROUTER_NO_EXTENSIONS=1` is set or it was not built, in which
case the pure-Python twin, with the same API.
"""

from router.compiled import implementation
from router.path import fastpath_py

_impl = implementation("router.path._fastpath", fastpath_py)

EndpointTable = _impl.EndpointTable
NO_MODEL = _impl.NO_MODEL
NO_ENDPOINT = _impl.NO_ENDPOINT
SATURATED = _impl.SATURATED
USING_EXTENSION = _impl is not fastpath_py

__all__ = ["EndpointTable", "NO_MODEL", "NO_ENDPOINT", "SATURATED", "USING_EXTENSION"]
