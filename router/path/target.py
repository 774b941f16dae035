"""Which model a request is for: the front's routing decision, as a pure function.

- A JSON body names it in `model` (chat, completions, embeddings, responses...).
- A `multipart/form-data` body names it in its `model` field (audio transcription).
- A request without a body (`GET`/`DELETE /v1/responses/{id}`, ...) names it with a `model`
  query parameter or an `X-Gpufleet-Model` header; such a request is for state kept on one
  replica, so the router asks the replicas of the model in turn until one knows the id.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from orjson import JSONDecodeError, loads

from router.protocol.bodyscan import scan_body

BODYLESS_METHODS = (b"GET", b"DELETE")
MULTIPART_FORM = b"multipart/form-data"


class Refusal(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code=None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def target_of(request) -> tuple[str, bool, object]:
    """(model, ask_each_replica, JSON payload or None): ask_each_replica when the request is for
    state held by one replica, where a 404 means "ask the next one". Refusal when the request
    names no model. The payload is the scanned body's fields
    (`router.protocol._bodyscan.BodyFields`) where the scan vouches for the body, else the body
    parsed as a dict. `request` is a `router.protocol.wire.Request`."""
    method, body = request.method, request.body
    if method == b"POST":
        content_type = request.content_type or b""
        # The first letter alone rules out JSON (nearly every request) without a lower().
        if (
            content_type
            and content_type[0] in b"mM"
            and content_type[:19].lower() == MULTIPART_FORM
        ):
            return _model_form_field(content_type, body), False, None
        fields = scan_body(body)
        if fields is not None:
            return fields.model, False, fields
        try:
            loaded = loads(body)
        except JSONDecodeError:
            raise Refusal(400, "the body is not valid JSON") from None
        if type(loaded) is not dict:
            raise Refusal(400, "the body has no `model`", param="model")
        payload = loaded  # a dict: compiled, its lookups are C calls
        model = payload.get("model")
        if type(model) is not str or not model:
            raise Refusal(400, "the body has no `model`", param="model")
        return model, False, payload
    if method in BODYLESS_METHODS and not body:
        path, _, query = request.url.partition(b"?")
        named = request.x_gpufleet_model or b""
        return _named_outside_the_body(method, path, query, named), True, None
    raise Refusal(405, f"{method.decode(errors='replace')} is not served on this path")


def _named_outside_the_body(method: bytes, path: bytes, query: bytes, header: bytes) -> str:
    """The model a bodiless request names: its X-Gpufleet-Model `header`, else `?model=`."""
    named = header.decode(errors="replace")
    if not named and query:
        values = parse_qs(query.decode(errors="replace")).get("model")
        named = values[0] if values else ""
    if not named:
        raise Refusal(
            400,
            f"{method.decode()} {path.decode(errors='replace')} names no model: add"
            " `?model=NAME` or an `X-Gpufleet-Model: NAME` header",
            param="model",
        )
    return named


def _model_form_field(content_type: bytes, body: bytes) -> str:
    boundary = b""
    for parameter in content_type.split(b";")[1:]:
        name, _, value = parameter.strip().partition(b"=")
        if name.lower() == b"boundary":
            boundary = value.strip(b'"')
    if not boundary:
        raise Refusal(400, "a multipart/form-data body needs a boundary")
    for part in body.split(b"--" + boundary):
        head, sep, value = part.partition(b"\r\n\r\n")
        if not sep:
            continue
        disposition = next(
            (
                line
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-disposition:")
            ),
            b"",
        )
        if b'name="model"' in (p.strip() for p in disposition.split(b";")):
            model = value.removesuffix(b"\r\n").decode(errors="replace").strip()
            if model:
                return model
    raise Refusal(400, "the form has no `model` field", param="model")
