"""Text generation on a tiny synthetic model: determinism, streaming, stop strings, limits, prefix reuse."""

import re

import pytest
import torch

import strata
from strata.engine.generation import held_back
from strata.errors import StrataError

PROMPT = "The quick brown fox"


def test_held_back_keeps_only_a_possible_stop_prefix():
    assert held_back("hello wor", ["world"]) == 3
    assert held_back("hello", ["xyz"]) == 0
    assert held_back("ab", ["abc", "b!"]) == 2


def test_fixed_seed_is_deterministic_run_to_run(tiny_llm):
    a = tiny_llm.generate(PROMPT, max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, seed=11)
    b = tiny_llm.generate(PROMPT, max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, seed=11)
    c = tiny_llm.generate(PROMPT, max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, seed=12)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.token_ids != c.token_ids


def test_stream_pieces_join_to_the_whole_text(tiny_llm):
    whole = tiny_llm.generate(PROMPT, max_tokens=24, seed=3)
    chunks = list(tiny_llm.generate(PROMPT, max_tokens=24, seed=3, stream=True))
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert chunks[-1].finish_reason == whole.finish_reason and all(c.finish_reason is None for c in chunks[:-1])
    assert whole.text == tiny_llm.detokenize(whole.token_ids, skip_special_tokens=True)


def test_max_tokens_ends_with_length(tiny_llm):
    out = tiny_llm.generate(PROMPT, max_tokens=5, temperature=0, stop=[])
    if out.finish_reason == "length":
        assert len(out.token_ids) == 5
    else:  # the model chose an end-of-text id first
        assert len(out.token_ids) < 5
    assert out.stats.completion_tokens <= 5 and out.stats.prompt_tokens == len(tiny_llm.tokenize(PROMPT))


def test_stop_string_cuts_the_text_before_it(tiny_llm):
    free = tiny_llm.generate(PROMPT, max_tokens=40, temperature=0).text
    if len(free) < 12:
        pytest.skip("the synthetic model ended too early to pick a stop string")
    stop = free[8:11]
    cut = tiny_llm.generate(PROMPT, max_tokens=40, temperature=0, stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == free[: free.index(stop)]
    streamed = "".join(c.text for c in tiny_llm.generate(PROMPT, max_tokens=40, temperature=0, stop=[stop], stream=True))
    assert streamed == cut.text
    assert tiny_llm.generate(PROMPT, max_tokens=40, temperature=0, stop=stop).text == cut.text  # one string: one stop
    # (a string is one stop string, not one per character: the first character alone would cut at once)
    whole = tiny_llm.generate(PROMPT, max_tokens=40, temperature=0, stop=free[0] + "\x00")
    assert whole.text == free and whole.finish_reason == "length"


def test_prefix_reuse_gives_the_same_logits_as_a_fresh_run(tiny_moe):
    llm = strata.LLM(tiny_moe, device="cpu", kv_dtype="float32")  # so only the reuse logic can differ
    ids = llm.tokenize("one two three four five six seven eight nine ten")
    fresh = llm.logits(ids)[-1]
    llm.engine.prefill(ids[:6])
    assert llm.engine.cached_tokens == ids[:6]
    reused = llm.engine.prefill(ids)[-1]
    assert torch.allclose(reused, fresh, atol=1e-5)


def test_chunked_prompt_equals_one_chunk(tiny_moe, tiny_llm):
    ids = tiny_llm.tokenize("a prompt long enough to be read in several small chunks of tokens, one after the other")
    chunked = strata.LLM(tiny_moe, device="cpu", prefill_chunk=5, kv_dtype="float32")
    assert torch.allclose(chunked.logits(ids), tiny_llm.logits(ids), atol=1e-5)


def test_prompt_longer_than_the_context_is_refused(tiny_moe):
    llm = strata.LLM(tiny_moe, device="cpu", n_ctx=8)
    with pytest.raises(StrataError, match="prompt of \\d+ tokens is longer than the context of 8"):
        llm.generate("this prompt has clearly more than eight tokens in it, surely", max_tokens=4)


def test_chat_uses_the_template(tiny_llm):
    text = tiny_llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    a = tiny_llm.chat([{"role": "user", "content": "hi"}], max_tokens=8, temperature=0)
    b = tiny_llm.generate(tiny_llm.tokenize(text), max_tokens=8, temperature=0)
    assert a.token_ids == b.token_ids


def test_unknown_options_are_refused(tiny_moe, tiny_llm):
    with pytest.raises(StrataError, match="unknown engine option"):
        strata.LLM(tiny_moe, devise="cpu")
    with pytest.raises(StrataError, match="unknown sampling option"):
        tiny_llm.generate("x", temprature=0)
    # options of the wrong kind, by name (they failed deep in loading with a TypeError or ValueError)
    for option, says in [(dict(n_ctx="big"), "n_ctx must be a whole number or None, got 'big'"),
                         (dict(n_ctx=1.5), "n_ctx must be a whole number or None"),
                         (dict(vram_budget="12"), "vram_budget must be a number or None"),
                         (dict(cpu_threads=None), "cpu_threads must be a whole number, got None"),
                         (dict(cpu_threads=-2), "cpu_threads must be >= 0, got -2"),
                         (dict(cpu_spin_us=-5.0), "cpu_spin_us must be >= 0, got -5.0"),
                         (dict(cpu_spin_us=float("nan")), "cpu_spin_us must be >= 0, got nan"),
                         (dict(checkpoints=-1), "checkpoints must be >= 0, got -1"),
                         (dict(expert_cache="lots"), "expert_cache must be 'auto' or a number of experts")]:
        with pytest.raises(StrataError, match=re.escape(says)):
            strata.LLM(tiny_moe, device="cpu", **option)


@pytest.mark.parametrize("call, says", [(dict(prompt=None), "prompt must be text or a list of token ids, not NoneType"),
                                        (dict(prompt=b"hi"), "prompt must be text or a list of token ids, not bytes"),
                                        (dict(max_tokens="3"), "max_tokens must be a whole number of at least 1"),
                                        (dict(stop=5), "stop must be a string or a list of strings, got 5"),
                                        (dict(logprobs="2"), "logprobs must be a whole number between 0 and 256")])
def test_arguments_of_the_wrong_kind_are_refused_in_one_line(tiny_llm, call, says):
    with pytest.raises(StrataError, match=re.escape(says)):
        tiny_llm.generate(**{"prompt": "hi", "max_tokens": 1, **call})
    with pytest.raises(StrataError, match="messages must be a list of"):
        tiny_llm.chat("hi", max_tokens=1)


@pytest.mark.parametrize("prompt, says", [([600, 3], "prompt token 0 is 600, outside the vocabulary's ids 0..511"),
                                          ([3, -1], "prompt token 1 is -1, outside"),
                                          ([3, 4, 2.5], "prompt token 2 is 2.5, not a token id"),
                                          ([True], "prompt token 0 is True, not a token id")])
def test_token_ids_outside_the_vocabulary_are_refused_in_one_line(tiny_llm, prompt, says):
    # (the embedding would read a negative id from the end and fail on the others with a bare IndexError)
    with pytest.raises(StrataError, match=re.escape(says)):
        tiny_llm.generate(prompt, max_tokens=1)
    with pytest.raises(StrataError, match=re.escape(says)):
        tiny_llm.logits(prompt)
    assert tiny_llm.generate([3, torch.tensor(4), 5], max_tokens=1).token_ids  # integer scalars of any kind pass
