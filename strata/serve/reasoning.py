"""The thinking section of a reply, `<think>...</think>`, split from its answer as the text streams.

Qwen-style templates either let the model open the section itself (the reply starts with `<think>`), or open it in
the prompt (the prompt ends inside `<think>`, and the reply holds only the close), or, with thinking switched off,
write an empty section into the prompt (the reply is all answer). The splitter handles the three; a template that
never writes `<think>` gets no splitting at all. The whitespace around the section (Qwen writes
`<think>\\n...\\n</think>\\n\\n`) belongs to neither part.
"""

from __future__ import annotations

from strata.engine.generation import held_back
from strata.errors import StrataError

OPEN, CLOSE = "<think>", "</think>"


def template_thinks(tokenizer) -> bool:
    """Whether the chat template writes thinking sections (tried with the switch off, where Qwen's templates write
    an empty one, and with its default)."""
    messages = [{"role": "user", "content": "x"}]
    for options in ({"enable_thinking": False}, {}):
        try:
            if OPEN in tokenizer.apply_chat_template(messages, add_generation_prompt=True, **options):
                return True
        except StrataError:  # a template that cannot render this probe has no switch we could use
            return False
    return False


def prompt_opens_thinking(prompt: str) -> bool:
    """The prompt ends inside a thinking section: the reply starts with its reasoning."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


class ReasoningSplitter:
    """Feed streamed reply text; get back (reasoning, answer) text for each piece."""

    def __init__(self, inside: bool = False):
        self.state = "inside" if inside else "start"  # start -> inside -> after -> answer, or start -> answer
        self.buffer = ""
        self.reasoning_started = False
        self.held_space = ""  # the reasoning's trailing whitespace: sent only if more reasoning follows

    def feed(self, text: str) -> tuple[str, str]:
        self.buffer += text
        reasoning, answer = "", ""
        while True:
            if self.state == "start":
                head = self.buffer.lstrip()
                if head.startswith(OPEN):
                    self.buffer, self.state = head[len(OPEN):], "inside"
                    continue
                if OPEN.startswith(head):  # nothing yet, or the start of an open tag: wait
                    return reasoning, answer
                self.state = "answer"
            if self.state == "inside":
                end = self.buffer.find(CLOSE)
                if end < 0:
                    keep = held_back(self.buffer, [CLOSE])
                    reasoning += self._reasoning(self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    return reasoning, answer
                reasoning += self._reasoning(self.buffer[:end])
                self.buffer, self.state, self.held_space = self.buffer[end + len(CLOSE):], "after", ""
            if self.state == "after":
                self.buffer = self.buffer.lstrip()
                if not self.buffer:
                    return reasoning, answer
                self.state = "answer"
            answer += self.buffer
            self.buffer = ""
            return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """What is held at the end: an unclosed section's last reasoning, or a would-be open tag as answer."""
        rest, self.buffer = self.buffer, ""
        if self.state == "inside":
            return self._reasoning(rest), ""
        return "", rest if self.state in ("start", "answer") else ""

    def _reasoning(self, text: str) -> str:
        if not self.reasoning_started:
            text = text.lstrip()
            self.reasoning_started = bool(text)
        text = self.held_space + text
        body = text.rstrip()
        self.held_space = text[len(body):]
        return body


def split_reasoning(text: str, splitter: ReasoningSplitter | None) -> tuple[str, str]:
    """A whole reply's (reasoning, answer), through a fresh `splitter` (None: all answer)."""
    if splitter is None:
        return "", text
    reasoning, answer = splitter.feed(text)
    tail_reasoning, tail_answer = splitter.finish()
    return reasoning + tail_reasoning, answer + tail_answer
