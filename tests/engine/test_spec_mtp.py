"""Greedy MTP drafts through the MTP block's static step (engine/spec_mtp.py, its CPU form): the eager drafts token
for token, one host read for a window's drafts and one for its acceptance, no eager MTP call once the prompt's
cells are in, rollback in one multi-tensor copy; and `--spec auto` taking AUTO_WINDOW where windows capture."""

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import strata
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams

GREEDY = dict(temperature=0)
SPEC_FILES = ("spec.py", "spec_mtp.py", "spec_windows.py")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def next_mtp(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "mtp-steps-qwen3next.gguf", arch="qwen3next", preset="tiny", quant="Q8_0",
                      nextn_layers=1)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _recording(llm) -> list:
    """Every window's drafts (token, source), recorded as acceptance reads them."""
    spec, seen = llm.engine.spec, []
    accept = spec.accept

    def recorded(rows, drafts, *args, **kwargs):
        seen.append([(d.token, d.source) for d in drafts])
        return accept(rows, drafts, *args, **kwargs)

    spec.accept = recorded
    return seen


@pytest.mark.parametrize("min_p", [0.0, 0.0034])  # the random head: drafts of p 0.0031..0.0040, some stop
def test_static_mtp_drafts_are_the_eager_ones(next_mtp, min_p):
    prompt = _tokens(9, seed=1)
    runs = []
    for static in (True, False):
        llm = strata.LLM(next_mtp, device="cpu", kv_dtype="float32", spec=4, spec_min_p=min_p, suffix_draft=1,
                         decode_graphs="eager")
        if not static:
            llm.engine.spec.mtp_steps = None
        drafts = _recording(llm)
        out = llm.generate(prompt, max_tokens=20, **GREEDY).token_ids
        runs.append((out, drafts, llm.engine.spec.stats.as_dict(), llm.engine.spec.mtp_steps))
    (out, drafts, stats, steps), (eager_out, eager_drafts, eager_stats, _) = runs
    assert out == eager_out and drafts == eager_drafts and stats == eager_stats
    assert steps.replays >= len(drafts) - 1  # every window after the prompt's drafted through the static step
    assert any(source == "mtp" for window in drafts for _, source in window)


