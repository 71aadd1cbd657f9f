"""A real, small byte-level BPE tokenizer for synthetic test models, as GGUF tokenizer metadata.

Trained with the `tokenizers` library on a few KB of multilingual text shipped in strata/data, split the Qwen2 way.
The vocabulary is laid out as a GGUF from a Qwen model is: the 256 byte tokens in byte order (so every text
encodes), the merged tokens in merge order, then the ChatML control tokens, padded to the size asked for.
"""

from __future__ import annotations

import json
from importlib import resources
from collections.abc import Iterable
from typing import Any

import gguf
from tokenizers import Regex, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as _BackendTokenizer

from strata.errors import StrataError
from strata.tokenizer import CHATML_TEMPLATE, SPLIT_PATTERNS, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, byte_to_char

CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _corpus_lines() -> list[str]:
    text = resources.files("strata").joinpath("data/tokenizer_corpus.txt").read_text(encoding="utf-8")
    return text.splitlines(keepends=True)


def train_small_bpe(vocab_size: int = 512, corpus_lines: Iterable[str] | None = None) -> dict[str, Any]:
    """GGUF tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) of exactly `vocab_size` tokens,
    trained on `corpus_lines` (by default the few KB in strata/data)."""
    byte_tokens = list(byte_to_char().values())
    n_merges = vocab_size - len(byte_tokens) - len(CHATML_SPECIAL_TOKENS)
    if n_merges < 0:
        floor = len(byte_tokens) + len(CHATML_SPECIAL_TOKENS)
        raise StrataError(f"small BPE tokenizer: vocab_size {vocab_size} is below its {floor} byte and ChatML tokens")

    backend = _BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERNS["qwen2"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=len(byte_tokens) + n_merges,
        min_frequency=2,
        initial_alphabet=byte_tokens,
        show_progress=False,
    )
    backend.train_from_iterator(_corpus_lines() if corpus_lines is None else corpus_lines, trainer)
    merges = [tuple(pair) for pair in json.loads(backend.to_str())["model"]["merges"]]

    merged_tokens = [left + right for left, right in merges]
    n_reserved = n_merges - len(merged_tokens)  # the corpus ran out of pairs seen twice
    specials = [*CHATML_SPECIAL_TOKENS, *(f"<|reserved_{index}|>" for index in range(n_reserved))]
    tokens = [*byte_tokens, *merged_tokens, *specials]
    token_types = [TOKEN_TYPE_NORMAL] * (len(byte_tokens) + len(merged_tokens)) + [TOKEN_TYPE_CONTROL] * len(specials)
    assert len(tokens) == vocab_size and len(set(tokens)) == vocab_size

    endoftext, im_end = tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types,
        "tokenizer.ggml.merges": [f"{left} {right}" for left, right in merges],
        "tokenizer.ggml.eos_token_id": im_end,
        "tokenizer.ggml.bos_token_id": endoftext,
        "tokenizer.ggml.padding_token_id": endoftext,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


# Value types of the tokenizer keys a GGUF carries; the ids are uint32 as llama.cpp writes them.
_ID_KEYS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.unknown_token_id",
)


def write_tokenizer_metadata(writer: gguf.GGUFWriter, metadata: dict[str, Any]) -> None:
    """Add the `tokenizer.*` keys of `metadata` to `writer` with the value types llama.cpp reads."""
    for key, value in metadata.items():
        if key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
            writer.add_string(key, value)
        elif key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            writer.add_array(key, value)
        elif key == "tokenizer.ggml.token_type":
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        elif key in _ID_KEYS:
            writer.add_uint32(key, value)
        elif key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
            writer.add_bool(key, value)
        else:
            raise ValueError(f"write_tokenizer_metadata: no GGUF value type known for {key}")
