"""The CLI's HTTP client for the control plane: one call, one JSON answer or a clear error.

`base` may list several servers on one database, comma-separated. A standby answers 307 to the
leader (followed here with the method and body, which urllib will not do for a POST), or 503
during an election. A call that was certainly not made (connection refused, 503) is tried on
the next server, and the list again until FAILOVER_S has passed, so that a command run during a
failover succeeds once a standby leads.

A server that does not answer (frozen by SIGSTOP, a half-dead VM, a black-holed route) costs a
read SERVER_S, then the read moves on: a read changes nothing, so it may be asked again. A
change is sent only to a server that has just answered `/v1/leader` within SERVER_S, so a frozen
server listed first costs it that much and no more; a change whose answer then does not come
may have been made, and is reported so, naming the server, and never sent twice.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from urllib.parse import urljoin

import click

FAILOVER_S = 15.0  # how long a call waits for some server to lead
SERVER_S = 3.0  # how long one server may take to answer a read, with several servers: well
# inside a lease TTL (5 s), so a frozen leader costs less than its successor's election
RETRY_PAUSE_S = 0.5
READS = ("GET", "HEAD")
MAX_REDIRECTS = 5


class ApiError(click.ClickException):
    """Printed as one line and exit code 1."""

    exit_code = 1


class NotMade(Exception):
    """The server did not make the call: it could not be reached, or it does not lead."""

    def __init__(self, error: ApiError, electing: bool = False) -> None:
        super().__init__(error.message)
        self.error = error
        self.electing = electing  # a 503: some server may lead soon, this one included


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx comes back as an HTTPError, and is followed below


def split_servers(base: str) -> list[str]:
    return [url.strip().rstrip("/") for url in base.split(",") if url.strip()]


def request(
    base: str,
    method: str,
    path: str,
    body=None,
    token: str | None = None,
    timeout: float = 15.0,
    ca_file: str | None = None,
):
    servers = split_servers(base) or [base]
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
    opener = urllib.request.build_opener(_KeepRedirects, urllib.request.HTTPSHandler(context=tls))
    several = len(servers) > 1
    read = method in READS
    deadline = time.monotonic() + FAILOVER_S
    while True:
        for server in servers:
            try:
                if several and not read:
                    # Writes go where a leader answers now, never into a frozen server.
                    _call(opener, server, server + "/v1/leader", "GET", None, {}, SERVER_S, True)
                wait = min(timeout, SERVER_S) if several and read else timeout
                return _call(opener, server, server + path, method, data, headers, wait, read)
            except NotMade as exc:
                last = exc.error
                if not several and not exc.electing:
                    raise last from None
        if time.monotonic() + RETRY_PAUSE_S > deadline:
            raise last
        time.sleep(RETRY_PAUSE_S)


def _call(
    opener,
    server: str,
    url: str,
    method: str,
    data,
    headers: dict,
    timeout: float,
    read: bool = False,
):
    """One call, redirects followed. `read`: nothing is changed by it, so an answer that does
    not come means only that this server did not make it."""
    for _ in range(MAX_REDIRECTS):
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with opener.open(req, timeout=timeout) as resp:
                raw = resp.read()
            return json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            if exc.code in (307, 308) and exc.headers.get("Location"):
                url = urljoin(url, exc.headers["Location"])
                continue
            error = ApiError(f"{exc.code}: {_message(raw, exc)}{_hint(exc.code)}")
            if exc.code == 503:
                raise NotMade(error, electing=True) from None
            raise error from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise ApiError(
                    f"the control plane at {server} has a certificate this client does not trust"
                    f" ({reason.verify_message}): give --ca-file (or GPUCTL_CA_FILE, or ca_file"
                    " in the config file) with the CA that signed it"
                ) from None
            # urllib wraps what fails while connecting and sending; what fails after, while
            # the answer is awaited (a timeout, a reset), comes bare: the change was sent.
            sent = not isinstance(exc, urllib.error.URLError)
            if not read and (sent or isinstance(reason, TimeoutError)):
                what = (
                    f"did not answer within {timeout:g}s"
                    if isinstance(reason, TimeoutError)
                    else f"broke off before answering ({reason})"
                )
                raise ApiError(
                    f"the control plane at {server} {what}: the change may have been made;"
                    " look before trying it again"
                ) from None
            error = ApiError(f"cannot reach the control plane at {server}: {reason}")
            if isinstance(reason, ConnectionRefusedError) or read:
                raise NotMade(error) from None
            raise error from None
    raise ApiError(f"the control plane at {server} redirected more than {MAX_REDIRECTS} times")


def _message(raw: bytes, exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:200] or exc.reason


def _hint(status: int) -> str:
    return " (give --token, GPUCTL_TOKEN, or run gpuctl up)" if status == 401 else ""
