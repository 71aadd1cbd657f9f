"""qwen4exp's verify windows through its static step (engine/decode_qwen4exp.py's Qwen4ExpDecoder, rows 1..4, the
CPU form: the same program the graphs record, exact span): each window row is the one-row static step at its
position bit for bit (logits, the final stacks the MTP block drafts from); after a rejected draft every state
(GatedDeltaNet, KV, indexer keys, n-gram window and history) is plain decoding's; greedy --spec 2/3/4 is plain
greedy; the engine builds VerifyWindows for qwen4exp, with no fallback line."""

import dataclasses

import pytest
import torch

import strata
from strata.engine.decode_qwen4exp import Qwen4ExpDecoder
from strata.engine.engine import Engine, EngineConfig
from strata.engine.spec import Draft
from strata.engine.spec_windows import VerifyWindows
from strata.errors import StrataError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STATIC = dict(device="cpu", decode_graphs="eager")


@pytest.fixture(scope="module")
def q4(model_dir):
    """The tiny qwen4exp with its MTP block; top_k 8: QSA selects past 11 cells (top_k + 3). A hyper-connection
    rank of 32, not 16: torch's CPU SiLU takes a 16-value row through its scalar tail and 2-4 such rows through its
    AVX-512 loop, which round differently (a float32 CPU artefact the GPU's per-row kernels do not have)."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "q4xwin-qwen4exp-mtp.gguf", arch="qwen4exp", preset="tiny", quant="F32", mtp=True,
                      top_k=8, hc_rank=32)


@pytest.fixture(scope="module")
def q4_hd64(model_dir):
    """The same with head_dim 64, as the int8 KV cache needs."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "q4xwin-qwen4exp-mtp-hd64.gguf", arch="qwen4exp", preset="tiny", quant="F32",
                      mtp=True, top_k=8, hc_rank=32, head_dim=64)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _state(kv) -> dict:
    """Every per-sequence tensor and count of a Qwen4ExpCache (its current part), cloned."""
    n = kv.length
    out = {"length": n, "previous": kv.previous_tokens, "ple": kv.ple_history.clone()}
    for layer in kv.conv:
        out[f"conv{layer}"], out[f"state{layer}"] = kv.conv[layer].clone(), kv.state[layer].clone()
    for layer, keys in kv.indexer.items():
        out[f"count{layer}"] = (keys.n_cells, keys.n_pooled)
        out[f"raw{layer}"], out[f"pooled{layer}"] = keys.raw[:n].clone(), keys.keys().clone()
    for slot in range(len(kv.kv_slot)):
        out[f"kv{slot}"] = _keys_values(kv.kv, slot, n)
    return out


def _keys_values(kv, layer: int, n: int) -> tuple[torch.Tensor, ...]:
    """Keys and values of cells 0..n-1 as stored (int8 pages dequantized), one tensor per KV head and kind."""
    if hasattr(kv, "read"):
        return tuple(t.clone() for t in kv.read(layer, n, torch.float32))
    from strata.kernels.attention.kv_int8 import gather_kv

    cells = torch.arange(n)
    return tuple(t for h in range(kv.n_kv_heads) for t in gather_kv(kv.pools[layer], kv.page_table, cells, h))


