import io

from strata.bench.matvec import bench_one
from tests.kernels import DEVICE


def test_matvec_bench_row_passes_at_a_tiny_shape():
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.gemv import gemv_config

    out = io.StringIO()
    assert bench_one(64, 24, "Q4_0", DEVICE, 1e9, out), out.getvalue()
    lines = out.getvalue().splitlines()
    # The byte kernel, then the default: the one-shot tiles on a GPU, the word kernel's under the interpreter.
    default = "oneshot" if gemv_config("matvec", SPECS["Q4_0"], 24, 64, 1, DEVICE == "cuda").oneshot else "words"
    assert [line.split()[2] for line in lines] == ["bytes", default] and "FAIL" not in out.getvalue()


def test_matvec_sweep_checks_every_config_against_float64():
    from strata.bench.gemv_sweep import sweep_configs
    from strata.kernels.moe.decode import SPECS

    configs = sweep_configs("matvec", SPECS["Q2_0"], 24, 256, 1, family="words")  # (streams: test_stream_gemv.py)
    assert configs[0].wide and not configs[-1].wide  # the default first, the byte kernel last
    assert len(set(configs)) == len(configs) and {c.split for c in configs} >= {1, 2, 4}
    out = io.StringIO()
    assert bench_one(256, 24, "Q2_0", DEVICE, 1e9, out, sweep="words"), out.getvalue()
    sweeps = [line for line in out.getvalue().splitlines() if line.lstrip().startswith("sweep")]
    assert len(sweeps) == len(configs) and "1.00x default" in sweeps[0] and "FAIL" not in out.getvalue()


def test_matvec_oneshot_sweep_over_a_window_checks_every_config():
    from strata.bench.gemv_sweep import sweep_configs
    from strata.kernels.moe.decode import SPECS

    configs = sweep_configs("matvec", SPECS["Q4_0"], 8, 128, 1, family="oneshot")
    assert all(c.oneshot for c in configs)  # the default (a measured one-shot tile) first, then the sweep's tiles
    assert {c.split for c in configs} >= {1, 2, 3} and len(set(configs)) == len(configs)
    out = io.StringIO()
    assert bench_one(128, 8, "Q4_0", DEVICE, 1e9, out, sweep="oneshot", n_rows=2), out.getvalue()
    sweeps = [line for line in out.getvalue().splitlines() if line.lstrip().startswith("sweep")]
    assert len(sweeps) == len(configs) and "x2" in sweeps[0] and "FAIL" not in out.getvalue()
    assert all("oneshot" in line for line in sweeps[1:])
