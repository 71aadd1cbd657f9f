import pytest

from strata.engine.prefill import (CPU_CHUNK, ProgressClock, activation_bytes_per_token, chunk_size, equal_chunks,
                                   prompt_chunks)
from strata.errors import StrataError
from strata.gguf import GGUFModelFile
from strata.models import config_of


def test_equal_chunks_cover_the_prompt_once_and_evenly():
    for n, cap in [(1, 8), (8, 8), (9, 8), (8193, 8192), (100, 7), (20000, 8192)]:
        bounds = equal_chunks(n, cap)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        sizes = [e - s for s, e in bounds]
        assert max(sizes) <= cap and max(sizes) - min(sizes) <= 1 and len(bounds) == -(-n // cap)
    assert equal_chunks(0, 8) == []
    assert prompt_chunks(20, 8, equal=False) == [(0, 8), (8, 16), (16, 20)]  # an explicit size is kept as given
    assert prompt_chunks(20, 8, equal=True) == [(0, 7), (7, 14), (14, 20)]


def test_chunk_size_from_the_option(tiny_moe):
    config = config_of(GGUFModelFile(tiny_moe))
    assert chunk_size(300, config, on_gpu=True, free_bytes=None) == 300
    assert chunk_size("auto", config, on_gpu=False, free_bytes=None) == CPU_CHUNK
    assert chunk_size("auto:100", config, on_gpu=False, free_bytes=None) == 100
    per_token = activation_bytes_per_token(config)
    assert chunk_size("auto", config, on_gpu=True, free_bytes=2 * 1000 * per_token) == 1000
    assert chunk_size("auto:16384", config, on_gpu=True, free_bytes=2**40) == 16384
    assert chunk_size("auto", config, on_gpu=True, free_bytes=2**40) == 8192
    for bad in (0, "fast", "auto:many"):
        with pytest.raises(StrataError, match="prefill"):
            chunk_size(bad, config, on_gpu=True, free_bytes=None)


def test_progress_reports_each_chunk():
    seen = []
    clock = ProgressClock(10, seen.append)
    clock.chunk_done(4)
    clock.chunk_done(10)
    assert [(p.done, p.total) for p in seen] == [(4, 10), (10, 10)] and seen[-1].seconds >= 0


def test_engine_reports_progress_per_chunk(tiny_moe):
    import strata

    llm = strata.LLM(tiny_moe, device="cpu", prefill_chunk="auto:4")
    seen = []
    llm.engine.on_prefill_progress = seen.append
    ids = llm.tokenize("a prompt of enough tokens to need several chunks of four")
    llm.engine.prefill(ids)
    n = len(ids)
    assert [p.done for p in seen][-1] == n and len(seen) == -(-n // 4) and seen[-1].total == n