@pytest.mark.parametrize("min_p,pipeline", [(0.0, True), (0.0, False), (0.0034, False)])
def test_host_reads_per_window(next_mtp, monkeypatch, min_p, pipeline):
    """Reads of tensor values (item, int, float, tolist) made by the speculation loop's own code, per window: one
    (the drafts, which went from the MTP graphs into the window on the device, with every row's argmax: the opt-in
    STRATA_SPEC_PIPELINE); else two (the MTP picks, whose probabilities decide the window's rows, then the argmax).
    (The model's CPU reference loops are not the loop's.)"""
    from strata import switches

    monkeypatch.setattr(switches, "_values", {**switches._values, "STRATA_SPEC_PIPELINE": pipeline})
    llm = strata.LLM(next_mtp, device="cpu", spec=4, spec_min_p=min_p, decode_graphs="eager")
    prompt = _tokens(9, seed=2)
    reads: Counter = Counter()
    for name in ("item", "tolist", "__int__", "__float__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = Path(sys._getframe(1).f_code.co_filename)
            if caller.parent.name == "engine" and caller.name in SPEC_FILES:
                reads[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    spec = llm.engine.spec
    eager_calls = Counter()
    mtp_forward = llm.engine.model.mtp_forward
    monkeypatch.setattr(llm.engine.model, "mtp_forward",
                        lambda *a, **k: (eager_calls.update(["mtp_forward"]), mtp_forward(*a, **k))[1])
    before = spec.stats.windows
    out = llm.generate(prompt, max_tokens=14, **GREEDY).token_ids
    windows = spec.stats.windows - before
    assert windows >= 4 and len(out) == 14
    # Only the first window drafts eagerly (the prompt's cells, one chunk, then 2 drafts after drafts).
    assert eager_calls["mtp_forward"] <= 3
    assert reads["tolist"] <= (1 if pipeline else 2) * windows, reads
    assert reads["__int__"] + reads["__float__"] <= 2 * 3 and not reads["item"], reads  # that window's 3 drafts


def test_keep_rows_restores_every_layer_in_one_multi_tensor_copy(next_mtp):
    from torch.profiler import profile

    engine = Engine(next_mtp, EngineConfig(device="cpu", spec=4, decode_graphs="eager"))
    prompt = _tokens(6, seed=3)
    engine.prefill(prompt)
    engine.spec.verify([1, 2, 3, 4], len(prompt))
    with profile() as prof:
        engine.spec.keep(len(prompt), 2)
    names = Counter(e.name for e in prof.events())
    assert names["aten::_foreach_copy_"] == 1 and names["aten::copy_"] <= 2 * names["aten::_foreach_copy_"], names
    assert engine.kv.length == len(prompt) + 2


def test_spec_auto_takes_auto_window_where_windows_capture(next_mtp, monkeypatch):
    from strata.engine import spec_auto

    engine = Engine(next_mtp, EngineConfig(device="cpu", decode_graphs="eager"))
    assert engine._spec_window("auto") == 1  # the CPU form: no graphs
    engine.decoder.capture = True  # as on a GPU whose decode captures
    assert engine._spec_window("auto") == spec_auto.AUTO_WINDOW
    monkeypatch.setattr(spec_auto, "AUTO_WINDOW", 3)
    assert engine._spec_window("auto") == 3


def test_the_default_models_experts_take_the_decode_kernels():
    """Its experts (32 hidden units, Q8_0), the MTP block's too, as a GPU step would see them: the GEMVs, so its
    decode, its verify windows and its MTP step capture."""
    from types import SimpleNamespace

    from strata.engine.experts import kernel_path

    path = Path(strata.__file__).parent / "data/default-model/strata-default-qwen3next-q8_0.gguf"
    model = Engine(path, EngineConfig(device="cpu", n_ctx=64)).model
    probe = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(4, model.config.n_embd))
    stacks = model.expert_stacks
    assert model.mtp and model.n_main in stacks
    assert all(kernel_path(stack, probe) == "decode" for stack in stacks.values())


def test_launches_outside_the_graphs_per_window_do_not_grow_with_layers(next_mtp, monkeypatch):
    """What a window launches outside its static programs (the verify step's and the MTP step's segments, graphs on
    a GPU), counted on the CPU with the programs marked: uploads, the picks' copies and read, the rows' argmax and
    read, the hidden states kept, one rollback copy: a few dozen ops at most, none per layer. (The CPU's staging
    ops count here too, so the bound is loose.)"""
    from torch.profiler import profile, record_function

    from tools.count_step_kernels import NO_LAUNCH

    from strata.engine.decode import GraphDecoder, StepGraphs
    from strata.engine.spec_mtp import MTPSteps

    def marked(fn):
        """fn run inside a "static program" range."""
        def run(*args, **kwargs):
            with record_function("static program"):
                return fn(*args, **kwargs)

        return run

    run, program, build = StepGraphs.run, MTPSteps._program, GraphDecoder._program
    monkeypatch.setattr(StepGraphs, "run", marked(run))
    # The CPU form builds a step's program (its static views) every step; a GPU builds it once a span, captured.
    monkeypatch.setattr(GraphDecoder, "_program", marked(build))
    monkeypatch.setattr(MTPSteps, "_program", lambda self, rows, span: marked(marked(program)(self, rows, span)))
    llm = strata.LLM(next_mtp, device="cpu", spec=4, decode_graphs="eager")
    tokens = llm.engine.generate(_tokens(9, seed=4), SamplingParams(temperature=0), 24)
    next(tokens), next(tokens)  # the prompt and the first window (the prompt's MTP cells, eagerly)
    spec = llm.engine.spec
    before = spec.stats.windows
    with profile() as prof:
        rest = list(tokens)
    windows = spec.stats.windows - before
    outside = Counter()
    for e in prof.events():
        if not e.name.startswith("aten::") or e.name in NO_LAUNCH:
            continue
        if any(c.name.startswith("aten::") and c.name not in NO_LAUNCH for c in e.cpu_children):
            continue  # a composite op: its children count
        parent, marked = e.cpu_parent, False
        while parent is not None and not marked:
            marked, parent = parent.name == "static program", parent.cpu_parent
        if not marked:
            outside[e.name] += 1
    assert len(rest) == 22 and windows >= 5
    per_window = sum(outside.values()) / windows
    # 23 here (a dozen of them host-side staging a GPU does not launch); eager drafts alone added ~60 a draft.
    assert per_window <= 32, (per_window, outside.most_common(12))
