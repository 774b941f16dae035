"""The one place that decides which body scanner the router uses: `router._bodyscan` (C)
unless GPUROUTER_NO_EXTENSIONS=1 is set or it was not built, in which case
`router.bodyscan_py`, which leaves every body to orjson."""

from router import bodyscan_py
from router.compiled import implementation

_impl = implementation("router._bodyscan", bodyscan_py)

scan_body = _impl.scan_body
USING_EXTENSION = _impl is not bodyscan_py

__all__ = ["USING_EXTENSION", "scan_body"]
