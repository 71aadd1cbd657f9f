"""`strata bench miss-bw`: the misses' microbenchmark runs its checks at a tiny shape (on the GPU where there is
one, else under the interpreter: the same code; the in-place misses against float64, the copied ones against the
in-place ones), and its sweep lists start at the current tiles and turn into MISS_TILES entries that select those
tiles."""

import pytest

from strata.bench.miss_bw import COPY_SWEEP, main
from strata.kernels.moe import miss_tiles
from strata.kernels.moe.decode import decode_spec
from strata.kernels.moe.gemv import gemv_config
from strata.kernels.moe.miss_copy import DEFAULT_COPY
from strata.quant import get_format
from tests.kernels import DEVICE


def test_the_tool_checks_every_path_at_a_tiny_shape(capsys):
    code = main(["--device", DEVICE, "--shapes", "tiny-q4_0", "--misses", "0,1,4"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.startswith("tiny-q4_0")]
    assert [r[1] for r in rows] == ["0", "1", "4"] and all(r[-1] == "same" for r in rows)
    assert "FAIL" not in out


@pytest.mark.parametrize("kind, fmt, n_out, n_in, top_k", [("gate_up", "Q2_0", 640, 2560, 10),
                                                           ("down", "Q2_0", 2560, 640, 10),
                                                           ("gate_up", "Q4_0", 768, 2048, 8),
                                                           ("down", "Q4_0", 2048, 768, 8)])
def test_sweep_lists_start_at_the_current_tile_and_round_trip(kind, fmt, n_out, n_in, top_k, monkeypatch):
    spec = decode_spec(get_format(fmt).ggml_type)
    configs = miss_tiles.miss_sweep_configs(kind, spec, n_out, n_in, top_k)
    assert configs[0] == gemv_config(kind, spec, n_out, n_in, top_k, True)  # MISS_TILES empty: the hits' tile
    assert len(configs) == len(set(configs)) > 8
    assert any(c.split >= 4 for c in configs) and any(c.bn == 1 for c in configs)
    for cfg in configs[1:]:  # every line's printed entry, entered in the table, selects that line's tile
        monkeypatch.setitem(miss_tiles.MISS_TILES, (kind, fmt), eval(miss_tiles.tile_entry(cfg)))
        assert miss_tiles.miss_config(kind, spec, n_out, n_in, top_k) == cfg, miss_tiles.tile_entry(cfg)


def test_copy_sweep_configs_are_whole_vector_loads():
    assert DEFAULT_COPY in COPY_SWEEP
    assert all(c.chunk % (128 * c.warps) == 0 for c in COPY_SWEEP)


def test_the_sweep_prints_a_line_a_config_with_its_error(capsys, monkeypatch):
    from strata.kernels.moe.gemv import GemvConfig

    tiles = [GemvConfig(bn=64, ns=4, warps=4, wide=True, oneshot=True), GemvConfig(bn=32, ns=4, warps=4, wide=True,
                                                                                    oneshot=True, split=2)]
    monkeypatch.setattr(miss_tiles, "miss_sweep_configs", lambda *a: tiles)  # interpreter-sized, not the GPU's
    code = main(["--device", DEVICE, "--shapes", "tiny-q4_0", "--misses", "none", "--sweep"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line.split() for line in out.splitlines() if line.startswith("  sweep")]
    assert [(w[2], w[3]) for w in lines if w[2] != "gather"] == [("gate_up", "oneshot")] * 2 + [("down", "oneshot")] * 2
    assert sum(w[2] == "gather" for w in lines) == len(COPY_SWEEP) and "FAIL" not in out


def test_a_dry_run_on_the_cpu_needs_the_interpreter(capsys, monkeypatch):
    """On a GPU machine Triton compiles for the GPU: --device cpu is refused in one line, not a launch error."""
    import strata.bench.miss_bw as miss_bw

    monkeypatch.setattr(miss_bw, "INTERPRETED", False)
    assert main(["--device", "cpu", "--shapes", "tiny-q4_0", "--misses", "0"]) == 2
    assert "set TRITON_INTERPRET=1" in capsys.readouterr().out
