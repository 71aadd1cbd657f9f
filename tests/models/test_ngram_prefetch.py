"""qwen4exp's n-gram rows gathered ahead of the chunks on a host thread (models/ngram_prefetch.py), and decoded
straight into their buffer (models/ngram_rows.py): the same float32 bits as the in-line lookup, a plan that does not
match the chunk falls back to it, and a failed lookup is a StrataError at the chunk that needed it."""

import numpy as np
import pytest
import torch

import strata
import strata.models.ngram_embedding as ngram_embedding
import strata.models.ngram_rows as ngram_rows
from strata import switches
from strata.errors import StrataError
from strata.models.ngram_prefetch import NgramPrefetch
from strata.models.synthetic import make_model
from strata.quant import dequantize, get_format, random_blocks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("ngram") / "tiny.gguf", arch="qwen4exp", preset="tiny", quant="F32")


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("qtype", ["IQ4_NL", "F16", "BF16", "F32", "Q8_0"])
def test_decoded_rows_have_dequantize_bits_in_pieces_over_threads(monkeypatch, qtype):
    """Every format the table may have (IQ4_NL's pair lookup, the float views, Q8_0 through the registry's fallback),
    rows repeated and out of order, pieces smaller than the index and spread over two threads, their pages touched
    first from three."""
    monkeypatch.setattr(ngram_rows, "PIECE_ROWS", 7)
    monkeypatch.setattr(ngram_rows, "PIECE_THREADS", 2)
    monkeypatch.setattr(ngram_rows, "TOUCH_MIN_ROWS", 1)
    monkeypatch.setattr(ngram_rows, "TOUCH_THREADS", 3)
    fmt, cols, n_rows = get_format(qtype), 64, 50
    blocks_per_row = cols // fmt.block_size
    table = random_blocks(qtype, n_rows * blocks_per_row, np.random.default_rng(1), scale=1.0).reshape(n_rows, -1)
    index = np.random.default_rng(2).integers(0, n_rows, 40).astype(np.int64)
    out = np.full((40, cols), np.nan, dtype=np.float32)
    ngram_rows.decode_rows(table, fmt.ggml_type, index, out)
    want = dequantize(torch.from_numpy(table[index]), fmt.ggml_type, (40, cols))
    assert torch.equal(torch.from_numpy(out).view(torch.int32), want.view(torch.int32))


