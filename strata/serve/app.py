"""The HTTP server: one model, one request at a time, the others waiting in a bounded queue.

Requests are checked, rendered and tokenized on the event loop; the engine runs them one by one on a worker thread,
which hands each chunk of output back to the request's coroutine. A request whose client goes away is cancelled at
its next token (or skipped, if it was still waiting). Routes: openai.py, anthropic.py; counters: metrics.py.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import queue
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from strata.engine.generation import Stats
from strata.errors import StrataError
from strata.serve.metrics import Metrics, checkpoint_figures, expert_cache_hit_rate, gpu_memory_bytes, \
    host_memory_bytes, process_rss_bytes
from strata.serve.reasoning import ReasoningSplitter, prompt_opens_thinking, template_thinks

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TOP_LOGPROBS = 20
DISCONNECT_POLL_SECONDS = 0.25  # how often a whole (not streamed) request checks that its client is still there


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    api_key: str | None = None
    max_queue: int = 16  # requests that may wait while one runs
    max_body_bytes: int = 8 << 20
    keepalive_seconds: float = 10.0  # SSE comment interval, so proxies and clients keep a slow prompt's stream open


class ApiError(Exception):
    """A 4xx/5xx answer; the handler shapes it as OpenAI or Anthropic errors by the path."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
                 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                    503: "overloaded_error"}


