"""Tool calls in generated text, the Qwen way: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The parser takes text as it streams and hands back plain text as soon as it cannot be the start of a call, and each
call once its closing tag has come. A block whose body is not a JSON object with a name stays plain text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from strata.engine.generation import held_back

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def parse_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class ToolCallParser:
    """Feed streamed text; get back a list of `str` (plain text) and `ToolCall` items, in order."""

    def __init__(self):
        self._buffer = ""
        self._inside = False

    def feed(self, text: str) -> list[str | ToolCall]:
        self._buffer += text
        out: list[str | ToolCall] = []
        while True:
            if not self._inside:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = held_back(self._buffer, [OPEN])
                    _text(out, self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return out
                _text(out, self._buffer[:start])
                self._buffer, self._inside = self._buffer[start + len(OPEN) :], True
            else:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    return out
                body, self._buffer, self._inside = self._buffer[:end], self._buffer[end + len(CLOSE) :], False
                call = parse_call(body)
                out.append(call) if call else _text(out, OPEN + body + CLOSE)

    def finish(self) -> list[str | ToolCall]:
        """What is left at the end: an unclosed block is a call if its body parses, else text."""
        out: list[str | ToolCall] = []
        if self._inside:
            call = parse_call(self._buffer)
            out.append(call) if call else _text(out, OPEN + self._buffer)
        else:
            _text(out, self._buffer)
        self._buffer, self._inside = "", False
        return out


def _text(out: list, text: str) -> None:
    if text:
        out.append(text)


def split_calls(text: str) -> tuple[str, list[ToolCall]]:
    """A whole reply: its plain text (stripped when there are calls) and its calls."""
    parser = ToolCallParser()
    items = parser.feed(text) + parser.finish()
    calls = [item for item in items if isinstance(item, ToolCall)]
    plain = "".join(item for item in items if isinstance(item, str))
    return (plain.strip() if calls else plain), calls
