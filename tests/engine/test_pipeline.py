"""A model split over several "cards" (CPU devices standing in for GPUs) gives the one-card tokens and logits."""

from __future__ import annotations

import pytest
import torch

from strata.engine.engine import Engine, EngineConfig
from strata.engine.pipeline import wavefront
from strata.engine.sampling import SamplingParams
from strata.engine.split_cache import SplitKV
from strata.engine.transport import InProcessTransport

PROMPT = list(range(5, 60))  # 55 tokens: four chunks of up to 16
GEN = 6  # greedy tokens compared
BOUND = 1e-4  # relative to the largest logit: a split moves activations, it computes nothing differently


@pytest.fixture(scope="module")
def six_layers(model_dir):
    """Six-layer tiny models: enough layers to split in several places (qwen3next: layers 3 is attention)."""
    from strata.models.synthetic import make_model

    return {arch: make_model(model_dir / f"six-{arch}.gguf", arch=arch, preset="tiny", quant="Q8_0", n_layers=6)
            for arch in ("qwen3moe", "qwen3next")}


@pytest.fixture(scope="module")
def one_card(six_layers):
    """Per architecture: the one-device logits of PROMPT and the greedy tokens after its first 10 tokens."""
    out = {}
    for arch, path in six_layers.items():
        engine = Engine(path, EngineConfig(device="cpu", prefill_chunk=16))
        out[arch] = (engine.logits(PROMPT), list(engine.generate(PROMPT[:10], SamplingParams(temperature=0), GEN)))
    return out


def test_wavefront_starts_the_next_chunk_while_the_later_stage_runs_this_one():
    assert wavefront(3, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    order = wavefront(5, 3)
    assert sorted(order) == [(s, c) for s in range(3) for c in range(5)]
    for stage, chunk in order:  # each step's inputs were issued before it: the chunk on the stage before, the
        at = order.index((stage, chunk))  # chunk before on this stage
        assert stage == 0 or order.index((stage - 1, chunk)) < at
        assert chunk == 0 or order.index((stage, chunk - 1)) < at
    assert order.index((0, 2)) == order.index((2, 0)) + 2  # tick 2: stage 2 runs chunk 0, stage 1 chunk 1, stage 0 chunk 2


@pytest.mark.parametrize("arch,gpus,split", [
    ("qwen3moe", "cpu,cpu", "1,5"),
    ("qwen3moe", "cpu,cpu,cpu", "2,1,3"),
    ("qwen3next", "cpu,cpu", "4,2"),  # the attention layer 3 on card 0, recurrent layers on both
    ("qwen3next", "cpu,cpu,cpu", "2,2,2"),
])
def test_split_gives_the_one_card_logits_and_greedy_tokens(six_layers, one_card, arch, gpus, split):
    engine = Engine(six_layers[arch], EngineConfig(device="cpu", prefill_chunk=16, gpus=gpus, layer_split=split))
    want_logits, want_tokens = one_card[arch]
    got = engine.logits(PROMPT)
    assert got.shape == want_logits.shape
    assert (got - want_logits).abs().max() <= BOUND * want_logits.abs().max()
    n_stages = len(gpus.split(","))
    assert engine.pipeline.order == wavefront(4, n_stages)  # the prompt went through as a pipeline of 4 chunks
    sends = engine.pipeline.transport.sends
    assert sends == 4 * (n_stages - 1)  # the residual crossed each boundary once per chunk
    assert list(engine.generate(PROMPT[:10], SamplingParams(temperature=0), GEN)) == want_tokens
    # The prompt (one chunk), then once per decode step (the generator decodes after each of its tokens).
    assert engine.pipeline.transport.sends - sends == (1 + GEN) * (n_stages - 1)


def test_each_card_keeps_its_own_layers_cache_and_expert_cache(six_layers, one_card):
    engine = Engine(six_layers["qwen3moe"], EngineConfig(device="cpu", prefill_chunk=16, gpus="cpu,cpu",
                                                         layer_split="2,4", expert_cache=12))
    assert isinstance(engine.kv, SplitKV) and [b.n_layers for b in engine.kv.backends] == [2, 4]
    cards = engine.plan.cards
    assert [c.n_slots for c in cards] == [4, 8]  # 12 slots shared by the cards' 16 and 32 experts
    caches = [b.cache for b in engine.model.experts.backends]
    assert engine.model.experts.backends[0].pool is engine.model.experts.backends[1].pool  # one pool, both cards' layers
    assert [c.n_slots for c in caches] == [4, 8]
    assert {layer for layer, _ in caches[0].slot_of} <= {0, 1} and {layer for layer, _ in caches[1].slot_of} <= {2, 3, 4, 5}
    want_logits, want_tokens = one_card["qwen3moe"]
    got = engine.logits(PROMPT)  # misses run on each card's CPU pool (int16 activations, ~2e-5)
    assert (got - want_logits).abs().max() <= BOUND * want_logits.abs().max()
    assert list(engine.generate(PROMPT[:10], SamplingParams(temperature=0), GEN)) == want_tokens


def test_hybrid_split_keeps_each_layers_state_on_its_card(six_layers):
    engine = Engine(six_layers["qwen3next"], EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="2,4"))
    assert [b.n_layers for b in engine.kv.kv.backends] == [1]  # the one attention layer (3) lives on card 1
    assert sorted(engine.kv.conv) == [0, 1, 2, 4, 5]


