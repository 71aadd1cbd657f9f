"""OpenAI's API: /v1/chat/completions, /v1/completions (with echo and logprobs, as lm-eval scores), /v1/models.

Sampling fields a request leaves out take the engine's defaults (SamplingParams), not OpenAI's.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr, model_validator
from sse_starlette import EventSourceResponse

from strata.engine.sampling import SamplingParams
from strata.errors import StrataError
from strata.serve.app import MAX_STOP_LENGTH, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, ApiError, Job, Server, \
    error_body, job_events, token_text
from strata.serve.reasoning import ReasoningSplitter, split_reasoning
from strata.serve.tools import ToolCall, ToolCallParser, split_calls

router = APIRouter()

Number = Annotated[float, Strict()]
MAX_BATCH = 64


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # fields we do not use (user, metadata, ...) are accepted and ignored


class TextPart(_Request):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(_Request):
    name: StrictStr
    arguments: StrictStr | dict = "{}"


class ToolCallIn(_Request):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: StrictStr | None = None

    @model_validator(mode="after")
    def _has_content(self) -> "Message":
        # As OpenAI's API: only an assistant turn that calls tools may leave its content out (a user turn without
        # one reached the template as an empty message)
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs its content")
        return self


class FunctionDef(_Request):
    name: StrictStr = Field(min_length=1, max_length=128)
    description: StrictStr | None = None
    parameters: dict | None = None


class Tool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Request):
    include_usage: StrictBool = False


class _Sampling(_Request):
    model: StrictStr
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[Number, Field(gt=0)] | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1

    def sampling(self) -> dict:
        names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
        options = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        try:
            SamplingParams(**options)
        except StrataError as error:
            raise ApiError(400, str(error)) from None
        return options

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_LENGTH for s in stops):
            raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings of up to {MAX_STOP_LENGTH} characters",
                           param="stop")
        return stops


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, StrictBool | StrictStr | StrictInt] | None = None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    echo: StrictBool = False
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


def _max_tokens(server: Server, ids: list[int], *values: int | None) -> int:
    given = next((v for v in values if v is not None), None)
    return server.check_prompt(ids, given)


def _usage(stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
            "total_tokens": stats.prompt_tokens + stats.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _sse(data: dict | str) -> dict:
    return {"data": data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}


def _stream_error(error: Exception) -> dict:
    message = str(error) if isinstance(error, (ApiError, StrataError)) else f"internal error: {type(error).__name__}"
    return _sse(error_body("/v1/chat", 500, message))


def _event_stream(server: Server, events):
    return EventSourceResponse(events, ping=server.config.keepalive_seconds, sep="\n")


# ---- chat ----


def _content_text(content) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(part.text for part in content)


def template_messages(messages: list[Message]) -> list[dict]:
    """The request's messages as chat templates expect them (tool call arguments as objects, as transformers
    passes them)."""
    out = []
    for message in messages:
        entry: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                                 "content": _content_text(message.content)}
        if message.name:
            entry["name"] = message.name
        if message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            entry["tool_calls"] = [{"id": call.id, "type": "function",
                                    "function": {"name": call.function.name,
                                                 "arguments": _arguments(call.function.arguments)}}
                                   for call in message.tool_calls]
        out.append(entry)
    return out


def _arguments(arguments: str | dict) -> dict | str:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


def chat_logprobs(tokenizer, logprobs) -> list[dict]:
    entries = []
    for lp in logprobs:
        text, raw = token_text(tokenizer, lp.token)
        top = []
        for token, value in lp.top:
            t, b = token_text(tokenizer, token)
            top.append({"token": t, "logprob": value, "bytes": b})
        entries.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
    return entries


def _tool_call_json(call: ToolCall, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return out if index is None else {"index": index, **out}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    server: Server = request.app.state.server
    body: ChatRequest = await server.read_json(request, ChatRequest)
    server.check_model(body.model)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []] or None
    if body.tool_choice == "none":
        tools = None
    template_kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort is not None:
        template_kwargs["enable_thinking"] = body.reasoning_effort not in ("none", "minimal")
    ids, prompt = server.render_chat(template_messages(body.messages), tools, template_kwargs)
    max_tokens = _max_tokens(server, ids, body.max_completion_tokens, body.max_tokens)
    sampling, stops = body.sampling(), body.stops()
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    job = server.submit("chat", server.generation(ids, max_tokens, sampling, stops, logprobs))
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": server.config.model_name}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _event_stream(server, _chat_stream(server, job, meta, tools is not None, include_usage,
                                                  server.reasoning_splitter(prompt)))

    text, lps, last = [], [], None
    async for _, (_, chunk) in job_events(job, request):
        text.append(chunk.text)
        lps.extend(chunk.logprobs or [])
        last = chunk
    if last is None or last.finish_reason == "cancelled":
        return Response(status_code=499)  # the client is gone; nobody reads this
    reasoning, content = split_reasoning("".join(text), server.reasoning_splitter(prompt))
    calls = []
    if tools is not None:
        content, calls = split_calls(content)
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [_tool_call_json(call) for call in calls]
    choice = {"index": 0, "message": message,
              "logprobs": {"content": chat_logprobs(server.llm.tokenizer, lps)} if logprobs is not None else None,
              "finish_reason": "tool_calls" if calls else _finish(last.finish_reason)}
    return JSONResponse({**meta, "object": "chat.completion", "choices": [choice], "usage": _usage(last.stats)})


async def _chat_stream(server: Server, job: Job, meta: dict, parse_tools: bool, include_usage: bool,
                       splitter: ReasoningSplitter | None):
    tokenizer = server.llm.tokenizer

    def event(delta: dict, finish: str | None = None, logprobs: list | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None if logprobs is None else {"content": logprobs},
                  "finish_reason": finish}
        return _sse({**meta, "object": "chat.completion.chunk", "choices": [choice]})

    parser = ToolCallParser() if parse_tools else None
    n_calls = 0
    yield event({"role": "assistant", "content": ""})
    try:
        async for _, (_, chunk) in job_events(job):
            lps = chat_logprobs(tokenizer, chunk.logprobs) if chunk.logprobs else None
            reasoning, answer = splitter.feed(chunk.text) if splitter else ("", chunk.text)
            if chunk.finish_reason and splitter:
                tail = splitter.finish()
                reasoning, answer = reasoning + tail[0], answer + tail[1]
            if reasoning:
                yield event({"reasoning_content": reasoning}, logprobs=lps)
                lps = None
            items = parser.feed(answer) if parser else ([answer] if answer else [])
            if chunk.finish_reason and parser:
                items += parser.finish()
            for item in items:
                if isinstance(item, str):
                    yield event({"content": item}, logprobs=lps)
                else:  # the name first, then the arguments, as OpenAI streams them
                    head = {"index": n_calls, "id": item.id, "type": "function",
                            "function": {"name": item.name, "arguments": ""}}
                    yield event({"tool_calls": [head]}, logprobs=lps)
                    yield event({"tool_calls": [{"index": n_calls, "function": {"arguments": item.arguments}}]})
                    n_calls += 1
                lps = None
            if lps:
                yield event({}, logprobs=lps)
            if chunk.finish_reason:
                yield event({}, "tool_calls" if n_calls else _finish(chunk.finish_reason))
                if include_usage:
                    yield _sse({**meta, "object": "chat.completion.chunk", "choices": [],
                                "usage": _usage(chunk.stats)})
    except Exception as error:
        yield _stream_error(error)
    yield _sse("[DONE]")


# ---- completions ----


def _prompts(server: Server, prompt) -> tuple[list[list[int]], list[str | None]]:
    """Token ids of each prompt of the batch, and its text where it was given as text."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise ApiError(400, "prompt is empty", param="prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    if len(prompt) > MAX_BATCH:
        raise ApiError(400, f"at most {MAX_BATCH} prompts a request", param="prompt")
    vocab = server.llm.tokenizer.vocab_size
    ids, texts = [], []
    for item in prompt:
        if isinstance(item, str):
            ids.append(server.llm.tokenize(item))
            texts.append(item)
        else:
            if any(not 0 <= token < vocab for token in item):
                raise ApiError(400, f"a prompt token id is outside the vocabulary of {vocab}", param="prompt")
            ids.append(list(item))
            texts.append(None)
    return ids, texts


