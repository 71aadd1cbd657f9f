"""Anthropic's Messages API: POST /v1/messages, whole or streamed as its named events, and its token count
(POST /v1/messages/count_tokens: the conversation as /v1/messages would read it)."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr
from sse_starlette import EventSourceResponse

from strata.engine.sampling import SamplingParams
from strata.errors import StrataError
from strata.serve.app import MAX_STOP_LENGTH, MAX_STOP_STRINGS, ApiError, Job, Server, error_body, job_events
from strata.serve.reasoning import ReasoningSplitter, split_reasoning
from strata.serve.tools import ToolCall, ToolCallParser, split_calls

router = APIRouter()

Number = Annotated[float, Strict()]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Request):
    type: Literal["text"]
    text: StrictStr


class ToolUseBlock(_Request):
    type: Literal["tool_use"]
    id: StrictStr
    name: StrictStr
    input: dict


class ToolResultBlock(_Request):
    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: StrictStr | list[TextBlock] = ""
    is_error: StrictBool = False


class ThinkingBlock(_Request):  # earlier turns' thinking: not shown to the model again
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock], Field(discriminator="type")]


class Message(_Request):
    role: Literal["user", "assistant"]
    content: StrictStr | list[Block]


class ToolDef(_Request):
    name: StrictStr = Field(min_length=1, max_length=128)
    description: StrictStr | None = None
    input_schema: dict = Field(default_factory=dict)


class Thinking(_Request):
    type: Literal["enabled", "disabled", "adaptive"]


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]


class CountTokensRequest(_Request):
    """What decides a conversation's prompt: the fields /v1/messages/count_tokens takes."""

    model: StrictStr
    messages: list[Message] = Field(min_length=1)
    system: StrictStr | list[TextBlock] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: StrictInt
    stop_sequences: list[StrictStr] | None = None
    temperature: Annotated[Number, Field(ge=0, le=1)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None
    stream: StrictBool = False


def _text(content: str | list) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content if isinstance(b, TextBlock))


def template_messages(body: CountTokensRequest) -> list[dict]:
    """Anthropic's turns as the chat template's OpenAI-style messages: tool results become `tool` messages."""
    out: list[dict[str, Any]] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system)})
    for message in body.messages:
        blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else \
            message.content
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        for block in blocks:
            if isinstance(block, ToolResultBlock):
                out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _text(block.content)})
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                 for b in blocks if isinstance(b, ToolUseBlock)]
        if text or calls or not any(isinstance(b, ToolResultBlock) for b in blocks):
            entry: dict[str, Any] = {"role": message.role, "content": text}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
    return out


def _stop_reason(finish: str, stop_string: str | None, calls: bool) -> str:
    if calls:
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_string else "end_turn"


def _usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens - stats.cached_tokens, "output_tokens": stats.completion_tokens,
            "cache_read_input_tokens": stats.cached_tokens, "cache_creation_input_tokens": 0}


def _tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": f"toolu_{call.id.removeprefix('call_')}", "name": call.name,
            "input": json.loads(call.arguments)}


def _render(server: Server, body: CountTokensRequest) -> tuple[list[int], str, list[dict] | None]:
    """The request's conversation through the chat template: (token ids, text, the tools it was shown)."""
    server.check_model(body.model)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}} for t in body.tools or []] or None
    if body.tool_choice is not None and body.tool_choice.type == "none":
        tools = None
    template_kwargs = {}
    if body.thinking is not None:
        template_kwargs["enable_thinking"] = body.thinking.type != "disabled"
    ids, prompt = server.render_chat(template_messages(body), tools, template_kwargs)
    return ids, prompt, tools


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request):
    server: Server = request.app.state.server
    body: CountTokensRequest = await server.read_json(request, CountTokensRequest)
    ids, _, _ = _render(server, body)
    return JSONResponse({"input_tokens": len(ids)})


