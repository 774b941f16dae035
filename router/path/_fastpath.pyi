"""Typed stubs for the Cython EndpointTable (router/path/_fastpath.pyx)."""

from collections.abc import Iterable, Mapping
from typing import Any

NO_MODEL: int
"""acquire(): the model is not in the table (the router answers 404)."""
NO_ENDPOINT: int
"""acquire(): the model is known but has no usable endpoint (503 + Retry-After)."""
SATURATED: int
"""acquire(): every endpoint of the model is at max_in_flight (503 + Retry-After)."""

class EndpointTable:
    """Routing table of model -> endpoints, with least-loaded selection and outlier ejection.

    Every method is safe to call from several threads; one C-level lock guards the table.
    """

    version: int
    """Version of the routes last applied by update()."""
    failures_to_eject: int
    base_ejection_ns: int
    max_ejection_ns: int
    max_ejection_percent: int
    max_in_flight: int
    last_snapshot_lock_ns: int
    """How long the last snapshot() held the lock, in nanoseconds."""
    ejections_total: int

    def __init__(
        self,
        failures_to_eject: int = 5,
        base_ejection_s: float = 30.0,
        max_ejection_s: float = 300.0,
        max_ejection_percent: int = 50,
        max_in_flight: int = 0,
        load_factor: float = 1.25,
        kv_threshold: float = 0.8,
    ) -> None: ...
    load_factor: float
    """c of the bounded-load rule for keyed picks (>= 1)."""
    kv_threshold: float
    """KV-cache use above which keyed picks count an endpoint as full."""
    def acquire(self, model: str, key: int = 0, exclude: tuple[int, ...] = ()) -> int:
        """Pick a non-ejected endpoint of `model` whose slot is not in `exclude` (the slots
        this request already tried, or a resolver route's holders of the adapter: any number)
        and count the request on it, which reports as used now until its release stamps the end
        of the use.

        An endpoint's load: its in-flight count here, plus, at a fresh reading (set_load), the
        engine's other requests.
        key 0: least loaded, ties rotate. A non-zero key (a 64-bit hash of a session or a
        prompt prefix, computed by the caller): rendezvous hashing with bounded loads, the
        endpoint with the highest score for the key among those whose in-flight count stays
        within ceil(load_factor * (model in-flight + 1) / usable endpoints); the least loaded
        when none is. A slot >= 0, or NO_MODEL / NO_ENDPOINT / SATURATED (every usable
        endpoint at max_in_flight)."""
    def release(self, slot: int, failed: bool = False) -> bool:
        """End a request on `slot`, stamping its last use; `failed` counts towards ejection
        (consecutive failures); safe on a slot whose endpoint was removed meanwhile.
        Returns True when this failure ejected the endpoint."""
    def update(self, routes: Mapping[str, Iterable[Any]], version: int | None = None) -> None:
        """Replace the whole table atomically; survivors keep slot, counts and stamps."""
    def snapshot(self) -> dict[str, dict[str, float]]:
        """{"used": {id: seconds since last use}, "watched": {id: seconds watched},
        "in_flight": {id: requests}, "requests": {id: requests sent since watched}}.
        `used` holds only endpoints used since watched; in-flight ones report 0."""
    def load_targets(self, recent_s: float) -> list[tuple[int, str, str, int]]:
        """[(slot, id, url, in flight)]: every endpoint of each model sent to within
        `recent_s` (or with a request in flight), with this router's requests on it now."""
    def recent_models(self, recent_s: float) -> list[str]:
        """The models `load_targets` would take the endpoints of, in table order."""
    def set_load(
        self,
        slot: int,
        endpoint_id: str,
        waiting: int,
        running: int,
        kv_use: float,
        mark: int,
        valid_s: float,
    ) -> bool:
        """Take an engine's reading for `slot`, asked for with `mark` of this router's
        requests in flight on it, used for `valid_s`; False when the slot no longer holds
        `endpoint_id`."""
    def load_of(self, slot: int) -> tuple[int, bool, bool]:
        """(load as picks see it, from a fresh reading, KV-full)."""
    def endpoint_id(self, slot: int) -> str | None:
        """None once the endpoint was removed; IndexError for a slot that never existed."""
    def endpoint_url(self, slot: int) -> str | None:
        """None once the endpoint was removed; IndexError for a slot that never existed."""
    def in_flight(self, slot: int) -> int: ...
    def is_ejected(self, slot: int) -> bool: ...
    def models(self) -> list[str]: ...
    def endpoints(self, model: str) -> list[tuple[int, str, str]]: ...
    def noop(self, argument: object = None, key: int = 0) -> int:
        """Does nothing: the floor of a call into the extension, for the benchmarks."""
    def _pin_clock(self, seconds: float | None) -> None:
        """Test hook: freeze the clock at `seconds`, or release it with None."""
