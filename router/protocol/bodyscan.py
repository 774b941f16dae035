"""The one place that decides which body scanner the router uses: `router.protocol._bodyscan` (C)
unless GPUROUTER_NO_EXTENSIONS=1 is set or it was not built, in which case
`router.protocol.bodyscan_py`, which leaves every body to orjson."""

from router.compiled import implementation
from router.protocol import bodyscan_py

_impl = implementation("router.protocol._bodyscan", bodyscan_py)

scan_body = _impl.scan_body
USING_EXTENSION = _impl is not bodyscan_py

__all__ = ["USING_EXTENSION", "scan_body"]
