"""GGUF tokenizer metadata -> a `tokenizers.Tokenizer` (byte-level BPE); chat templates rendered with jinja2.

A GGUF file carries no tokenizer.json: it stores the vocabulary, the merges, each token's type and the special ids
under `tokenizer.ggml.*`, and names the pre-tokenizer (`tokenizer.ggml.pre`) instead of storing its regex. We rebuild
the tokenizer from those fields: split regex by name, then bytes -> printable characters, then BPE merges; tokens of
type control (3) or user-defined (4) are matched whole in the text. Decoding maps every token back to its bytes.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from datetime import datetime
from numbers import Integral
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as _BackendTokenizer

from strata.errors import StrataError

# llama.cpp's token types, as stored in `tokenizer.ggml.token_type`.
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# Pieces of the split regexes, named so that the differences between vocabularies stand out.
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_WORD = r"[^\r\n\p{L}\p{N}]?\p{L}+"  # a word, with one leading non-letter (a space, a quote) glued on
_PUNCTUATION_THEN_NEWLINES = r" ?[^\s\p{L}\p{N}]+[\r\n]*"
_WHITESPACE = r"\s*[\r\n]+|\s+(?!\S)|\s+"  # newline runs; spaces before a word leave the last one to the word

# `tokenizer.ggml.pre` -> the regex that cut the training text before the merges were learned.
SPLIT_PATTERNS: dict[str, str] = {
    "qwen2": "|".join([_CONTRACTIONS, _WORD, r"\p{N}", _PUNCTUATION_THEN_NEWLINES, _WHITESPACE]),
    # Qwen3.5 keeps combining marks (\p{M}) inside words.
    "qwen35": "|".join(
        [
            _CONTRACTIONS,
            r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+",
            r"\p{N}",
            r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*",
            _WHITESPACE,
        ]
    ),
    # Llama 3 groups digits by up to three.
    "llama-bpe": "|".join([_CONTRACTIONS, _WORD, r"\p{N}{1,3}", _PUNCTUATION_THEN_NEWLINES, _WHITESPACE]),
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}
SPLIT_PATTERNS["llama3"] = SPLIT_PATTERNS["llama-bpe"]
# Files whose converter did not recognise the pre-tokenizer say "default"; GPT-2's split is the closest guess.
SPLIT_PATTERNS["default"] = SPLIT_PATTERNS["gpt-2"]

# ChatML, the Qwen way (no default system prompt); also the template of files that carry none.
CHATML_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}
{{- messages[0].content + '\n\n' }}
{%- endif %}
{{- 'Tools you may call, one JSON schema a line:' }}
{%- for tool in tools %}
{{- '\n' + (tool | tojson) }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if not (tools and loop.first and message.role == 'system') %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def byte_to_char() -> dict[int, str]:
    """GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 borrow characters from 256 on,
    so every byte sequence becomes a string of visible characters (a space is 'Ġ', a newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    borrowed = (byte for byte in range(256) if byte not in mapping)
    for offset, byte in enumerate(borrowed):
        mapping[byte] = chr(256 + offset)
    return dict(sorted(mapping.items()))


_CHAR_TO_BYTE = {char: byte for byte, char in byte_to_char().items()}


class _Fields:
    """Typed reads of `tokenizer.*` keys; each failure is a one-line StrataError naming the file and the key."""

    def __init__(self, metadata: dict[str, Any], source: str):
        self.metadata, self.source = metadata, source

    def fail(self, key: str, problem: str) -> StrataError:
        return StrataError(f"{self.source}: {key} {problem}")

    def get(self, key: str, kind: type, required: bool = False) -> Any:
        if key not in self.metadata:
            if required:
                raise StrataError(f"{self.source}: missing tokenizer field {key}")
            return None
        value = self.metadata[key]
        # bool is an int in Python; a flag must not pass as an id or the other way round.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.fail(key, f"should be {_type_name(kind)}, got {type(value).__name__}")
        return value

    def list_of(self, key: str, kind: type, required: bool = False) -> list | None:
        values = self.get(key, list, required)
        if values is not None:
            bad = next((index for index, value in enumerate(values) if not isinstance(value, kind)), None)
            if bad is not None:
                raise self.fail(key, f"entry {bad} should be {_type_name(kind)}, got {type(values[bad]).__name__}")
        return values

    def token_id(self, key: str, vocab_size: int) -> int | None:
        value = self.get(key, Integral)
        if value is None:
            return None
        if not 0 <= value < vocab_size:
            raise self.fail(key, f"= {value} is outside the vocabulary of {vocab_size} tokens")
        return int(value)


def _type_name(kind: type) -> str:
    return "an int" if kind is Integral else f"a {kind.__name__}"


class Tokenizer:
    """A GGUF file's tokenizer: encode, decode, special ids and the chat template."""

    def __init__(
        self,
        source: str,
        tokens: list[str],
        token_types: list[int],
        first_ids: dict[str, int],
        backend: _BackendTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: frozenset[int],
        add_bos: bool,
        chat_template: jinja2.Template,
        template_tokens: dict[str, str],
    ):
        self._source = source
        self._tokens = tokens
        self._token_types = token_types
        self._first_ids = first_ids
        self._backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self._add_bos = add_bos
        self._chat_template = chat_template
        self._template_tokens = template_tokens

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any], source: str = "model") -> Tokenizer:
        fields = _Fields(metadata, source)
        model = fields.get("tokenizer.ggml.model", str, required=True)
        if model != "gpt2":
            raise fields.fail("tokenizer.ggml.model", f"= {model!r} is not supported (only 'gpt2', byte-level BPE)")
        pre = fields.get("tokenizer.ggml.pre", str) or "default"  # llama.cpp's name when the converter knew none
        if pre not in SPLIT_PATTERNS:
            known = ", ".join(SPLIT_PATTERNS)
            raise fields.fail("tokenizer.ggml.pre", f"= {pre!r} is not a known pre-tokenizer (known: {known})")

        tokens = fields.list_of("tokenizer.ggml.tokens", str, required=True)
        if not tokens:
            raise fields.fail("tokenizer.ggml.tokens", "is empty")
        token_types = _read_token_types(fields, len(tokens))
        first_ids: dict[str, int] = {}
        for index, token in enumerate(tokens):
            first_ids.setdefault(token, index)  # a spelling listed twice encodes to its first id
        backend = _build_backend(fields, tokens, token_types, first_ids, _read_merges(fields), SPLIT_PATTERNS[pre])

        bos = fields.token_id("tokenizer.ggml.bos_token_id", len(tokens))
        eos = fields.token_id("tokenizer.ggml.eos_token_id", len(tokens))
        eot = fields.token_id("tokenizer.ggml.eot_token_id", len(tokens))
        add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", bool))
        if add_bos and bos is None:
            raise fields.fail("tokenizer.ggml.add_bos_token", "is true but tokenizer.ggml.bos_token_id is missing")
        stop_ids = {token_id for token_id in (eos, eot) if token_id is not None}
        if "<|im_end|>" in first_ids:
            # ChatML: a turn ends with <|im_end|>, a document with <|endoftext|>, whatever the file calls EOS.
            stop_ids.update(first_ids[name] for name in ("<|im_end|>", "<|endoftext|>") if name in first_ids)

        template_source = fields.get("tokenizer.chat_template", str) or CHATML_TEMPLATE
        special_names = (("bos_token", bos), ("eos_token", eos))
        return cls(
            source,
            tokens,
            token_types,
            first_ids,
            backend,
            bos_token_id=bos,
            eos_token_ids=frozenset(stop_ids),
            add_bos=add_bos,
            chat_template=_compile_chat_template(fields, template_source),
            template_tokens={name: tokens[token_id] for name, token_id in special_names if token_id is not None},
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def backend(self) -> _BackendTokenizer:
        """The `tokenizers.Tokenizer` doing the work (to save as tokenizer.json, or to encode in batches)."""
        return self._backend

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self._add_bos:
            ids.insert(0, self.bos_token_id)
        return ids

    def token_to_id(self, token: str) -> int | None:
        return self._first_ids.get(token)

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self._tokens[token_id]

    def is_control(self, token_id: int) -> bool:
        self._check_id(token_id)
        return self._token_types[token_id] == TOKEN_TYPE_CONTROL

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for; control and user-defined tokens are stored as plain text."""
        token = self.id_to_token(token_id)
        if self._token_types[token_id] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            return token.encode("utf-8")
        # A character outside the byte alphabet (rare, hand-edited vocabularies) stands for its own UTF-8.
        return b"".join(bytes([_CHAR_TO_BYTE[c]]) if c in _CHAR_TO_BYTE else c.encode("utf-8") for c in token)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        pieces = (self.token_bytes(i) for i in ids if not (skip_special_tokens and self.is_control(i)))
        return b"".join(pieces).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render the conversation as transformers does: special tokens and `tools=None` first, the caller's kwargs
        (`tools`, `enable_thinking`, ...) over them."""
        variables = {**self._template_tokens, "tools": None, "documents": None, **kwargs}
        try:
            return self._chat_template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.TemplateError as error:
            raise StrataError(f"{self._source}: chat template: {error}") from error

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._tokens):
            raise StrataError(f"{self._source}: token id {token_id} is outside the vocabulary of {len(self._tokens)}")