def test_iq4_nl_rows_put_low_nibbles_first():
    """A hand-made block: byte j holds codes (j, 15 - j); value j is level[j] * d, value 16 + j level[15 - j] * d."""
    levels = ngram_rows.iq4_nl_levels()
    block = np.zeros(18, dtype=np.uint8)
    block[:2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    block[2:] = np.arange(16) | ((15 - np.arange(16)) << 4)
    out = np.empty((1, 32), dtype=np.float32)
    ngram_rows.decode_rows(block[None], get_format("IQ4_NL").ggml_type, np.zeros(1, dtype=np.int64), out)
    assert out[0].tolist() == [0.5 * v for v in levels.tolist() + levels[::-1].tolist()]


def _engine_logits(path, ids: list[int], chunk: int, sync: bool) -> tuple[torch.Tensor, object, object]:
    llm = strata.LLM(path, device="cpu", kv_dtype="float32", prefill_chunk=chunk)
    with switches.override(STRATA_NGRAM_SYNC=sync):
        logits = llm.logits(ids)
    return logits, llm.engine.model, llm.engine.kv


def test_prefetched_rows_give_the_in_line_logits_bytes_over_several_chunks(tiny, monkeypatch):
    """A 40-token prompt in chunks of 6 (the last one of 4): every chunk's rows come from the host thread, and the
    logits of every position, the cache's token window and conv history are the in-line lookup's bytes."""
    monkeypatch.setattr(ngram_embedding, "CACHED_GATHER_ROWS", 16)  # chunks of 2+ tokens skip the row cache
    ids = _tokens(40, seed=5)
    want, _, want_kv = _engine_logits(tiny, ids, 6, sync=True)
    got, model, kv = _engine_logits(tiny, ids, 6, sync=False)
    assert model.ngram_prefetch.taken == 7 and not model.ngram_prefetch.queued
    assert torch.equal(got, want)
    assert kv.previous_tokens == want_kv.previous_tokens == (ids[-2], ids[-1])
    assert torch.equal(kv.ple_history, want_kv.ple_history)


def test_a_prompt_after_a_cached_prefix_hashes_across_the_boundary(tiny, monkeypatch):
    """The second prompt continues the first (its prefix is reused): its first chunk's n-grams reach back into the
    cached tokens (the plan's `previous`); the logits are the in-line lookup's bytes."""
    monkeypatch.setattr(ngram_embedding, "CACHED_GATHER_ROWS", 16)
    ids = _tokens(30, seed=6)
    results = []
    for sync in (True, False):
        llm = strata.LLM(tiny, device="cpu", kv_dtype="float32", prefill_chunk=8)
        with switches.override(STRATA_NGRAM_SYNC=sync):
            results.append((llm.engine.prefill(ids[:17]), llm.engine.prefill(ids)))
    assert llm.engine.model.ngram_prefetch.taken == 2 + 2  # chunks of 8, 8, 1 (in line: too small), then 8, 5
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_failed_lookup_is_one_strata_error_at_its_chunk_and_the_engine_recovers(tiny, monkeypatch):
    monkeypatch.setattr(ngram_embedding, "CACHED_GATHER_ROWS", 16)
    ids = _tokens(20, seed=7)
    llm = strata.LLM(tiny, device="cpu", kv_dtype="float32", prefill_chunk=5)
    model = llm.engine.model
    want = llm.logits(ids)
    calls = []
    table_gather = model.ngram_table.gather_into

    def failing(rows, out):
        calls.append(len(rows))
        if len(calls) == 3:
            raise OSError("read error on the table shard")
        table_gather(rows, out)

    monkeypatch.setattr(model.ngram_table, "gather_into", failing)
    with pytest.raises(StrataError, match=r"n-gram table lookup for prompt tokens 10\.\.14 failed on its host "
                                          r"thread: OSError: read error on the table shard"):
        llm.logits(ids)
    assert llm.engine.cached_tokens == [] and not model.ngram_prefetch.queued
    monkeypatch.setattr(model.ngram_table, "gather_into", table_gather)
    model.ngram_prefetch.taken = 0
    assert torch.equal(llm.logits(ids), want)
    assert model.ngram_prefetch.taken == 4  # the token window from a stopped prompt does not spoil the next plan


def test_a_chunk_other_than_announced_is_looked_up_in_line():
    """take() gives rows only for the announced position, tokens and window; anything else drops the plan (None),
    and a chunk before the next job (too small to be announced) leaves it in place."""
    seen = []

    def lookup(tokens, previous, out):
        seen.append((tokens.tolist(), previous))
        out[:] = torch.tensor(tokens, dtype=torch.float32)[:, None]

    prefetch = NgramPrefetch(lookup, 2, torch.device("cpu"))
    prefetch.begin([5, 6, 7, 8, 9], [(0, 1), (1, 3), (3, 5)], 10, (3, 4), min_tokens=2)
    assert prefetch.take(10, np.array([5]), (3, 4)) is None and len(prefetch.queued) == 2  # not announced: kept
    rows = prefetch.take(11, np.array([6, 7]), (4, 5))
    assert rows.tolist() == [[6.0, 6.0], [7.0, 7.0]]
    assert seen[0] == ([6, 7], (4, 5)) and prefetch.taken == 1
    assert prefetch.take(13, np.array([8, 0]), (6, 7)) is None  # other tokens than announced
    assert not prefetch.queued and prefetch.take(13, np.array([8, 9]), (6, 7)) is None  # the plan is gone


def test_the_time_a_forward_waits_for_its_rows_is_counted():
    """A lookup slower than the forward before it: take() waits for it, and waited_s says how long."""
    import threading

    release = threading.Event()

    def lookup(tokens, previous, out):
        release.wait(5)
        out[:] = 1.0

    prefetch = NgramPrefetch(lookup, 2, torch.device("cpu"))
    prefetch.begin([5, 6], [(0, 2)], 0, (-1, -1))
    threading.Timer(0.2, release.set).start()
    assert prefetch.take(0, np.array([5, 6]), (-1, -1)).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert 0.15 <= prefetch.waited_s < 5


def test_a_tables_decoder_is_ready_before_its_first_prompt(monkeypatch):
    """NgramTable loads (or compiles) the IQ4_NL loop when it is made, not at a prompt's n-gram layer."""
    from strata.models.ngram_embedding import NgramTable
    from strata.models.weights import QuantWeight

    loop, calls = ngram_rows._iq4_nl_rows, []
    monkeypatch.setattr(ngram_rows, "_iq4_nl_rows", lambda *args: (calls.append(args[1].tolist()), loop(*args)))
    fmt = get_format("IQ4_NL")
    raw = torch.from_numpy(random_blocks("IQ4_NL", 8 * 5, np.random.default_rng(3), scale=1.0).reshape(8, -1))
    NgramTable(QuantWeight("ngram", fmt.ggml_type, (8, 160), raw))
    assert calls == [[0]] and loop.signatures  # row 0 decoded through the compiled loop as the table was made
