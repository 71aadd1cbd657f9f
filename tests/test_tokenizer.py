"""strata.tokenizer against transformers' own GGUF tokenizer, on a small GGUF written here."""

import random
from pathlib import Path

import gguf
import numpy as np
import pytest

from strata.errors import StrataError
from strata.tokenizer import SPLIT_PATTERNS, Tokenizer
from strata.tokenizer_train import train_small_bpe, write_tokenizer_metadata

TEXTS = [
    "Hello, world! It's a test; we'll see.",
    "def f(x):\n    return x  *  2\n\n\n\tif x:\t\tpass   \n",
    "Numbers: 1234567, 3.14159, -42, 2024-06-15, $19.99, 1e-6",
    "Ça va très bien, élève naïve, où est le cœur ?",
    "Größe, Übung, Straße: schön müde Äpfel",
    "模型文件被映射到内存中，专家权重按需流式传输。",
    "日本語のテキスト：こんにちは、コンピューター。",
    "Привет, как дела? Москва — большая.",
    "مرحبا بالعالم، هذا نص قصير.",
    "Emoji: 🙂🚀✨ 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧 combining: e\u0301 a\u0308",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|><|endoftext|>",
    "   leading spaces, trailing spaces   \n\n\r\n  \t mixed\u00a0nbsp",
    "",
]
WHOLE_TEXT = "\n".join(TEXTS)

# A Qwen-like template written for this test: it uses what real Qwen templates use.
TEST_TEMPLATE = r"""{{- bos_token -}}
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{ messages[0].content + '\n\n' }}{% endif %}
{{- '# Tools\n' }}
{%- for tool in tools %}
{{- tool | tojson(indent=2) + '\n' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' %}{% continue %}{% endif %}
{%- if message.role not in ['user', 'assistant'] %}{{ raise_exception('unknown role ' + message.role) }}{% endif %}
{{- '<|im_start|>' + message.role + '\n' + message.content | trim }}
{%- if loop.index0 == ns.last_user %}{{ ' (' + (strftime_now('%Y') | length) | string + ' digits)' }}{% endif %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}
{%- endif %}
"""

