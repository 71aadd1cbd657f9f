"""The <think> splitter: the same parts whatever the stream's chunk boundaries; the three ways a template thinks."""

from __future__ import annotations

import pytest

from strata.serve.reasoning import ReasoningSplitter, prompt_opens_thinking, split_reasoning, template_thinks

CASES = [
    # (reply, the prompt opened the section, reasoning, answer)
    ("<think>\nLet me see.\nYes.\n</think>\n\nParis.", False, "Let me see.\nYes.", "Paris."),
    ("  <think>a</think>b", False, "a", "b"),
    ("Let me see.\n</think>\n\nParis.", True, "Let me see.", "Paris."),  # the template opened it
    ("Paris.", False, "", "Paris."),  # thinking off: the template wrote an empty section
    ("<think>\nStill thinking when max_tokens came\n\n", False, "Still thinking when max_tokens came", ""),
    ("<thinking> is not the tag", False, "", "<thinking> is not the tag"),
    ("<thi", False, "", "<thi"),
    ("\n\nAnswer after blank lines", False, "", "\n\nAnswer after blank lines"),
    ("<think></think>Answer", False, "", "Answer"),
    ("<think>a < b and </ thing</think> ok", False, "a < b and </ thing", "ok"),
]


@pytest.mark.parametrize("reply, inside, reasoning, answer", CASES)
def test_every_chunking_gives_the_same_parts(reply, inside, reasoning, answer):
    assert split_reasoning(reply, ReasoningSplitter(inside)) == (reasoning, answer)
    for cut in range(len(reply) + 1):
        for second_cut in range(cut, len(reply) + 1, 3):
            splitter = ReasoningSplitter(inside)
            parts = [splitter.feed(p) for p in (reply[:cut], reply[cut:second_cut], reply[second_cut:])]
            parts.append(splitter.finish())
            assert ("".join(r for r, _ in parts), "".join(a for _, a in parts)) == (reasoning, answer), (cut,
                                                                                                       second_cut)


def test_text_is_handed_on_as_soon_as_it_is_known():
    splitter = ReasoningSplitter()
    assert splitter.feed("<think>\nOne") == ("One", "")
    assert splitter.feed(" two\n") == (" two", "")  # the newline waits: it may be the one before </think>
    assert splitter.feed("three</") == ("\nthree", "")
    assert splitter.feed("think>\n\nAn") == ("", "An")
    assert splitter.feed("swer") == ("", "swer")
    assert split_reasoning("<think>x</think>y", None) == ("", "<think>x</think>y")  # no splitter: all answer


def test_prompt_and_template_detection(tiny_llm):
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")

    class Tokenizer:
        def __init__(self, render):
            self.apply_chat_template = render

    assert template_thinks(Tokenizer(lambda m, add_generation_prompt, **o: "<think>\n\n</think>"
                                     if o.get("enable_thinking") is False else ""))
    assert template_thinks(Tokenizer(lambda m, add_generation_prompt, **o: "assistant\n<think>\n"))
    assert not template_thinks(tiny_llm.tokenizer)  # the plain ChatML template never thinks
