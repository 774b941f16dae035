"""The control planes a router follows: one URL or several, of which one leads.

With several servers on one database only the leader acts; a standby answers 307 to it (which
aiohttp follows, method and body kept) or 503 during an election. A router starts at the first
URL, keeps the one that answered, moves to the one a redirect led to, and tries the next URL
after a failure, so that a failover costs it one failed call per task, never its table. A
failure moves on from the server that failed, not from wherever the list points now: the
route watch and the activity report failing together on one frozen server move once."""

from __future__ import annotations

from urllib.parse import urlsplit

# One report or demand to one server: well inside a lease TTL (5 s), so a frozen leader costs a
# call less than its successor's election before the next goes elsewhere.
CALL_TIMEOUT_S = 3.0


class ControlPlanes:
    def __init__(self, urls: str) -> None:
        self.urls = [url.strip().rstrip("/") for url in urls.split(",") if url.strip()]
        if not self.urls:
            raise ValueError("no control plane URL given")
        for url in self.urls:
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        self.current = 0

    @property
    def url(self) -> str:
        return self.urls[self.current]

    def answered(self, response) -> None:
        """After an answer: if a standby redirected the call, the leader is where it went."""
        if not response.history:
            return
        final = urlsplit(str(response.url))
        leader = f"{final.scheme}://{final.netloc}"
        if leader not in self.urls:
            self.urls.append(leader)
        self.current = self.urls.index(leader)

    def failed(self, url: str) -> None:
        """A call to `url` (this object's `url` when it was made) failed."""
        if self.urls[self.current] == url:
            self.current = (self.current + 1) % len(self.urls)
