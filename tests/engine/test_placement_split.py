"""Planning a layer split: --gpus and --layer-split parsing, the auto split, and one clear line for bad options."""

from __future__ import annotations

import pytest
import torch

from strata.cli import main
from strata.engine.engine import Engine, EngineConfig
from strata.engine.placement import GiB
from strata.engine.placement_split import _auto_bounds, parse_gpus, parse_layer_split, plan_split
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models import config_of

CPU2 = (torch.device("cpu"), torch.device("cpu"))


@pytest.fixture(scope="module")
def six_moe(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "six-qwen3moe-plan.gguf", arch="qwen3moe", preset="tiny", quant="Q8_0", n_layers=6)


def _plan(path, budget=None, split="auto", n_ctx=65536, expert_cache="auto"):
    model = GGUFModelFile(path)
    return plan_split(model, config_of(model), CPU2, n_ctx, 2, budget, split, expert_cache)


def test_gpus_and_layer_split_parse():
    assert parse_gpus("cpu,cpu") == CPU2
    assert parse_layer_split("auto") == "auto" and parse_layer_split("24,24") == (24, 24)
    for bad in ("0", "cpu,", "cpu,mps", "cpu,cuda:0" if torch.cuda.is_available() else "cpu,x"):
        with pytest.raises(StrataError, match="--gpus"):
            parse_gpus(bad)
    for bad in ("24,0", "a,b", "24;24"):
        with pytest.raises(StrataError, match="--layer-split"):
            parse_layer_split(bad)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() > 7, reason="GPU 7 exists here")
def test_an_unknown_gpu_index_is_one_line(capsys, six_moe):
    assert main(["run", str(six_moe), "--gpus", "0,7", "-p", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("strata: error: --gpus: GPU") and "does not exist" in err and "\n" not in err


def test_layer_counts_must_sum_to_the_layers(capsys, six_moe):
    assert main(["run", str(six_moe), "--gpus", "cpu,cpu", "--layer-split", "2,5", "-p", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "summing to the model's 6 layers" in err and "\n" not in err
    with pytest.raises(StrataError, match="one per card"):
        _plan(six_moe, split=(2, 2, 2))


def test_auto_split_follows_the_budget_and_a_card_that_cannot_hold_its_layers_is_refused(six_moe):
    one = _plan(six_moe, split=(1, 5))
    per_layer = one.cards[0].kv_bytes  # 64 Ki tokens of float16 KV: 8 MiB a layer, the weights a few KiB
    need_one = one.cards[0].dense_bytes + one.cards[0].kv_bytes + one.cards[0].work_bytes + 700 * 2**20
    budget = (need_one + 3.5 * per_layer) / GiB  # room for the KV of about 4 layers beyond the first
    with pytest.raises(StrataError, match=r"card 1 \(cpu\) cannot hold layers 1-5"):
        _plan(six_moe, budget, split=(1, 5))
    plan = _plan(six_moe, budget)
    assert [len(c.layers) for c in plan.cards] == [3, 3]
    assert all(c.all_resident for c in plan.cards)
    assert "card 1  cpu (budget" in plan.describe() and "layers 3-5 + head" in plan.describe()


def test_auto_bounds_give_the_smaller_card_fewer_layers():
    # Two cards of 100 and 300 units, each layer 10 units of dense weights and 10 of experts: the split that
    # leaves each card the same room per expert byte gives the big card more layers.
    budgets = [100, 300]

    def room(card, begin, end):
        return budgets[card] - 10 * (end - begin)

    def experts(card, begin, end):
        return 10 * (end - begin), end - begin

    bounds = _auto_bounds(12, 2, room, experts, budgets)
    assert bounds[0] == 0 and bounds[-1] == 12 and 2 <= bounds[1] <= 4
    assert _auto_bounds(6, 3, room, experts, [None] * 3) == [0, 2, 4, 6]


def test_info_plan_shows_each_card(capsys, six_moe):
    assert main(["info", str(six_moe), "--plan", "--gpus", "cpu,cpu", "--layer-split", "2,4"]) == 0
    out = capsys.readouterr().out
    assert "card 0  cpu (budget unbounded): layers 0-1 + embedding" in out
    assert "card 1  cpu (budget unbounded): layers 2-5 + head" in out and "32 of 32 on the card" in out


def test_what_a_split_does_not_run_yet_is_one_line(six_moe):
    for options, match in ((dict(qsa="quest"), "--qsa"),
                           (dict(decode_graphs="on"), "needs a CUDA device")):  # CPU stand-ins never capture
        with pytest.raises(StrataError, match=match):
            Engine(six_moe, EngineConfig(device="cpu", gpus="cpu,cpu", **options))
