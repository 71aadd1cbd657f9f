"""strata.tokenizer_train: the small BPE tokenizer of synthetic models, and its GGUF keys."""

import gguf
import pytest

from strata.errors import StrataError
from strata.tokenizer import TOKEN_TYPE_CONTROL, Tokenizer, byte_to_char
from strata.tokenizer_train import train_small_bpe, write_tokenizer_metadata


def test_same_result_every_call():
    first = train_small_bpe(512)
    assert train_small_bpe(512) == first


@pytest.mark.parametrize("vocab_size", [259, 300, 512, 2048])
def test_vocabulary_layout(vocab_size):
    metadata = train_small_bpe(vocab_size)
    tokens, types, merges = (metadata[f"tokenizer.ggml.{name}"] for name in ("tokens", "token_type", "merges"))
    assert len(tokens) == len(types) == len(set(tokens)) == vocab_size
    assert tokens[:256] == list(byte_to_char().values())
    assert tokens[256 : 256 + len(merges)] == [merge.replace(" ", "") for merge in merges]
    assert all(len(merge.split(" ")) == 2 for merge in merges)
    specials = tokens[256 + len(merges) :]
    assert specials[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(token.startswith("<|reserved_") for token in specials[3:])
    assert types == [1] * (256 + len(merges)) + [TOKEN_TYPE_CONTROL] * len(specials)
    assert metadata["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>")
    endoftext = tokens.index("<|endoftext|>")
    assert metadata["tokenizer.ggml.bos_token_id"] == metadata["tokenizer.ggml.padding_token_id"] == endoftext
    assert metadata["tokenizer.ggml.add_bos_token"] is False
    assert (metadata["tokenizer.ggml.model"], metadata["tokenizer.ggml.pre"]) == ("gpt2", "qwen2")


def test_too_small_vocabulary_is_strata_error():
    with pytest.raises(StrataError, match="vocab_size 100"):
        train_small_bpe(100)


def test_every_text_encodes_and_merges_help():
    tokenizer = Tokenizer.from_gguf_metadata(train_small_bpe(512))
    for text in ("the engine reads the model", "\x00\x01\x7f bytes never seen", "ᚠᛇᚻ runes, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦀"):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode("the engine reads the model")) < len("the engine reads the model") / 2


def test_written_keys_read_back_with_llama_cpp_types(tmp_path):
    metadata = train_small_bpe(512)
    writer = gguf.GGUFWriter(str(tmp_path / "tok.gguf"), "qwen2")
    write_tokenizer_metadata(writer, metadata)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    fields = gguf.GGUFReader(tmp_path / "tok.gguf").fields
    value = gguf.GGUFValueType
    expected_types = {
        "tokenizer.ggml.model": [value.STRING],
        "tokenizer.ggml.tokens": [value.ARRAY, value.STRING],
        "tokenizer.ggml.token_type": [value.ARRAY, value.INT32],
        "tokenizer.ggml.merges": [value.ARRAY, value.STRING],
        "tokenizer.ggml.eos_token_id": [value.UINT32],
        "tokenizer.ggml.add_bos_token": [value.BOOL],
        "tokenizer.chat_template": [value.STRING],
    }
    for key, types in expected_types.items():
        assert fields[key].types == types, key
    read_back = {key: fields[key].contents() for key in metadata}
    assert read_back == metadata
    text = "Größe 中文 <|im_end|>"
    assert Tokenizer.from_gguf_metadata(read_back).encode(text) == Tokenizer.from_gguf_metadata(metadata).encode(text)


def test_unknown_key_is_refused(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "qwen2")
    with pytest.raises(ValueError, match="tokenizer.ggml.mystery"):
        write_tokenizer_metadata(writer, {"tokenizer.ggml.mystery": 1})
