"""The one place that decides which engine load page reader the router uses:
`router.load._loadread` (C) unless GPUROUTER_NO_EXTENSIONS=1 is set or it was not built, in which
case `router.load.loadread_py`."""

from router.compiled import implementation
from router.load import loadread_py

_impl = implementation("router.load._loadread", loadread_py)

PageReader = _impl.PageReader
scan_load = _impl.scan_load
USING_EXTENSION = _impl is not loadread_py

__all__ = ["USING_EXTENSION", "PageReader", "scan_load"]
