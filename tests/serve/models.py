"""A tiny qwen3moe whose chat template knows tools, tool calls, tool results and enable_thinking (Qwen's format)."""

from __future__ import annotations

from pathlib import Path

from strata.gguf.writer import write_gguf
from strata.models.synthetic import PRESETS, model_metadata, model_tensors
from strata.tokenizer_train import train_small_bpe, write_tokenizer_metadata

TOOL_TEMPLATE = r"""{%- if messages[0].role == 'system' or tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}
{{- messages[0].content }}
{%- endif %}
{%- if tools %}
{{- '\n\nFunctions you may call, one JSON signature a line:\n<tools>' }}
{%- for tool in tools %}
{{- '\n' + (tool | tojson) }}
{%- endfor %}
{{- '\n</tools>\nTo call one, answer <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- elif not (loop.first and message.role == 'system') %}
{{- '<|im_start|>' + message.role + '\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{%- set arguments = call.function.arguments %}
{%- if arguments is not string %}{% set arguments = arguments | tojson %}{% endif %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + arguments + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and not enable_thinking %}
{{- '<think>\n\n</think>\n\n' }}
{%- endif %}
{%- endif %}
"""


def make_tool_model(path: Path) -> Path:
    shape = PRESETS["tiny"]
    tokenizer = train_small_bpe(vocab_size=shape.vocab) | {"tokenizer.chat_template": TOOL_TEMPLATE}
    write_gguf(path, "qwen3moe", model_metadata("qwen3moe", shape, "tiny"),
               model_tensors("qwen3moe", shape, "Q8_0", 0), extra=lambda w: write_tokenizer_metadata(w, tokenizer))
    return path
