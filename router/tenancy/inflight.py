"""The one place that decides which shared in-flight counter the router's workers use:
`router.tenancy._inflight` (C atomics) unless GPUROUTER_NO_EXTENSIONS=1 is set or it was not
built, in which case `router.tenancy.inflight_py` (a lock)."""

from router.compiled import implementation
from router.tenancy import inflight_py

_impl = implementation("router.tenancy._inflight", inflight_py)

SharedInFlight = _impl.SharedInFlight
USING_EXTENSION = _impl is not inflight_py

__all__ = ["USING_EXTENSION", "SharedInFlight"]