def prompt_logprobs(llm, ids: list[int], k: int) -> list[tuple[int, float | None, tuple]]:
    """(token, logprob given the tokens before it, the k likeliest there) for each prompt token, from the prompt
    path's logits; the first token has no logprob."""
    rows = llm.logits(ids)
    out: list[tuple[int, float | None, tuple]] = [(ids[0], None, ())]
    block = 256  # log-softmax a few rows at a time: float64 over a whole long prompt would be large
    for start in range(0, len(ids) - 1, block):
        lp = torch.log_softmax(rows[start : start + block].double(), dim=-1)
        targets = torch.tensor(ids[start + 1 : start + 1 + block])
        chosen = lp.gather(1, targets[:, None])[:, 0].tolist()
        values, top_ids = torch.topk(lp, k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
        for j, token in enumerate(targets.tolist()):
            out.append((token, chosen[j], tuple(zip(top_ids[j].tolist(), values[j].tolist()))))
    return out


class _TextLogprobs:
    """The legacy completions logprobs object, built token by token."""

    def __init__(self, tokenizer, offset: int = 0):
        self.tokenizer, self.offset = tokenizer, offset
        self.data = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add(self, token: int, logprob: float | None, top) -> None:
        text, _ = token_text(self.tokenizer, token)
        self.data["tokens"].append(text)
        self.data["token_logprobs"].append(logprob)
        self.data["top_logprobs"].append(None if logprob is None else
                                         {token_text(self.tokenizer, t)[0]: v for t, v in top})
        self.data["text_offset"].append(self.offset)
        self.offset += len(text)

    def take(self) -> dict:
        out, self.data = self.data, {key: [] for key in self.data}
        return out


@router.post("/v1/completions")
async def completions(request: Request):
    server: Server = request.app.state.server
    body: CompletionRequest = await server.read_json(request, CompletionRequest)
    server.check_model(body.model)
    batch, texts = _prompts(server, body.prompt)
    if body.stream and len(batch) > 1:
        raise ApiError(400, "stream takes one prompt", param="stream")
    limits = [_max_tokens(server, ids, body.max_tokens) for ids in batch]
    sampling, stops = body.sampling(), body.stops()
    llm = server.llm

    def work(job: Job) -> None:
        for index, ids in enumerate(batch):
            job.progress.update(phase="prompt", prompt_tokens=len(ids), max_tokens=limits[index], generated=0)
            scored = body.echo and body.logprobs is not None
            if scored:  # the prompt path reads the whole prompt again, from its first token
                job.emit("prompt", (index, prompt_logprobs(llm, ids, body.logprobs)))
            server.run_generation(job, ids, limits[index], sampling, stops, body.logprobs, index,
                                  cached_tokens=0 if scored else None)
            if job.cancelled.is_set():
                return

    job = server.submit("completion", work)
    meta = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": server.config.model_name,
            "object": "text_completion"}
    echo_text = [(texts[i] if texts[i] is not None else llm.detokenize(ids)) if body.echo else ""
                 for i, ids in enumerate(batch)]
    if body.stream:
        return _event_stream(server, _completion_stream(server, job, meta, echo_text[0], body.logprobs))

    choices = [{"index": i, "text": echo_text[i], "logprobs": None, "finish_reason": None} for i in range(len(batch))]
    builders = [_TextLogprobs(llm.tokenizer) for _ in batch]
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details":
             {"cached_tokens": 0}}
    async for kind, (index, value) in job_events(job, request):
        if kind == "prompt":
            for token, logprob, top in value:
                builders[index].add(token, logprob, top)
            continue
        choices[index]["text"] += value.text
        for lp in value.logprobs or []:
            builders[index].add(lp.token, lp.logprob, lp.top)
        if value.finish_reason:
            choices[index]["finish_reason"] = _finish(value.finish_reason)
            for key, count in _usage(value.stats).items():
                if key == "prompt_tokens_details":
                    usage[key]["cached_tokens"] += count["cached_tokens"]
                else:
                    usage[key] += count
    if any(choice["finish_reason"] is None for choice in choices):
        return Response(status_code=499)
    if body.logprobs is not None:
        for choice, builder in zip(choices, builders):
            choice["logprobs"] = builder.data
    return JSONResponse({**meta, "choices": choices, "usage": usage})