def _assert_same_state(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            same = torch.equal(got[name], value)
        elif isinstance(value, tuple) and isinstance(value[0], torch.Tensor):  # a KV layer's keys and values
            same = all(torch.equal(a, b) for a, b in zip(got[name], value))
        else:
            same = got[name] == value
        assert same, f"{where}: {name}"


def _engine(path, **options) -> Engine:
    engine = Engine(path, EngineConfig(**STATIC, **options))
    cache = getattr(engine.model.experts, "cache", None)
    if cache is not None:  # frozen: one placement for windows and steps (a window counts once for adaptation)
        cache.adapt_every = 1 << 40
    return engine


@pytest.mark.parametrize("options", [{}, {"expert_cache": 3, "misses": "cpu"}, {"kv_dtype": "int8"}],
                         ids=["resident", "expert-cache", "int8-kv"])
def test_windows_are_the_static_steps_row_by_row_and_roll_back_exactly(q4, q4_hd64, options):
    """Windows of 4, 3, 2 rows at positions 9.. (crossing QSA's dense reach at 11 inside the first window, an
    indexer block completing in most), each keeping fewer rows than it ran: every row's logits and final stack are
    those of a one-row window (the one-row static step, plain decoding's with --spec), and after keep_rows the
    whole cache is what one-row steps over the kept tokens left. Behind a (frozen) expert cache the windows run
    the doorbell segments, a layer's misses the union over the window's rows."""
    q4 = q4_hd64 if "kv_dtype" in options else q4
    prompt, text = _tokens(9, seed=1), _tokens(12, seed=2)
    ones = _engine(q4, spec=4, **options)
    ones.prefill(prompt)
    plain = _engine(q4, **options)
    plain.prefill(prompt)
    logits, stacks, states = [], [], []
    for i, token in enumerate(text):
        position = len(prompt) + i
        row = ones.spec.verify([token], position).clone()
        assert torch.equal(row, plain.decode(token, position))  # a one-row window is plain decoding's step
        ones.spec.keep(position, 1)
        logits.append(row[0])
        stacks.append(ones.spec.hidden[position].clone())
        states.append(_state(ones.kv))
    spec = _engine(q4, spec=4, **options)
    assert isinstance(spec.spec.windows, VerifyWindows)
    assert all(type(d) is Qwen4ExpDecoder for d in spec.spec.windows.decoders.values())
    assert all((d.cached is not None) == ("expert_cache" in options) for d in spec.spec.windows.decoders.values())
    spec.prefill(prompt)
    at = 0
    for rows, keep in ((4, 2), (3, 1), (2, 1), (4, 3), (3, 3)):
        start = len(prompt) + at
        got = spec.spec.verify(text[at:at + rows], start)
        for r in range(rows):
            assert torch.equal(got[r], logits[at + r]), f"window of {rows} at {start}: row {r}'s logits"
            assert torch.equal(spec.spec.hidden[start + r], stacks[at + r]), f"window at {start}: row {r}'s stack"
        spec.spec.keep(start, keep)
        _assert_same_state(_state(spec.kv), states[at + keep - 1], f"window of {rows} at {start} keeping {keep}")
        at += keep
    assert spec.spec.windows.steps == {1: 0, 2: 1, 3: 2, 4: 2}


@pytest.mark.parametrize("window", [2, 3, 4])
def test_greedy_spec_through_the_static_windows_equals_plain(q4, window):
    """Drafts right for a while, then wrong at known places: the same tokens as plain greedy decoding (its static
    steps), every window through the static program."""
    prompt = _tokens(6, seed=3)
    plain = strata.LLM(q4, **STATIC).generate(prompt, max_tokens=20, temperature=0).token_ids
    llm = strata.LLM(q4, spec=window, **STATIC)
    truth, wrong = prompt + plain, {len(prompt) + i for i in (2, 5, 6, 11, 14)}

    def propose(history, k, sampler):
        return [Draft(truth[p] if p not in wrong else (truth[p] + 1) % 512, None, "suffix")
                for p in range(len(history), min(len(history) + k, len(truth)))]

    llm.engine.spec.propose = propose
    assert llm.generate(prompt, max_tokens=20, temperature=0).token_ids == plain
    spec = llm.engine.spec
    assert 0 < sum(spec.stats.accepted) < sum(spec.stats.checked)
    assert spec.windows.steps[window] > 0  # windows of the full size ran through the static step


def test_mtp_drafts_with_static_windows_equal_plain(q4, capsys):
    """The MTP block's own drafts, windows through the static step: plain greedy's tokens; the engine says nothing
    about windows falling back to step by step."""
    prompt = _tokens(8, seed=4)
    plain = strata.LLM(q4, **STATIC).generate(prompt, max_tokens=14, temperature=0).token_ids
    llm = strata.LLM(q4, spec=3, **STATIC)
    assert "verify windows step by step" not in capsys.readouterr().err
    assert llm.generate(prompt, max_tokens=14, temperature=0).token_ids == plain
    assert llm.engine.spec.stats.checked_by["mtp"] > 0


def test_windows_at_a_graph_span_reuse_one_program(q4):
    """At the graphs' power-of-two span (exact_span=False, what the captured windows run), each row count's
    program built once and rerun for every window, as a graph replays (nothing of a window may be fixed when it is
    built): with budget 8 every row of the span of 256 selects, and the rows equal one-row windows at that span,
    after rejections too. Which rows select follows each row's own step: with a budget whose dense reach is the
    span of 256, a window at 512 may hold rows of both kinds (decided on the device), one at 256 none that
    select."""
    prompt, text = _tokens(9, seed=5), _tokens(11, seed=6)

    def engine():
        made = Engine(q4, EngineConfig(device="cpu", n_ctx=512, spec=4, decode_graphs="eager"))
        for decoder in made.spec.windows.decoders.values():
            decoder.exact_span = False
        made.prefill(prompt)
        return made

    ones, spec = engine(), engine()
    logits = []
    for i, token in enumerate(text):
        logits.append(ones.spec.verify([token], len(prompt) + i)[0].clone())
        ones.spec.keep(len(prompt) + i, 1)
    built = {}
    for rows, decoder in spec.spec.windows.decoders.items():
        def memo(span, rows=rows, build=decoder._program):
            if (rows, span) not in built:
                built[rows, span] = build(span)
            return built[rows, span]

        decoder._program = memo
    at = 0
    for rows, keep in ((4, 2), (4, 4), (3, 1), (4, 1)):
        got = spec.spec.verify(text[at:at + rows], len(prompt) + at)
        for r in range(rows):
            assert torch.equal(got[r], logits[at + r]), f"window of {rows} at {at}: row {r}"
        spec.spec.keep(len(prompt) + at, keep)
        at += keep
    assert sorted(built) == [(3, 256), (4, 256)]
    decoder = spec.spec.windows.decoders[4]
    view = _view(decoder, 512)
    assert decoder.dense_reach() == 0 and decoder._qsa_rows(256, view, 0)[0] is True
    spec.model.qsa = dataclasses.replace(spec.model.qsa, top_k=253)  # selection_cells 256
    assert decoder.dense_reach() == 256
    assert decoder._qsa_rows(256, view, 256)[0] is False  # every row's step attended densely
    assert decoder._qsa_rows(512, view, 256)[0] is None  # rows at 254..256 cells stepped at 256: both kinds
    assert spec.spec.windows.decoders[1]._qsa_rows(512, _view(spec.spec.windows.decoders[1], 512), 256)[0] is True


def _view(decoder, span):
    from strata.engine.static_kv import StaticHybrid, static_kv

    return StaticHybrid(decoder.kv, static_kv(decoder.kv.kv, decoder.positions, span, decoder.exact_span))


def test_refusals(q4):
    engine = Engine(q4, EngineConfig(device="cpu"))
    with pytest.raises(StrataError, match="runs 1..4 tokens"):
        Qwen4ExpDecoder(engine.model, engine.kv, engine.device, capture=False, rows=5)
    decoder = Qwen4ExpDecoder(engine.model, engine.kv, engine.device, capture=False, rows=2, keep_row_states=True)
    engine.prefill(_tokens(6, seed=7))
    with pytest.raises(StrataError, match="tokens on the host"):
        decoder.step([1, 2], 6, tail=torch.tensor([2]))


@pytest.mark.parametrize("min_p", [0.0, 0.0025])  # the random head: drafts of p 0.0024..0.0027, some stop
def test_static_mtp_drafts_are_the_eager_ones(q4, min_p):
    """qwen4exp's MTP block through its static step (spec_mtp.MTPSteps, the CPU form: the program the graphs
    record): the same drafts, tokens and acceptance counts as its eager drafts, every window after the first
    drafting there; the block's keys of the current cells are the trunk's, as eager drafting leaves them."""
    prompt = _tokens(9, seed=8)
    runs = []
    for static in (True, False):
        llm = strata.LLM(q4, kv_dtype="float32", spec=4, spec_min_p=min_p, suffix_draft=1, **STATIC)
        spec = llm.engine.spec
        if not static:
            spec.mtp_steps = None
        drafts, accept = [], spec.accept

        def recorded(rows, window, *args, _accept=accept, _drafts=drafts, **kwargs):
            _drafts.append([(d.token, d.source) for d in window])
            return _accept(rows, window, *args, **kwargs)

        spec.accept = recorded
        out = llm.generate(prompt, max_tokens=16, temperature=0).token_ids
        runs.append((out, drafts, spec.stats.as_dict(), spec.mtp_steps, llm.engine))
    (out, drafts, stats, steps, engine), (eager_out, eager_drafts, eager_stats, _, eager) = runs
    assert out == eager_out and drafts == eager_drafts and stats == eager_stats
    assert steps is not None and steps.replays >= len(drafts) - 1
    assert any(source == "mtp" for window in drafts for _, source in window)
    cells = engine.spec.mtp_cells
    assert cells == eager.spec.mtp_cells
    ours, theirs = engine.kv.mtp_kv.read(0, cells, torch.float32), eager.kv.mtp_kv.read(0, cells, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
