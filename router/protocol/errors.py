"""Error answers in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

import orjson

REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Payload Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    499: b"Client Closed Request",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}

# The `type` values of OpenAI's API: what its SDK's clients show. The status picks the SDK's
# exception class (BadRequestError, AuthenticationError, NotFoundError, InternalServerError...).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "requests",  # OpenAI's type for a rate limit (its code: rate_limit_exceeded)
    431: "invalid_request_error",
}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None):
    kind = ERROR_TYPES.get(status, "server_error")  # 5xx: the server's fault, not the client's
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def sse_error_event(message: str) -> bytes:
    """What a stream that broke after its first byte ends with, before `data: [DONE]`."""
    event = {
        "error": {
            "message": message,
            "type": "server_error",
            "param": None,
            "code": "upstream_disconnected",
        }
    }
    return b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"


class RequestRefused(Exception):
    """A request the router will not take: answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class InvalidResponse(Exception):
    """What a replica sent is not an HTTP answer."""