def test_cpu_transport_copies_to_the_next_stage():
    transport = InProcessTransport((torch.device("cpu"), torch.device("cpu")))
    h = torch.randn(3, 4)
    (moved,) = transport.send(0, (h,))
    assert torch.equal(moved, h) and moved.data_ptr() != h.data_ptr()
    assert transport.sends == 1 and transport.bytes_sent == h.numel() * 4


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_one_thread_per_stage_gives_the_same_logits_in_a_valid_order(six_layers, one_card, arch):
    """The CUDA form (a thread per stage), forced on CPU devices: each stage takes its chunks in order, each chunk
    its stages in order, whatever the interleaving; the logits are the one-card ones."""
    engine = Engine(six_layers[arch], EngineConfig(device="cpu", prefill_chunk=16, gpus="cpu,cpu,cpu",
                                                   layer_split="2,2,2", expert_cache=30))
    engine.pipeline.threads = True
    got = engine.logits(PROMPT)
    want_logits, want_tokens = one_card[arch]
    assert (got - want_logits).abs().max() <= BOUND * want_logits.abs().max()
    order = engine.pipeline.order
    assert sorted(order) == [(s, c) for s in range(3) for c in range(4)]
    for stage in range(3):
        assert [c for s, c in order if s == stage] == [0, 1, 2, 3]
    for stage, chunk in order:
        assert stage == 0 or order.index((stage - 1, chunk)) < order.index((stage, chunk))
    assert list(engine.generate(PROMPT[:10], SamplingParams(temperature=0), GEN)) == want_tokens


def test_an_error_in_a_stage_thread_is_raised_and_the_cache_starts_over(six_layers):
    engine = Engine(six_layers["qwen3next"], EngineConfig(device="cpu", prefill_chunk=16, gpus="cpu,cpu"))
    engine.pipeline.threads = True
    engine.logits(PROMPT)
    calls = []
    real = engine.model.mixer

    def failing_mixer(i, *args):
        calls.append(i)
        if i == 4 and len(calls) > 8:  # stage 1, its second chunk
            raise RuntimeError("card lost")
        return real(i, *args)

    engine.model.mixer = failing_mixer
    with pytest.raises(RuntimeError, match="card lost"):
        engine.prefill(PROMPT)
    assert engine.cached_tokens == [] and engine.kv.length == 0
    engine.model.mixer = real
    assert engine.prefill(PROMPT).shape[-1] == engine.model.config.vocab_size


def test_each_card_fills_its_cache_from_its_layers_share_of_the_routing_profile(six_layers, tmp_path):
    import json

    counts = {str(layer): [0] * 8 for layer in range(6)}
    counts["4"][7], counts["1"][3], counts["5"][2] = 9, 5, 1  # the most routed experts: (4, 7), then (1, 3)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"counts": counts}))
    engine = Engine(six_layers["qwen3moe"], EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="2,4",
                                                         expert_cache=2, expert_profile=str(profile)))
    assert [set(b.cache.slot_of) for b in engine.model.experts.backends] == [{(1, 3)}, {(4, 7)}]


@pytest.fixture(scope="module")
def six_layers_mtp(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "six-qwen3next-mtp.gguf", arch="qwen3next", preset="tiny", quant="Q8_0", n_layers=6,
                      nextn_layers=1)


@pytest.mark.parametrize("spec", [dict(spec=3), dict(spec=3, suffix_draft=2)])
def test_verify_windows_cross_the_cards_and_keep_greedy_tokens(six_layers_mtp, spec):
    """--spec on a split: the MTP block (with the head on the last card) drafts, each verify window goes through
    every stage once, rejected rows roll back on each card: the tokens of plain greedy decoding on one card."""
    prompt = PROMPT[:12] + PROMPT[:12]  # a repeat, so prompt lookup has something to draft from
    plain = list(Engine(six_layers_mtp, EngineConfig(device="cpu")).generate(prompt, SamplingParams(temperature=0), 12))
    engine = Engine(six_layers_mtp, EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="2,4", **spec))
    sends = engine.pipeline.transport.sends
    assert list(engine.generate(prompt, SamplingParams(temperature=0), 12)) == plain
    windows = engine.spec.stats.windows
    assert windows > 0 and engine.pipeline.transport.sends - sends == 1 + windows  # the prompt, then one per window


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_a_split_restores_a_conversation_checkpoint_card_by_card(six_layers, arch):
    """Another conversation takes the cache; the follow-up restores each card's keys (and states) and reads only
    its new tokens: the logits of continuing the live cache, bit for bit."""
    a, b = PROMPT[:20], PROMPT[30:50]
    engine = Engine(six_layers[arch], EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="4,2"))
    engine.prefill(a)
    engine.prefill(b)
    restored = engine.prefill(a + PROMPT[20:26])
    assert engine.checkpoints.stats.restored == 1 and engine.checkpoints.stats.restored_tokens == len(a)
    live = Engine(six_layers[arch], EngineConfig(device="cpu", gpus="cpu,cpu", layer_split="4,2"))
    live.prefill(a)
    assert torch.equal(live.prefill(a + PROMPT[20:26]), restored)


def test_a_progress_hook_that_stops_the_prompt_leaves_a_cache_that_starts_over(six_layers, one_card):
    """A cancelled request: the hook raises after the first chunk while later chunks are already in the first
    stages; the cache forgets the prompt, and the next one reads as on one card."""
    engine = Engine(six_layers["qwen3moe"], EngineConfig(device="cpu", prefill_chunk=16, gpus="cpu,cpu"))
    engine.pipeline.threads = True

    def cancel(progress):
        raise KeyboardInterrupt

    engine.on_prefill_progress = cancel
    with pytest.raises(KeyboardInterrupt):
        engine.prefill(PROMPT)
    assert engine.cached_tokens == []
    engine.on_prefill_progress = None
    want_logits, _ = one_card["qwen3moe"]
    got = engine.logits(PROMPT)
    assert (got - want_logits).abs().max() <= BOUND * want_logits.abs().max()
