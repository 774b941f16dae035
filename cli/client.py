"""The CLI's HTTP client for the control plane: one call, one JSON answer or a clear error."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import click


class ApiError(click.ClickException):
    """Printed as one line and exit code 1."""

    exit_code = 1


def request(
    base: str,
    method: str,
    path: str,
    body=None,
    token: str | None = None,
    timeout: float = 15.0,
    ca_file: str | None = None,
):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
        with urllib.request.urlopen(req, timeout=timeout, context=tls) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            message = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode(errors="replace")[:200] or exc.reason
        hint = " (give --token, GPUCTL_TOKEN, or run gpuctl up)" if exc.code == 401 else ""
        raise ApiError(f"{exc.code}: {message}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise ApiError(
                f"the control plane at {base} has a certificate this client does not trust"
                f" ({reason.verify_message}): give --ca-file (or GPUCTL_CA_FILE, or ca_file in"
                " the config file) with the CA that signed it"
            ) from None
        raise ApiError(f"cannot reach the control plane at {base}: {reason}") from None
    return json.loads(raw) if raw else None