CONVERSATION = [
    {"role": "system", "content": "You are terse. <b>&'quotes'</b>"},
    {"role": "user", "content": "  Combien font 2+2 ? 中文 🙂  "},
    {"role": "assistant", "content": "4"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds <a> & 'b'", "parameters": {"a": "int"}}}]


def write_gguf(path: Path, architecture: str, metadata: dict) -> None:
    """The least a GGUF needs for transformers to read its config and tokenizer."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    write_tokenizer_metadata(writer, metadata)
    writer.add_tensor("token_embd.weight", np.zeros((len(metadata["tokenizer.ggml.tokens"]), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def metadata():
    return train_small_bpe(512)


def load_both(directory: Path, architecture: str, metadata: dict):
    from transformers import AutoTokenizer

    name = f"{architecture}-{metadata['tokenizer.ggml.pre']}.gguf"
    write_gguf(directory / name, architecture, metadata)
    theirs = AutoTokenizer.from_pretrained(str(directory), gguf_file=name)
    return Tokenizer.from_gguf_metadata(metadata, name), theirs


# transformers picks the tokenizer class by architecture; these pairs give it the split named by `pre`.
@pytest.mark.parametrize(
    "architecture,pre",
    [("qwen2", "qwen2"), ("qwen2", "qwen35"), ("llama", "llama-bpe"), ("gpt2", "gpt-2"), ("qwen2", "default")],
)
def test_encode_decode_match_transformers(tmp_path, metadata, architecture, pre):
    ours, theirs = load_both(tmp_path, architecture, {**metadata, "tokenizer.ggml.pre": pre})
    for text in [*TEXTS, WHOLE_TEXT]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text, add_special_tokens=True), text
        assert ours.decode(ids) == theirs.decode(ids) == text
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)


def test_user_defined_tokens_match_transformers(tmp_path, metadata):
    with_think = {
        **metadata,
        "tokenizer.ggml.tokens": [*metadata["tokenizer.ggml.tokens"], "<think>", "</think>"],
        "tokenizer.ggml.token_type": [*metadata["tokenizer.ggml.token_type"], 4, 4],
    }
    ours, theirs = load_both(tmp_path, "qwen2", with_think)
    text = "<|im_start|>assistant\n<think>\nhmm</think>\n\nYes.<|im_end|>"
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.token_to_id("<think>") in ids and ours.token_to_id("</think>") in ids
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhmm</think>\n\nYes."


def test_special_tokens_are_single_ids(metadata):
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    im_start, im_end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.encode("<|im_start|>user<|im_end|>")[0] == im_start
    assert tokenizer.encode("<|im_start|>user<|im_end|>")[-1] == im_end
    assert tokenizer.id_to_token(im_end) == "<|im_end|>"
    assert tokenizer.decode(tokenizer.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True) == "hi"


def test_split_patterns_cut_where_expected():
    from tokenizers import Regex, pre_tokenizers

    def split(pre, text):
        splitter = pre_tokenizers.Split(Regex(SPLIT_PATTERNS[pre]), behavior="isolated")
        return [piece for piece, _ in splitter.pre_tokenize_str(text)]

    assert split("qwen2", "x 1234567") == ["x", " ", "1", "2", "3", "4", "5", "6", "7"]
    assert split("llama-bpe", "x 1234567") == ["x", " ", "123", "456", "7"]
    assert split("gpt-2", "x 1234567") == ["x", " 1234567"]
    assert split("qwen2", "I'M here\n\n  ok") == ["I", "'M", " here", "\n\n", " ", " ok"]
    assert split("qwen35", "e\u0301t\u00e9") == ["e\u0301t\u00e9"]
    assert split("qwen2", "e\u0301t\u00e9") == ["e", "\u0301t\u00e9"]


def test_eos_and_bos(metadata):
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    endoftext, im_end = tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.eos_token_ids == {endoftext, im_end}
    assert tokenizer.bos_token_id == endoftext
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi")
    with_bos = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.add_bos_token": True})
    assert with_bos.encode("hi", add_special_tokens=True) == [endoftext, *tokenizer.encode("hi")]


def test_eot_joins_stop_ids(metadata):
    tokenizer = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.eot_token_id": 300})
    assert 300 in tokenizer.eos_token_ids


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_chat_template_matches_transformers(tmp_path, metadata, tools):
    ours, theirs = load_both(tmp_path, "qwen2", {**metadata, "tokenizer.chat_template": TEST_TEMPLATE})
    for kwargs in ({}, {"enable_thinking": False}):
        expected = theirs.apply_chat_template(
            CONVERSATION, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs
        )
        assert ours.apply_chat_template(CONVERSATION, tools=tools, **kwargs) == expected
    assert "<|endoftext|>" in expected and "&'quotes'" in expected and "enable_thinking" not in expected


def test_generation_tag_renders_its_body(tmp_path, metadata):
    template = (
        "{% for m in messages %}{{ m.role }}:{% if m.role == 'assistant' %}{% generation %}"
        "{% set reply = m.content | upper %}{{ reply }}{% endgeneration %}{% else %}{{ m.content }}{% endif %};"
        "{% endfor %}"
    )
    ours, theirs = load_both(tmp_path, "qwen2", {**metadata, "tokenizer.chat_template": template})
    expected = theirs.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CONVERSATION) == expected
    assert expected.endswith("assistant:4;")


def test_default_chatml_template_matches_transformers(tmp_path, metadata):
    ours, theirs = load_both(tmp_path, "qwen2", metadata)
    for tools in (None, TOOLS):
        expected = theirs.apply_chat_template(CONVERSATION, tools=tools, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(CONVERSATION, tools=tools) == expected
    assert ours.apply_chat_template(CONVERSATION[1:2], add_generation_prompt=False) == (
        "<|im_start|>user\n  Combien font 2+2 ? 中文 🙂  <|im_end|>\n"
    )


def test_missing_template_falls_back_to_chatml(metadata):
    without = {key: value for key, value in metadata.items() if key != "tokenizer.chat_template"}
    rendered = Tokenizer.from_gguf_metadata(without).apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_exception_is_strata_error(metadata):
    tokenizer = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.chat_template": TEST_TEMPLATE})
    with pytest.raises(StrataError, match="unknown role robot"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "beep"}])


def test_stream_decoder_equals_whole_decode(metadata):
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    ids = tokenizer.encode(WHOLE_TEXT)
    # The small vocabulary has few multi-byte tokens, so many characters arrive split across byte tokens.
    assert any(b >= 0x80 and len(tokenizer.token_bytes(i)) == 1 for i in ids for b in tokenizer.token_bytes(i))
    rng = random.Random(0)
    noise = [rng.randrange(tokenizer.vocab_size) for _ in range(2000)]  # stray continuation bytes, cut characters
    for sequence in (ids, noise, ids[:-1]):
        for skip in (False, True):
            stream = tokenizer.stream_decoder(skip_special_tokens=skip)
            pieces = [stream.push(i) for i in sequence]
            assert "".join(pieces) + stream.finish() == tokenizer.decode(sequence, skip_special_tokens=skip)
    # Pieces never end inside a character: a cut emoji comes out whole, once its last byte has arrived.
    emoji_ids = tokenizer.encode("🚀")
    assert len(emoji_ids) > 1
    stream = tokenizer.stream_decoder()
    assert [stream.push(i) for i in emoji_ids] == [""] * (len(emoji_ids) - 1) + ["🚀"]


def without(metadata: dict, key: str) -> dict:
    return {k: v for k, v in metadata.items() if k != key}


@pytest.mark.parametrize(
    "change,field",
    [
        (lambda m: without(m, "tokenizer.ggml.model"), "tokenizer.ggml.model"),
        (lambda m: {**m, "tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model"),
        (lambda m: {**m, "tokenizer.ggml.pre": "mystery"}, "tokenizer.ggml.pre"),
        (lambda m: without(m, "tokenizer.ggml.tokens"), "tokenizer.ggml.tokens"),
        (lambda m: {**m, "tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens"),
        (lambda m: {**m, "tokenizer.ggml.tokens": [*m["tokenizer.ggml.tokens"][:-1], 7]}, "tokenizer.ggml.tokens"),
        (lambda m: {**m, "tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type"),
        (lambda m: without(m, "tokenizer.ggml.merges"), "tokenizer.ggml.merges"),
        (lambda m: {**m, "tokenizer.ggml.merges": ["Ġt"]}, "tokenizer.ggml.merges"),
        (lambda m: {**m, "tokenizer.ggml.merges": ["Ġ zzz"]}, "tokenizer.ggml.merges"),
        # a merge whose result is not a token: a panic in the Rust BPE (a BaseException), not a plain Exception
        (lambda m: {**m, "tokenizer.ggml.tokens": ["a", "b", "c", "d"], "tokenizer.ggml.token_type": [1] * 4,
                    "tokenizer.ggml.merges": ["a b"]}, "tokenizer.ggml.merges"),
        (lambda m: {**m, "tokenizer.ggml.eos_token_id": 10**6}, "tokenizer.ggml.eos_token_id"),
        (lambda m: {**m, "tokenizer.ggml.bos_token_id": "1"}, "tokenizer.ggml.bos_token_id"),
        (lambda m: {**m, "tokenizer.ggml.add_bos_token": 1}, "tokenizer.ggml.add_bos_token"),
        (lambda m: {**m, "tokenizer.chat_template": "{% for %}"}, "tokenizer.chat_template"),
    ],
)
def test_bad_metadata_names_file_and_field(metadata, change, field):
    with pytest.raises(StrataError) as error:
        Tokenizer.from_gguf_metadata(change(metadata), source="tiny.gguf")
    message = str(error.value)
    assert "tiny.gguf" in message and field in message and "\n" not in message


def test_out_of_range_id_is_strata_error(metadata):
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    with pytest.raises(StrataError, match="outside the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size])