async def _completion_stream(server: Server, job: Job, meta: dict, echo: str, logprobs: int | None):
    builder = _TextLogprobs(server.llm.tokenizer)

    def event(text: str, finish: str | None = None) -> dict:
        lps = builder.take() if logprobs is not None else None
        return _sse({**meta, "choices": [{"index": 0, "text": text, "logprobs": lps, "finish_reason": finish}]})

    try:
        prompt_sent = not echo
        async for kind, (_, value) in job_events(job):
            if kind == "prompt":
                for token, logprob, top in value:
                    builder.add(token, logprob, top)
                continue
            if not prompt_sent:
                yield event(echo)
                prompt_sent = True
            for lp in value.logprobs or []:
                builder.add(lp.token, lp.logprob, lp.top)
            if value.text or value.finish_reason:
                yield event(value.text, _finish(value.finish_reason) if value.finish_reason else None)
    except Exception as error:
        yield _stream_error(error)
    yield _sse("[DONE]")


# ---- models ----


def _model_card(server: Server) -> dict:
    return {"id": server.config.model_name, "object": "model", "created": int(server.metrics.started),
            "owned_by": "strata", "context_length": server.n_ctx}


@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [_model_card(request.app.state.server)]}


@router.get("/v1/models/{name:path}")
async def model(name: str, request: Request):
    server: Server = request.app.state.server
    server.check_model(name)
    return _model_card(server)
