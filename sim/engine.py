"""A fake OpenAI-compatible engine: real HTTP, simulated generation.

It answers the paths vLLM and SGLang answer (`/v1/chat/completions`, `/v1/completions`,
`/v1/embeddings`, `/v1/audio/transcriptions`, `/v1/responses` with the responses it stored,
`/v1/models` with its LoRA adapters, `/health`, `/metrics`) with a configurable time to first token,
token rate and output length, and injects faults on demand: errors, hangs, streams cut in the
middle, an unhealthy `/health`. Faults can be changed while it runs with `POST /sim/faults`.

It loads and unloads LoRA adapters as vLLM does at run time (`POST /v1/load_lora_adapter`,
`/v1/unload_lora_adapter`, up to `--max-loras`), answering 404 for an adapter it does not hold.
It sleeps as vLLM's sleep mode does (`POST /sleep?level=1|2`, `POST /wake_up`,
`GET /is_sleeping`), taking `--sleep-delay` and `--wake-delay` to do so, and says what GPU
memory it holds awake and asleep at `GET /sim/memory`.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import struct
import time
import uuid
from dataclasses import asdict, dataclass, field, fields

import orjson
from aiohttp import web

from sim.prefix_cache import PrefixCache, prompt_text
from sim.scheduler import Scheduler, blocks_for

MAX_BODY = 64 * 1024 * 1024
WORDS = ("the", "fleet", "serves", "many", "models", "on", "few", "cards", "and", "routes", "well")


METRICS_FAULTS = (
    "", "hang", "error", "huge", "nan", "negative", "unknown", "big", "labels", "slow", "reset",
)  # fmt: skip


@dataclass
class Faults:
    error_rate: float = 0.0  # share of completions answered 500
    hang: bool = False  # accept completions and never answer
    close_after_tokens: int = -1  # cut each stream after this many tokens (-1: never)
    unhealthy: bool = False  # /health answers 503
    no_usage: bool = False  # answers carry no `usage` (as some engines and proxies send them)
    # /metrics misbehaves: "" (not), hang, error (500), huge (10 MB of comments), nan,
    # negative, unknown (no series a router knows), big (2 MiB of valid series), labels (one
    # series with 100,000 label sets), slow (answers byte by byte over 10 s), reset (the
    # connection is reset halfway through the body)
    metrics: str = ""

    def update(self, changes: dict) -> None:
        known = {f.name: f.type for f in fields(self)}
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown fault {name!r}; known: {', '.join(known)}")
            if name == "metrics" and value not in METRICS_FAULTS:
                raise ValueError(f"metrics: one of {', '.join(map(repr, METRICS_FAULTS))}")
            setattr(self, name, type(getattr(self, name))(value))


@dataclass
class EngineSettings:
    models: list[str]
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0  # 0: as fast as possible
    output_tokens: int = 16
    adapters: list[str] = field(default_factory=list)  # LoRA adapters of the first model
    startup_s: float = 0.0  # "loading weights": /health and completions answer 503 until then
    cache_tokens: int = 0  # prefix cache capacity (0: none)
    prefill_s_per_token: float = 0.0  # time to first token grows with the uncached prompt
    faults: Faults = field(default_factory=Faults)
    sleep_s: float = 0.0  # how long falling asleep takes
    wake_s: float = 0.0  # how long waking takes
    gpu_memory_mb: int = 0  # held awake (MiB a GPU), as shown at /sim/memory
    sleep_gpu_memory_mb: int = 0  # held asleep
    max_loras: int = 0  # adapters loaded at once (vLLM's --max-loras); 0: no adapter API
    adapter_load_s: float = 0.0  # how long loading one takes
    max_num_seqs: int = 256  # sequences running at once (vLLM's default); 0: no limit
    kv_blocks: int = 0  # KV-cache capacity in blocks of 16 tokens; 0: no limit
    kind: str = "vllm"  # whose metric names /metrics uses: vllm | sglang | llama.cpp
    otlp_traces_endpoint: str | None = None  # as vLLM's flag: a span per request, continuing
    # Latency histograms /metrics carries besides the load, as a real engine's page does
    # (vLLM's is 40 to 100 KB, most of it histograms): what a reader must look through.
    metrics_histograms: int = 0
    # As vLLM's filesystem LoRA resolver (VLLM_LORA_RESOLVER_CACHE_DIR, with
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING): a request for a model it does not serve loads the
    # adapter DIR/NAME (a folder with adapter_config.json) first, taking --adapter-load-s.
    lora_resolver_dir: str | None = None

    def serves(self, name) -> bool:
        return name in self.models or name in self.adapters


class SimEngine:
    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.requests_total = 0
        self.cancelled_total = 0
        self.metrics_reads_total = 0  # how often this page was read: what its readers cost it
        self.tracer = None
        self.histograms: list[str] | None = None
        self.resolving: dict[str, asyncio.Future] = {}  # adapter -> its load under way
        if settings.otlp_traces_endpoint:
            from sim.tracing import EngineTracer

            self.tracer = EngineTracer(settings.otlp_traces_endpoint)
        self.started = time.time()
        self.responses: dict[str, dict] = {}  # stored on this replica only, as vLLM does
        self.cache = PrefixCache(settings.cache_tokens)
        self.scheduler = Scheduler(settings.max_num_seqs, settings.kv_blocks, self.cache)
        self.static_adapters = tuple(settings.adapters)  # from --adapter: never unloaded
        self.sleep_level = 0  # the level it sleeps (or falls asleep) at; 0: awake or waking
        self.settled_at = 0.0  # when the last sleep or wake is done

    # (method, path, handler name): served alone by `app()`, or for many engines at once under
    # a prefix by sim/replicas.py.
    ROUTES = (
        ("POST", "/v1/chat/completions", "chat"),
        ("POST", "/v1/completions", "completions"),
        ("POST", "/v1/embeddings", "embeddings"),
        ("POST", "/v1/audio/transcriptions", "transcribe"),
        ("POST", "/v1/responses", "create_response"),
        ("GET", "/v1/responses/{id}", "get_response"),
        ("DELETE", "/v1/responses/{id}", "delete_response"),
        ("GET", "/v1/models", "list_models"),
        ("GET", "/health", "health"),
        ("GET", "/metrics", "metrics"),
        ("GET", "/sim/faults", "get_faults"),
        ("POST", "/sim/faults", "set_faults"),
        ("POST", "/sim/cache/clear", "clear_cache"),
        ("POST", "/sleep", "sleep"),
        ("POST", "/wake_up", "wake_up"),
        ("GET", "/is_sleeping", "is_sleeping"),
        ("GET", "/sim/memory", "memory"),
        ("POST", "/v1/load_lora_adapter", "load_adapter"),
        ("POST", "/v1/unload_lora_adapter", "unload_adapter"),
    )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[errors_as_json])
        for method, path, handler in self.ROUTES:
            app.router.add_route(method, path, getattr(self, handler))
        return app

    async def _body(self, request: web.Request) -> dict:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise _error(400, f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise _error(400, "the body must be a JSON object")
        if self.settings.lora_resolver_dir and not self.settings.serves(body.get("model")):
            await self.resolve_adapter(body.get("model"))
        self._check_model(body.get("model"))
        return body

    async def resolve_adapter(self, name) -> None:
        """vLLM's resolver: the adapter NAME from the resolver's folder, loaded before the
        request that named it is served (one load for requests that arrive meanwhile); a name
        with no adapter there is a model that does not exist."""
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            return
        pending = self.resolving.get(name)
        if pending is not None:
            await asyncio.shield(pending)
            return
        folder = os.path.join(self.settings.lora_resolver_dir, name)
        if not os.path.isfile(os.path.join(folder, "adapter_config.json")):
            return  # answered as a model that does not exist
        if len(self.settings.adapters) >= self.settings.max_loras:
            raise _error(400, f"already {self.settings.max_loras} adapters loaded (max_loras)")
        done = self.resolving[name] = asyncio.get_running_loop().create_future()
        try:
            if self.settings.adapter_load_s:
                await asyncio.sleep(self.settings.adapter_load_s)
            if name not in self.settings.adapters:
                self.settings.adapters.append(name)
        finally:
            del self.resolving[name]
            done.set_result(None)

    def _check_model(self, model) -> None:
        if not self.settings.serves(model):
            raise _error(404, f"The model `{model}` does not exist.", code="model_not_found")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if self.loading():
            raise _error(503, "the model is still loading", kind="server_error")
        if not self.awake():
            raise _error(503, "the engine is sleeping: wake it first", kind="server_error")
        body = await self._body(request)
        faults = self.settings.faults
        self.requests_total += 1
        if faults.hang:
            await asyncio.Event().wait()
        if faults.error_rate and random.random() < faults.error_rate:
            raise _error(500, "simulated engine failure", kind="server_error")
        n_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        n_tokens = (
            min(n_tokens, self.settings.output_tokens) if n_tokens else self.settings.output_tokens
        )
        if self.tracer is not None:
            with self.tracer.request(request.headers, body, n_tokens):
                return await self._run(request, body, chat, n_tokens)
        return await self._run(request, body, chat, n_tokens)

    async def _run(self, request, body: dict, chat: bool, n_tokens: int) -> web.StreamResponse:
        text = prompt_text(body)
        # The blocks its prompt and output will hold; the cache is looked up once it runs, as
        # an engine schedules it then.
        blocks = await self.scheduler.admit(blocks_for(self.cache.tokens(text) + n_tokens))
        try:
            prompt_tokens, cached = self.cache.serve(text)
            usage = _usage(prompt_tokens, cached, n_tokens)
            prefill = (prompt_tokens - cached) * self.settings.prefill_s_per_token
            if body.get("stream"):
                return await self._stream(request, body, chat, n_tokens, usage, prefill)
            await self._wait_generation(n_tokens, prefill)
            return _json_response(self._completion(body, chat, n_tokens, usage))
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away: a real engine aborts the sequence and frees its KV cache.
            self.cancelled_total += 1
            raise
        finally:
            self.scheduler.finish(blocks)

    async def _wait_generation(self, n_tokens: int, prefill: float) -> None:
        delay = self.settings.ttft_s + prefill
        if self.settings.tokens_per_s > 0:
            delay += n_tokens / self.settings.tokens_per_s
        if delay > 0:
            await asyncio.sleep(delay)

    async def _stream(self, request, body, chat, n_tokens, usage, prefill) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.settings.ttft_s + prefill > 0:
            await asyncio.sleep(self.settings.ttft_s + prefill)
        completion_id = _new_id(chat)
        created = int(time.time())
        gap = 1 / self.settings.tokens_per_s if self.settings.tokens_per_s > 0 else 0
        cut = self.settings.faults.close_after_tokens
        for i in range(n_tokens):
            if cut >= 0 and i >= cut:
                request.transport.abort()
                return response
            word = WORDS[i % len(WORDS)] + " "
            chunk = _chunk(completion_id, created, body["model"], chat, word, None)
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if gap:
                await asyncio.sleep(gap)
        final = _chunk(completion_id, created, body["model"], chat, "", "length")
        await response.write(b"data: " + orjson.dumps(final) + b"\n\n")
        wants_usage = (body.get("stream_options") or {}).get("include_usage")
        if wants_usage and not self.settings.faults.no_usage:
            usage = {
                "id": completion_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": body["model"],
                "choices": [],
                "usage": usage,
            }
            await response.write(b"data: " + orjson.dumps(usage) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _completion(self, body: dict, chat: bool, n_tokens: int, usage: dict) -> dict:
        text = " ".join(WORDS[i % len(WORDS)] for i in range(n_tokens))
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
        else:
            choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
        answer = {
            "id": _new_id(chat),
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [choice],
            "usage": usage,
        }
        if self.settings.faults.no_usage:
            del answer["usage"]
        return answer

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        inputs = body.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = [
            {"object": "embedding", "index": i, "embedding": [0.0, 0.5, 1.0]}
            for i in range(len(inputs))
        ]
        usage = {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}
        return _json_response(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    async def transcribe(self, request: web.Request) -> web.Response:
        form = await request.post()
        self._check_model(form.get("model"))
        audio = form.get("file")
        size = len(audio.file.read()) if hasattr(audio, "file") else 0
        return _json_response({"text": f"{size} bytes of audio heard"})

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's Responses API, as the openai SDK reads it: one assistant message in
        `output`, or its events when streamed; stored for GET and DELETE by id."""
        if self.loading():
            raise _error(503, "the model is still loading", kind="server_error")
        body = await self._body(request)
        n_tokens = int(body.get("max_output_tokens") or 0)
        n_tokens = (
            min(n_tokens, self.settings.output_tokens) if n_tokens else self.settings.output_tokens
        )
        words = [WORDS[i % len(WORDS)] for i in range(n_tokens)]
        prompt = body.get("input")
        prompt_tokens = len(prompt.split()) if isinstance(prompt, str) else 1
        response = _response_object(body["model"], "in_progress", [])
        message_id = "msg_" + uuid.uuid4().hex
        blocks = await self.scheduler.admit(blocks_for(prompt_tokens + n_tokens))
        try:
            if body.get("stream"):
                return await self._stream_response(
                    request, response, message_id, words, prompt_tokens
                )
            await self._wait_generation(n_tokens, 0.0)
        finally:
            self.scheduler.finish(blocks)
        done = _finish_response(response, message_id, " ".join(words), prompt_tokens, n_tokens)
        self.responses[done["id"]] = done
        return _json_response(done)

    async def _stream_response(self, request, response, message_id, words, prompt_tokens):
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        sequence = iter(range(1_000_000))

        async def send(kind: str, **fields) -> None:
            event = {"type": kind, "sequence_number": next(sequence), **fields}
            await stream.write(
                b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
            )

        item = {"type": "message", "id": message_id, "status": "in_progress", "role": "assistant"}
        where = {"item_id": message_id, "output_index": 0, "content_index": 0}
        await send("response.created", response=response)
        await send("response.in_progress", response=response)
        await send("response.output_item.added", output_index=0, item={**item, "content": []})
        empty = {"type": "output_text", "text": "", "annotations": []}
        await send("response.content_part.added", **where, part=empty)
        if self.settings.ttft_s > 0:
            await asyncio.sleep(self.settings.ttft_s)
        gap = 1 / self.settings.tokens_per_s if self.settings.tokens_per_s > 0 else 0
        for i, word in enumerate(words):
            await send(
                "response.output_text.delta",
                **where,
                delta=word + (" " if i < len(words) - 1 else ""),
                logprobs=[],
            )
            if gap:
                await asyncio.sleep(gap)
        text = " ".join(words)
        done = _finish_response(response, message_id, text, prompt_tokens, len(words))
        part = {**empty, "text": text}
        await send("response.output_text.done", **where, text=text, logprobs=[])
        await send("response.content_part.done", **where, part=part)
        await send("response.output_item.done", output_index=0, item=done["output"][0])
        await send("response.completed", response=done)
        self.responses[done["id"]] = done
        await stream.write_eof()
        return stream

    async def get_response(self, request: web.Request) -> web.Response:
        stored = self.responses.get(request.match_info["id"])
        if stored is None:
            raise _error(404, "no such response", code="not_found")
        return _json_response(stored)

    async def delete_response(self, request: web.Request) -> web.Response:
        stored = self.responses.pop(request.match_info["id"], None)
        if stored is None:
            raise _error(404, "no such response", code="not_found")
        return _json_response({"id": stored["id"], "object": "response", "deleted": True})

    async def list_models(self, request: web.Request) -> web.Response:
        created = int(self.started)
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "gpufleet-sim"}
            for m in self.settings.models
        ]
        data += [
            {"id": a, "object": "model", "created": created, "parent": self.settings.models[0]}
            for a in self.settings.adapters
        ]
        return _json_response({"object": "list", "data": data})

    def loading(self) -> bool:
        return time.time() - self.started < self.settings.startup_s

    # LoRA adapters loaded at run time, as vLLM's (--enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING).

    async def load_adapter(self, request: web.Request) -> web.Response:
        body = await self._adapter_body(request, "lora_path")
        name, path = body["lora_name"], body["lora_path"]
        self.check_adapter(name, path)
        if self.settings.adapter_load_s:
            await asyncio.sleep(self.settings.adapter_load_s)
        self.check_adapter(name, path)
        self.settings.adapters.append(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    def check_adapter(self, name: str, path: str) -> None:
        """Raise the error vLLM answers for an adapter it cannot load now."""
        if name in self.settings.adapters:
            raise _error(400, f"The lora adapter '{name}' has already been loaded.")
        if len(self.settings.adapters) >= self.settings.max_loras:
            raise _error(400, f"already {self.settings.max_loras} adapters loaded (max_loras)")
        if path.startswith("/") and not os.path.exists(path):
            raise _error(404, f"No adapter found at {path}", code="adapter_not_found")

    async def unload_adapter(self, request: web.Request) -> web.Response:
        body = await self._adapter_body(request)
        name = body["lora_name"]
        if name not in self.settings.adapters:
            raise _error(404, f"The lora adapter '{name}' cannot be found.", code="not_found")
        self.settings.adapters.remove(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def _adapter_body(self, request: web.Request, *needed: str) -> dict:
        if not self.settings.max_loras:
            raise _error(404, "this engine was started without adapters (--max-loras)")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise _error(400, f"invalid JSON body: {exc}") from None
        for key in ("lora_name", *needed):
            if not isinstance(body, dict) or not isinstance(body.get(key), str) or not body[key]:
                raise _error(400, f"{key}: required, a string")
        return body

    # Sleep mode, as vLLM's: the process stays, its weights and KV cache leave the GPU.

    def begin_sleep(self, level: int) -> float:
        """Start falling asleep at `level`; returns the seconds it takes."""
        self.sleep_level = level
        self.settled_at = time.time() + self.settings.sleep_s
        return self.settings.sleep_s

    def begin_wake(self) -> float:
        """Start waking; returns the seconds it takes."""
        if self.sleep_level:
            self.sleep_level = 0
            self.settled_at = time.time() + self.settings.wake_s
        return max(0.0, self.settled_at - time.time())

    def asleep(self) -> bool:
        return self.sleep_level > 0 and time.time() >= self.settled_at

    def awake(self) -> bool:
        return self.sleep_level == 0 and time.time() >= self.settled_at

    async def sleep(self, request: web.Request) -> web.Response:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            level = 0
        if level not in (1, 2):
            raise _error(400, "level must be 1 or 2")
        await asyncio.sleep(self.begin_sleep(level))
        return web.Response(text="")

    async def wake_up(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.begin_wake())
        return web.Response(text="")

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return _json_response({"is_sleeping": self.sleep_level > 0})

    async def memory(self, request: web.Request) -> web.Response:
        held = self.settings.sleep_gpu_memory_mb if self.asleep() else self.settings.gpu_memory_mb
        return _json_response({"gpu_memory_mb": held, "sleep_level": self.sleep_level})

    async def health(self, request: web.Request) -> web.Response:
        if self.loading():
            return web.Response(status=503, text="loading")
        if self.settings.faults.unhealthy:
            return web.Response(status=503, text="unhealthy")
        return web.Response(text="")

    async def metrics(self, request: web.Request) -> web.Response:
        self.metrics_reads_total += 1
        fault = self.settings.faults.metrics
        if fault:
            return await self._bad_metrics(fault, request)
        if self.histograms is None:  # the same on every read: made once
            self.histograms = _histograms(self.settings.metrics_histograms, self.settings.models[0])
        histograms = self.histograms
        half = len(histograms) // 2
        lines = histograms[:half] + self.load_lines() + histograms[half:]
        lines += _family(
            "gpufleet_sim_cancelled_total",
            "counter",
            "Requests whose client went away.",
            self.cancelled_total,
        )
        lines += _family(
            "gpufleet_sim_metrics_reads_total",
            "counter",
            "Reads of this page (routers' load readers, Prometheus).",
            self.metrics_reads_total,
        )
        if self.settings.kind == "vllm":
            model = _labels(self.settings.models[0])
            lines += _family(
                "vllm:request_success_total",
                "counter",
                "Finished requests.",
                self.requests_total,
                model,
            )
            lines += _family(
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prompt tokens looked up in the prefix cache.",
                self.cache.prompt_tokens,
                model,
            )
            lines += _family(
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prompt tokens found in the prefix cache.",
                self.cache.hit_tokens,
                model,
            )
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _bad_metrics(self, fault: str, request: web.Request) -> web.StreamResponse:
        if fault in ("big", "labels"):
            if fault == "big":  # valid series, as many as make 2 MiB
                line = 'vllm:num_requests_running{model_name="m",engine="%d"} 1\n'
                count = 2 * 1024 * 1024 // len(line % 0) + 1
            else:
                line = 'vllm:num_requests_waiting{model_name="m",request="%d"} 0\n'
                count = 100_000
            return web.Response(text="".join(line % n for n in range(count)))
        if fault in ("slow", "reset"):
            page = "\n".join(self.load_lines()).encode() + b"\n"
            answer = web.StreamResponse(headers={"Content-Type": "text/plain"})
            answer.content_length = len(page)
            await answer.prepare(request)
            if fault == "reset":
                await answer.write(page[: len(page) // 2])
                sock = request.transport.get_extra_info("socket")
                # Linger 0: the close sends a reset, not an orderly end.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                request.transport.abort()
                return answer
            for n in range(len(page)):
                await answer.write(page[n : n + 1])
                await asyncio.sleep(10.0 / len(page))
            return answer
        if fault == "hang":
            await asyncio.Event().wait()
        if fault == "error":
            return web.Response(status=500, text="metrics exporter failed")
        if fault == "huge":
            padding = "# " + "x" * 1022 + "\n"
            return web.Response(text=padding * 10240 + "\n".join(self.load_lines()) + "\n")
        if fault in ("nan", "negative"):
            lines = self.load_lines()
            lines[-1] = lines[-1].rsplit(" ", 1)[0] + (" NaN" if fault == "nan" else " -3")
            return web.Response(text="\n".join(lines) + "\n")
        # "unknown": a page that is Prometheus text, without any series of an engine's load
        return web.Response(
            text="# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
        )

    def load_lines(self) -> list[str]:
        """The engine's load under its kind's own metric names, with live values."""
        queue = self.scheduler
        labels = _labels(self.settings.models[0])
        names = LOAD_METRICS[self.settings.kind]
        return (
            _family(names[0], "gauge", "Requests waiting to be scheduled.", queue.waiting, labels)
            + _family(names[1], "gauge", "Requests running.", queue.running, labels)
            + _family(names[2], "gauge", "KV-cache usage (1 = full).", queue.kv_usage, labels)
        )

    async def clear_cache(self, request: web.Request) -> web.Response:
        self.cache.clear()
        return _json_response({"cleared": True})

    async def get_faults(self, request: web.Request) -> web.Response:
        return _json_response(asdict(self.settings.faults))

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            self.settings.faults.update(orjson.loads(await request.read()))
        except (ValueError, TypeError, orjson.JSONDecodeError) as exc:
            raise _error(400, str(exc)) from None
        return _json_response(asdict(self.settings.faults))


# (waiting, running, KV use) as each engine names them.
LOAD_METRICS = {
    "vllm": ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
    "sglang": ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"),
    "llama.cpp": (
        "llamacpp:requests_deferred",
        "llamacpp:requests_processing",
        "llamacpp:kv_cache_usage_ratio",
    ),
}


def _labels(model: str) -> str:
    return '{model_name="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def _family(name: str, kind: str, help_text: str, value, labels: str = "") -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{labels} {value}"]


def _histograms(count: int, model: str) -> list[str]:
    """`count` histogram families of 20 buckets each, shaped as vLLM's latency histograms."""
    labels = 'engine="0",' + _labels(model)[1:-1]
    lines = []
    for n in range(count):
        name = f"gpufleet_sim_latency_{n}_seconds"
        lines += [f"# HELP {name} A latency, as an engine's has.", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{{labels},le="{b * 0.25}"}} {b * 7.0}' for b in range(1, 20)]
        lines += [f'{name}_bucket{{{labels},le="+Inf"}} 140.0', f"{name}_sum{{{labels}}} 96.5"]
        lines += [f"{name}_count{{{labels}}} 140.0"]
    return lines


def _new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def _usage(prompt_tokens: int, cached: int, n_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n_tokens,
        "total_tokens": prompt_tokens + n_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},  # as vLLM reports it
    }


def _chunk(completion_id, created, model, chat, text, finish_reason) -> dict:
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        kind = "text_completion"
    return {
        "id": completion_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
    }


def _response_object(model: str, status: str, output: list) -> dict:
    return {
        "id": "resp_" + uuid.uuid4().hex,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }


def _finish_response(response: dict, message_id: str, text: str, prompt: int, output: int):
    message = {
        "type": "message",
        "id": message_id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }
    return {**response, "status": "completed", "output": [message], "usage": usage}


def _json_response(payload: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _error(status: int, message: str, kind: str = "invalid_request_error", code=None):
    payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return _HTTPError(status, payload)


class _HTTPError(Exception):
    def __init__(self, status: int, payload: dict) -> None:
        super().__init__(payload["error"]["message"])
        self.status = status
        self.payload = payload


# What check_adapter raises, for an agent that serves engines in process.
AdapterRefused = _HTTPError


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except _HTTPError as exc:
        return _json_response(exc.payload, status=exc.status)


async def serve(settings: EngineSettings, host: str, port: int, ready=None) -> None:
    """Serve until cancelled or SIGTERM/SIGINT."""
    runner = web.AppRunner(
        SimEngine(settings).app(),
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
    )
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    if ready is not None:
        ready()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