@router.post("/v1/messages")
async def messages(request: Request):
    server: Server = request.app.state.server
    body: MessagesRequest = await server.read_json(request, MessagesRequest)
    ids, prompt, tools = _render(server, body)
    max_tokens = server.check_prompt(ids, body.max_tokens)
    stops = list(body.stop_sequences or [])
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop_sequences of up to {MAX_STOP_LENGTH} characters")
    sampling = {k: v for k, v in (("temperature", body.temperature), ("top_p", body.top_p),
                                  ("top_k", body.top_k)) if v is not None}
    try:
        SamplingParams(**sampling)
    except StrataError as error:
        raise ApiError(400, str(error)) from None
    job = server.submit("messages", server.generation(ids, max_tokens, sampling, stops, None))
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        stream = _stream(server, job, message_id, tools is not None, server.reasoning_splitter(prompt))
        return EventSourceResponse(stream, ping=server.config.keepalive_seconds, sep="\n")

    text, last = [], None
    async for _, (_, chunk) in job_events(job, request):
        text.append(chunk.text)
        last = chunk
    if last is None or last.finish_reason == "cancelled":
        return Response(status_code=499)
    reasoning, content = split_reasoning("".join(text), server.reasoning_splitter(prompt))
    calls = []
    if tools is not None:
        content, calls = split_calls(content)
    blocks = ([{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []) + \
        ([{"type": "text", "text": content}] if content else []) + [_tool_use(c) for c in calls]
    return JSONResponse({
        "id": message_id, "type": "message", "role": "assistant", "model": server.config.model_name,
        "content": blocks, "stop_reason": _stop_reason(last.finish_reason, last.stop_string, bool(calls)),
        "stop_sequence": last.stop_string, "usage": _usage(last.stats),
    })


def _event(name: str, data: dict) -> dict:
    return {"event": name, "data": json.dumps({"type": name, **data}, ensure_ascii=False)}


async def _stream(server: Server, job: Job, message_id: str, parse_tools: bool, splitter: ReasoningSplitter | None):
    def message_start(stats) -> dict:
        # Sent with the first token, once the engine knows how much of the prompt came from a checkpoint.
        return _event("message_start", {"message": {
            "id": message_id, "type": "message", "role": "assistant", "model": server.config.model_name,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": {**_usage(stats), "output_tokens": 0}}})

    started = False
    parser = ToolCallParser() if parse_tools else None
    index, open_block, n_calls = 0, None, 0  # open_block: "thinking" or "text" while such a block is open

    def close():
        nonlocal index, open_block
        event = _event("content_block_stop", {"index": index})
        index, open_block = index + 1, None
        return event

    def piece(kind: str, text: str) -> list[dict]:
        """Events that add `text` to a block of `kind` ("thinking" or "text"), closing one of the other kind."""
        nonlocal open_block
        events = [close()] if open_block not in (None, kind) else []
        if open_block is None:
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            events.append(_event("content_block_start", {"index": index, "content_block": start}))
            open_block = kind
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
            {"type": "text_delta", "text": text}
        return events + [_event("content_block_delta", {"index": index, "delta": delta})]

    try:
        async for _, (_, chunk) in job_events(job):
            if not started:
                started = True
                yield message_start(chunk.stats)
                yield _event("ping", {})
            reasoning, answer = splitter.feed(chunk.text) if splitter else ("", chunk.text)
            if chunk.finish_reason and splitter:
                tail = splitter.finish()
                reasoning, answer = reasoning + tail[0], answer + tail[1]
            for event in piece("thinking", reasoning) if reasoning else []:
                yield event
            items = parser.feed(answer) if parser else ([answer] if answer else [])
            if chunk.finish_reason and parser:
                items += parser.finish()
            for item in items:
                if isinstance(item, str):
                    for event in piece("text", item):
                        yield event
                    continue
                if open_block is not None:
                    yield close()
                block = _tool_use(item)
                yield _event("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
                yield _event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                               "partial_json": item.arguments}})
                yield _event("content_block_stop", {"index": index})
                index, n_calls = index + 1, n_calls + 1
            if chunk.finish_reason:
                if open_block is not None:
                    yield close()
                usage = _usage(chunk.stats)
                reason = _stop_reason(chunk.finish_reason, chunk.stop_string, n_calls > 0)
                yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": chunk.stop_string},
                                               "usage": usage})
                yield _event("message_stop", {})
    except Exception as error:
        message = str(error) if isinstance(error, (ApiError, StrataError)) else "internal error"
        yield {"event": "error", "data": json.dumps(error_body("/v1/messages", 500, message))}
