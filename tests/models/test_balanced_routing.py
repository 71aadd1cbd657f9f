"""Balanced routing (`bench prompt --routing balanced`): every expert its share of a chunk's tokens."""

import re

import torch

from strata.cli import main
from strata.models.balanced_routing import balanced_routing


def test_every_expert_gets_its_share_and_every_token_distinct_experts():
    weights, ids = balanced_routing(100, 8, 128, layer=3, device=torch.device("cpu"), ids_dtype=torch.int32)
    assert ids.dtype == torch.int32 and ids.shape == (100, 8)
    counts = torch.bincount(ids.view(-1).long(), minlength=128)
    assert counts.min() >= 6 and counts.max() <= 7  # 800 routes over 128 experts
    assert all(len(set(row.tolist())) == 8 for row in ids)
    assert torch.equal(weights, torch.full((100, 8), 0.125))
    _, other = balanced_routing(100, 8, 128, layer=4, device=torch.device("cpu"), ids_dtype=torch.int32)
    assert not torch.equal(ids, other)  # layers start at different experts


def test_bench_prompt_balanced_says_so(tiny_moe, capsys):
    args = ["bench", "prompt", str(tiny_moe), "--device", "cpu", "--ctx", "130", "--prefill", "130"]
    for routing in ("model", "balanced"):
        assert main(args + ["--routing", routing]) in (0, None)
        out = capsys.readouterr().out
        assert ("routing    balanced" in out) == (routing == "balanced") and "ctx     130:" in out, out


def test_balanced_prompt_chunks_route_to_every_expert_and_decode_keeps_the_model(tiny_moe):
    from strata.engine.engine import Engine, EngineConfig

    engine = Engine(tiny_moe, EngineConfig(device="cpu", n_ctx=160, prefill_chunk=130))
    engine.model.balanced_prompt_routing = True
    seen = []
    start = engine.model.experts.start
    engine.model.experts.start = lambda i, x, weights, ids: seen.append((x.shape[0], ids.clone())) or start(
        i, x, weights, ids)
    engine.prefill(list(range(3, 133)))
    c = engine.model.config
    chunk = [ids for n, ids in seen if n == 130]
    assert len(chunk) == sum(engine.model.is_moe(i) for i in range(c.n_layers))
    for ids in chunk:  # every expert its share of the 130 x k routes
        counts = torch.bincount(ids.view(-1).long(), minlength=c.n_experts)
        assert counts.max() - counts.min() <= 1


def test_balanced_routing_leaves_short_chunks_and_decode_steps_to_the_router(tiny_moe):
    from strata.engine.engine import Engine, EngineConfig

    logits = []
    for balanced in (False, True):
        engine = Engine(tiny_moe, EngineConfig(device="cpu", n_ctx=64, prefill_chunk=20))
        engine.model.balanced_prompt_routing = balanced
        logits.append(engine.prefill(list(range(3, 23))))
    assert torch.equal(logits[0], logits[1])  # 20-token chunks (<= 64 rows) keep the model's routing