def error_body(path: str, status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "invalid_request_error"),
                                           "message": message}}
    return {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


# ---- the queue and the worker thread ----


class QueueFull(Exception):
    pass


class RequestCancelled(Exception):
    """Raised through the engine, between two chunks of a prompt, when the request's client has gone."""


class Job:
    """One request's work on the engine thread; its output comes back as (kind, value) items on `events`."""

    def __init__(self, kind: str, work: Callable[[Job], None], loop: asyncio.AbstractEventLoop):
        self.work, self.loop = work, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.progress: dict[str, Any] = {"kind": kind, "phase": "queued", "prompt_tokens": 0, "cached_tokens": 0,
                                         "generated": 0, "max_tokens": 0, "queued_at": time.time()}

    def emit(self, kind: str, value: Any = None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Scheduler:
    def __init__(self, max_queue: int):
        self.waiting: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, max_queue))  # 0: see submit
        self.max_queue = max_queue
        self.current: Job | None = None
        self.durations: list[float] = []  # of recent jobs, for Retry-After
        self._thread = threading.Thread(target=self._run, name="strata-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self.max_queue == 0 and (self.current is not None or self.waiting.qsize()):
            raise QueueFull
        try:
            self.waiting.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def queue_length(self) -> int:
        return self.waiting.qsize()

    def retry_after(self) -> int:
        recent = self.durations[-8:]
        mean = sum(recent) / len(recent) if recent else 1.0
        return int(min(60, max(1, math.ceil(mean * (self.queue_length() + 1)))))

    def stop(self) -> None:
        self.waiting.put(None)

    def _run(self) -> None:
        while (job := self.waiting.get()) is not None:
            if job.cancelled.is_set():  # its client left while it waited
                job.emit("end")
                continue
            self.current, started = job, time.perf_counter()
            job.progress.update(phase="prompt", started_at=time.time())
            try:
                job.work(job)
                job.emit("end")
            except RequestCancelled:
                job.emit("end")
            except Exception as error:  # reported to the request; the worker serves on
                job.emit("error", error)
            finally:
                self.current = None
                self.durations = (self.durations + [time.perf_counter() - started])[-32:]


async def job_events(job: Job, request: Request | None = None) -> AsyncIterator[tuple[str, Any]]:
    """The job's items until it ends. With `request`, a client that disconnects cancels the job (streams leave that
    to the SSE response, which watches the connection itself). Leaving early cancels the job too."""
    checked = time.monotonic()
    try:
        while True:
            try:
                kind, value = await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                kind = None
            if request is not None and time.monotonic() - checked >= DISCONNECT_POLL_SECONDS:
                checked = time.monotonic()
                if await request.is_disconnected():
                    return
            if kind is None:
                continue
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield kind, value
    finally:
        job.cancelled.set()


# ---- the server object the routes share ----


class Server:
    def __init__(self, llm, config: ServerConfig):
        self.llm, self.config = llm, config
        self.scheduler = Scheduler(config.max_queue)
        self.metrics = Metrics(llm.engine, self.scheduler.queue_length,
                               lambda: 1 if self.scheduler.current is not None else 0)
        llm.engine.on_prefill_progress = self.prompt_progress
        self.thinks = template_thinks(llm.tokenizer)  # replies may hold <think> sections to split off

    def prompt_progress(self, p) -> None:
        """The engine read another chunk of the current request's prompt (shown by the monitor). A request whose
        client has gone stops here, at the next chunk, rather than read the rest of a long prompt."""
        job = self.scheduler.current
        if job is None:
            return
        job.progress.update(prompt_read=p.done, prompt_to_read=p.total)
        if job.cancelled.is_set() and p.done < p.total:
            self.metrics.record(Stats(prompt_tokens=p.done, prompt_seconds=p.seconds), "cancelled")
            raise RequestCancelled

    @property
    def n_ctx(self) -> int:
        return self.llm.engine.n_ctx

    def check_model(self, name: str) -> None:
        if name != self.config.model_name:
            raise ApiError(404, f"model {name!r} does not exist; this server serves {self.config.model_name!r}",
                           param="model", code="model_not_found")

    async def read_json(self, request: Request, schema: type[BaseModel]) -> Any:
        """The body, bounded in size, parsed and checked against `schema`; every failure is a 4xx."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body of {declared} bytes is over the limit of {limit}")
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiError(400, f"the body is not valid JSON: {error}") from None
        try:
            return schema.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            message = first["msg"].removeprefix("Value error, ")  # a validator's own words, without pydantic's label
            raise ApiError(400, f"{where}: {message}", param=where) from None

    def render_chat(self, messages: list[dict], tools: list[dict] | None,
                    template_kwargs: dict) -> tuple[list[int], str]:
        """The conversation through the chat template: its token ids and text."""
        try:
            text = self.llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools,
                                                          **template_kwargs)
        except StrataError as error:
            raise ApiError(400, str(error)) from None
        return self.llm.tokenize(text), text

    def reasoning_splitter(self, prompt: str) -> ReasoningSplitter | None:
        """A splitter of the reply to this rendered prompt into thinking and answer (None: the template never
        thinks)."""
        return ReasoningSplitter(prompt_opens_thinking(prompt)) if self.thinks else None

    def check_prompt(self, ids: list[int], max_tokens: int | None) -> int:
        """The prompt fits with room for at least one token; returns max_tokens capped by what is left."""
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        room = self.n_ctx - len(ids)
        if room < 1:
            raise ApiError(400, f"the prompt has {len(ids)} tokens, the context {self.n_ctx}: it leaves no room for "
                                "a reply", code="context_length_exceeded")
        if max_tokens is not None and max_tokens < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        return room if max_tokens is None else min(max_tokens, room)

    def submit(self, kind: str, work: Callable[[Job], None]) -> Job:
        job = Job(kind, work, asyncio.get_running_loop())
        try:
            self.scheduler.submit(job)
        except QueueFull:
            self.metrics.rejected.inc()
            raise ApiError(429, f"the server is busy: {self.scheduler.queue_length()} requests are waiting",
                           code="queue_full", headers={"Retry-After": str(self.scheduler.retry_after())}) from None
        return job

    def generation(self, ids: list[int], max_tokens: int, sampling: dict, stop: list[str] | None,
                   logprobs: int | None, index: int = 0) -> Callable[[Job], None]:
        """Work for the engine thread: generate, emitting ("chunk", (index, Chunk)) items."""

        def work(job: Job) -> None:
            job.progress.update(phase="prompt", prompt_tokens=len(ids), max_tokens=max_tokens, generated=0)
            self.run_generation(job, ids, max_tokens, sampling, stop, logprobs, index)

        return work

    def run_generation(self, job: Job, ids, max_tokens, sampling, stop, logprobs, index=0,
                       cached_tokens: int | None = None) -> None:
        """`cached_tokens`: what to report instead of the engine's reuse (a prompt this request already read)."""
        chunks = self.llm.generate(ids, max_tokens=max_tokens, stop=stop, stream=True, logprobs=logprobs,
                                   cancel=job.cancelled.is_set, **sampling)
        for chunk in chunks:
            job.progress["phase"] = "decode"
            job.progress["generated"] += len(chunk.token_ids)
            if chunk.finish_reason:
                if cached_tokens is not None:
                    chunk.stats.cached_tokens = chunk.stats.checkpoint_tokens = cached_tokens
                job.progress["cached_tokens"] = chunk.stats.cached_tokens
                self.metrics.record(chunk.stats, chunk.finish_reason)
            job.emit("chunk", (index, chunk))

    def monitor(self) -> dict:
        total, available = host_memory_bytes()
        current = self.scheduler.current
        progress = None
        if current is not None:
            progress = dict(current.progress)
            progress["elapsed_seconds"] = time.time() - progress.get("started_at", time.time())
        m = self.metrics
        hit_rate = expert_cache_hit_rate(self.llm.engine)
        n_checkpoints, checkpoint_bytes = checkpoint_figures(self.llm.engine)
        return {
            "model": self.config.model_name,
            "uptime_seconds": time.time() - m.started,
            "queue_length": self.scheduler.queue_length(),
            "running": current is not None,
            "current": progress,
            "last": m.last,
            "totals": {"prompt_tokens": m.total(m.prompt_tokens), "cached_tokens": m.total(m.cached_tokens),
                       "checkpoint_tokens": m.total(m.checkpoint_tokens),
                       "generated_tokens": m.total(m.generated_tokens), "requests": m.total(m.requests),
                       "rejected": m.total(m.rejected), "cancelled": m.total(m.cancelled)},
            "memory": {"process_rss_bytes": process_rss_bytes(), "host_total_bytes": total,
                       "host_available_bytes": available, "gpu": gpu_memory_bytes(self.llm.engine)},
            "expert_cache_hit_rate": None if math.isnan(hit_rate) else hit_rate,  # None: experts all resident
            "checkpoints": {"count": n_checkpoints, "bytes": checkpoint_bytes},
            "n_ctx": self.n_ctx,
        }


def token_text(tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token as OpenAI's logprobs show it: its text (invalid UTF-8 replaced) and its bytes."""
    raw = tokenizer.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


# ---- the application ----


def _web_file(name: str) -> bytes:
    return resources.files("strata.serve").joinpath("web").joinpath(name).read_bytes()


_WEB = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


def create_app(llm, config: ServerConfig) -> FastAPI:
    from contextlib import asynccontextmanager

    from strata.serve import anthropic, openai, tokenize

    server = Server(llm, config)

    @asynccontextmanager
    async def lifespan(app):
        yield
        server.scheduler.stop()

    app = FastAPI(title="strata", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = server
    key = config.api_key.encode() if config.api_key else None

    def require_key(request: Request) -> None:
        if key is None:
            return
        given = request.headers.get("x-api-key", "")
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given = token.strip()
        if not hmac.compare_digest(given.encode(), key):
            raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)",
                           code="invalid_api_key")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return _error_response(request, error.status, error.message, error.param, error.code, error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        return _error_response(request, error.status_code, str(error.detail), headers=error.headers)

    @app.exception_handler(StrataError)
    async def strata_error(request: Request, error: StrataError):
        return _error_response(request, 400, str(error))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception):
        return _error_response(request, 500, f"internal error: {type(error).__name__}")

    app.add_middleware(_CountRequests, counter=server.metrics.requests)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": config.model_name, "queue_length": server.scheduler.queue_length()}

    @app.get("/metrics", dependencies=[Depends(require_key)])
    async def metrics():
        return Response(server.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/monitor", dependencies=[Depends(require_key)])
    async def monitor():
        return server.monitor()

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(_web_file("index.html"))

    @app.get("/web/{name}")
    async def web(name: str):
        if name not in _WEB:  # a fixed set of packaged files: the name never becomes a path
            raise ApiError(404, "no such file")
        return Response(_web_file(name), media_type=_WEB[name])

    app.include_router(openai.router, dependencies=[Depends(require_key)])
    app.include_router(anthropic.router, dependencies=[Depends(require_key)])
    app.include_router(tokenize.router, dependencies=[Depends(require_key)])
    return app


class _CountRequests:
    """Counts POSTs to /v1/ by path and status (a plain ASGI wrapper: streams and disconnects pass untouched)."""

    def __init__(self, app, counter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.counter.labels(scope["path"], str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def _error_response(request: Request, status: int, message: str, param=None, code=None, headers=None):
    return JSONResponse(error_body(request.url.path, status, message, param, code), status_code=status,
                        headers=headers)


# ---- the command ----


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, max_queue: int = 0) -> None:
    if max_queue < 0:
        raise StrataError("--max-queue must be >= 0")
    if not is_loopback(host) and not api_key:
        raise StrataError(f"--host {host} is reachable from other machines: give an --api-key (or serve on 127.0.0.1)")
    if api_key is not None and len(api_key) < 8:
        raise StrataError("--api-key must be at least 8 characters")


def serve(args, llm) -> None:
    """`strata serve`: `llm` is the loaded model, `args` the command line."""
    import uvicorn

    config = ServerConfig(model_name=args.model_name or Path(args.model).stem, api_key=args.api_key,
                          max_queue=args.max_queue, max_body_bytes=int(args.max_body_mib * (1 << 20)))
    uvicorn.run(create_app(llm, config), host=args.host, port=args.port, log_level="warning")
