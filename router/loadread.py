"""The one place that decides which engine load page reader the router uses:
`router._loadread` (C) unless GPUROUTER_NO_EXTENSIONS=1 is set or it was not built, in which
case `router.loadread_py`."""

from router import loadread_py
from router.compiled import implementation

_impl = implementation("router._loadread", loadread_py)

PageReader = _impl.PageReader
scan_load = _impl.scan_load
USING_EXTENSION = _impl is not loadread_py

__all__ = ["USING_EXTENSION", "PageReader", "scan_load"]
