import io

from strata.bench.matvec import bench_one
from tests.kernels import DEVICE


def test_matvec_bench_row_passes_at_a_tiny_shape():
    out = io.StringIO()
    assert bench_one(64, 24, "Q4_0", DEVICE, 1e9, out), out.getvalue()
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["bytes", "words"] and "FAIL" not in out.getvalue()
