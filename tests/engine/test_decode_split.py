"""Captured decode across cards (engine/decode_split.py) in its CPU form: CPU "devices" stand in for the cards, each
stage runs the very segment functions its CUDA graphs would hold, and the logits and greedy tokens are one card's."""

from __future__ import annotations

import pytest
import torch

from strata.engine.decode_split import SplitGraphDecoder
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams

PROMPT = list(range(5, 17))
STEPS = 5
BOUND = 1e-4  # of the largest logit: a split moves the residual, it computes nothing differently (in practice 0)


@pytest.fixture(scope="module")
def six_layers(model_dir):
    """qwen3next's layer 3 is its attention layer: with 2,4 it sits on card 1, recurrent layers on both cards."""
    from strata.models.synthetic import make_model

    return {arch: make_model(model_dir / f"six-{arch}.gguf", arch=arch, preset="tiny", quant="Q8_0", n_layers=6)
            for arch in ("qwen3moe", "qwen3next")}


def decode_run(engine: Engine, steps: int = STEPS, tokens: list[int] | None = None):
    """(greedy tokens, each decode step's logits) after PROMPT; `tokens` feeds these instead (teacher-forced)."""
    logits = engine.prefill(PROMPT)
    history, chosen, out = list(PROMPT), [], []
    for i in range(steps):
        token = int(logits[-1].argmax()) if tokens is None else tokens[i]
        chosen.append(token)
        history.append(token)
        logits = engine.decode(token, len(history) - 1)
        out.append(logits.clone())  # a static buffer: copied before the next step
    return chosen, out


def worst_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
@pytest.mark.parametrize("placement", [dict(), dict(expert_cache=12)], ids=["resident", "cached"])
def test_static_split_step_gives_the_one_card_logits_and_tokens(six_layers, arch, placement):
    path = six_layers[arch]
    want_tokens, want = decode_run(Engine(path, EngineConfig(device="cpu", **placement)))
    engine = Engine(path, EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="2,4", decode_graphs="eager",
                                       **placement))
    decoder = engine.decoder
    assert isinstance(decoder, SplitGraphDecoder) and not decoder.capture and decoder.n_stages == 2
    sends = engine.pipeline.transport.sends
    tokens, got = decode_run(engine)
    assert tokens == want_tokens
    assert worst_error(got, want) <= BOUND
    assert decoder.steps == STEPS
    assert engine.pipeline.transport.sends - sends == 1 + STEPS  # the prompt, then the packed residual once a step
    if not placement:  # the same kernels on the same rows: not one bit differs
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        return
    # Experts behind each card's cache: the doorbell segments of each card's own MoE layers ran, and they did what
    # the split's step-by-step decode does (the same lookups, the same pool work, the same bytes out).
    assert [s.cached is not None for s in decoder.stages] == [True, True]
    program = decoder.stages[1].program(PROMPT[-1] + 8)
    assert program.routed == [2, 3, 4, 5] and len(program.segments) == 1 + 2 * 4
    stepwise = Engine(path, EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="2,4", decode_graphs="off",
                                         **placement))
    assert stepwise.decoder is None
    _, plain = decode_run(stepwise)
    assert all(a.numpy().tobytes() == b.numpy().tobytes() for a, b in zip(got, plain))
    for mine, theirs in zip(engine.model.experts.backends, stepwise.model.experts.backends):
        assert mine.cache.stats.misses == theirs.cache.stats.misses
    assert sum(b.cache.stats.misses for b in engine.model.experts.backends) > 0
    assert engine.model.experts.backends[0].pool.stats.experts == stepwise.model.experts.backends[0].pool.stats.experts


def test_three_cards_with_the_graphs_span_mask_the_cells_past_the_position(six_layers):
    """What the graphs run: each card attends over a power-of-two span, the cells past the position masked; the
    first card holds only recurrent layers, the second the attention layer, the third the head."""
    path = six_layers["qwen3next"]
    options = dict(device="cpu", n_ctx=512, expert_cache=30)
    want_tokens, want = decode_run(Engine(path, EngineConfig(**options)))
    engine = Engine(path, EngineConfig(gpus="cpu,cpu,cpu", layer_split="2,2,2", **options))
    engine.decoder = SplitGraphDecoder(engine.model, engine.kv, engine.pipeline, capture=False, exact_span=False)
    tokens, got = decode_run(engine, tokens=want_tokens)
    assert tokens == want_tokens
    assert worst_error(got, want) <= BOUND  # float32 sums over more (masked) cells: rounding, not a difference
    assert [list(s.layers) for s in engine.decoder.stages] == [[0, 1], [2, 3], [4, 5]]
    assert [s.inbox is None for s in engine.decoder.stages] == [True, False, False]
    assert [s.outbox is None for s in engine.decoder.stages] == [False, False, True]


def test_verify_windows_stay_uncaptured_across_cards(six_layers):
    """--spec on a split: plain decode steps run the static stages, verify windows the pipeline's eager forward;
    the greedy tokens are one card's."""
    path = six_layers["qwen3moe"]
    prompt = PROMPT + PROMPT  # a repeat: prompt lookup drafts
    plain = list(Engine(path, EngineConfig(device="cpu")).generate(prompt, SamplingParams(temperature=0), 8))
    engine = Engine(path, EngineConfig(device="cpu", gpus="cpu,cpu", decode_graphs="eager", spec=3))
    assert isinstance(engine.decoder, SplitGraphDecoder) and engine.spec.windows is None
    assert list(engine.generate(prompt, SamplingParams(temperature=0), 8)) == plain
    assert engine.spec.stats.windows > 0


def test_a_split_without_a_static_form_decodes_step_by_step_and_says_why(six_layers, capsys):
    engine = Engine(six_layers["qwen3moe"], EngineConfig(device="cpu", gpus="cpu,cpu", decode_graphs="eager",
                                                         expert_cache=12, pcie_frac=0.5))
    assert engine.decoder is None
    err = capsys.readouterr().err
    assert "decode graphs off for the split" in err and "pcie_frac" in err and len(err.strip().splitlines()) == 1


def test_misses_read_by_each_card_itself_run_as_one_segment_per_card(six_layers):
    """`--misses direct`: no host between layers, so each card's program is one segment, as resident."""
    path, placement = six_layers["qwen3moe"], dict(expert_cache=12, misses="direct")
    want_tokens, want = decode_run(Engine(path, EngineConfig(device="cpu", **placement)), steps=3)
    engine = Engine(path, EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="2,4", decode_graphs="eager",
                                       **placement))
    assert [s.cached for s in engine.decoder.stages] == [None, None]
    tokens, got = decode_run(engine, steps=3)
    assert tokens == want_tokens and worst_error(got, want) <= BOUND