class StreamDecoder:
    """Turns token ids, fed one at a time, into text: an incomplete UTF-8 character is held back until its last byte
    arrives, so the concatenated pieces (after `finish`) equal `decode` of all the ids at once."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip_special_tokens and self._tokenizer.is_control(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def finish(self) -> str:
        """What is left: U+FFFD for a character the stream cut off."""
        return self._utf8.decode(b"", final=True)


def _read_token_types(fields: _Fields, vocab_size: int) -> list[int]:
    types = fields.list_of("tokenizer.ggml.token_type", Integral)
    if types is None:
        return [TOKEN_TYPE_NORMAL] * vocab_size
    if len(types) != vocab_size:
        raise fields.fail("tokenizer.ggml.token_type", f"has {len(types)} entries for {vocab_size} tokens")
    return [int(value) for value in types]


def _read_merges(fields: _Fields) -> list[tuple[str, str]]:
    merges = fields.list_of("tokenizer.ggml.merges", str, required=True)
    pairs = []
    for index, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or not all(parts):
            raise fields.fail("tokenizer.ggml.merges", f"entry {index} = {merge!r} is not two tokens and a space")
        pairs.append((parts[0], parts[1]))
    return pairs


def _build_backend(
    fields: _Fields,
    tokens: list[str],
    token_types: list[int],
    first_ids: dict[str, int],
    merges: list[tuple[str, str]],
    split_pattern: str,
) -> _BackendTokenizer:
    try:
        backend = _BackendTokenizer(models.BPE(vocab=first_ids, merges=merges))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # the Rust side: a merge of unknown tokens an Exception, a merge whose result
        # is not in the vocabulary a panic (pyo3's PanicException is a BaseException)
        raise fields.fail("tokenizer.ggml.merges", f"does not fit the vocabulary: {error}") from None
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    # Whole-token matches in the text: control tokens are special (dropped by skip_special_tokens), user-defined not.
    whole = [
        AddedToken(token, special=kind == TOKEN_TYPE_CONTROL, normalized=False)
        for token, kind in zip(tokens, token_types)
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    backend.add_special_tokens([token for token in whole if token.special])
    backend.add_tokens([token for token in whole if not token.special])
    return backend


def _tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's text for training masks; we render the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _compile_chat_template(fields: _Fields, source: str) -> jinja2.Template:
    # Templates come from downloaded files: a sandbox, and the same environment transformers gives them.
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        problem = f"does not compile: {error.message} (line {error.lineno})"
        raise fields.fail("tokenizer.chat_template", problem) from error
