"""The hyper-connection read's kernels (kernels/hc: the write + statistics, down + inject, up + gate + mix) against
the torch reference of models/hyper_connections.py and against float64, with the bounds stated; and a window's
rows computed as a one-row call computes them, bit for bit."""

import pytest
import torch
import torch.nn.functional as F

from strata import switches
from strata.kernels.hc.down_inject import down_inject_triton
from strata.kernels.hc.read import hc_read_triton
from strata.kernels.hc.write_stats import write_stats_triton
from strata.models import layers
from strata.models.hyper_connections import HyperConnectionWeights, hc_read, hc_write, hc_write_read
from strata.models.weights import QuantWeight
from tests.kernels.pointwise.common import rand

HC, EMBD, RANK = 4, 64, 16
EPS = 1e-6
# Float32 arithmetic in another order than float64's (sums over hc*embd products, exp in sigmoid/SiLU): relative to
# the output's largest value, well within 1e-5 (a float32 step is 6e-8; the sums here are 256 terms long).
BOUND = 1e-5
# A prompt's read on CUDA runs its GEMMs on TF32 (hyper_connections._tf32; STRATA_HC_FP32 keeps float32): their
# inputs keep 10 of float32's 23 mantissa bits (each within 2^-11), so a 256-term sum sits within a few of that of
# its largest value (the H200: 5.6e-5 for mixed, 2.0e-4 for inject).
TF32_BOUND = 2 ** -9


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)  # CPU tensors take the kernels (interpreted) as CUDA ones do


def _float_weight(name, t):
    """A BF16 GGUF matrix (type 30) as the loader keeps it: its bytes, viewed."""
    t = t.to(torch.bfloat16).contiguous()
    return QuantWeight(name, 30, tuple(t.shape), t.view(torch.uint8).reshape(t.shape[0], -1))


def _weights(seed, embd=EMBD, rank=RANK, inject=True):
    width = HC * embd
    return HyperConnectionWeights(
        norm=(1 + 0.2 * rand((width,), seed, torch.float32)),
        down=_float_weight("down", rand((rank, width), seed + 1, torch.float32, 0.1)),
        up=_float_weight("up", rand((width, rank), seed + 2, torch.float32, 0.5)),
        inject=_float_weight("inject", rand((HC, width), seed + 3, torch.float32, 0.1)) if inject else None)


def _fused_read(residual, w, pending=None, dtype=torch.float32):
    inject = None if w.inject is None else w.inject.dequantize(torch.bfloat16)
    return hc_read_triton(residual, w.norm, w.down.dequantize(torch.bfloat16), w.up.dequantize(torch.bfloat16),
                          inject, EPS, dtype, pending)


def _stack(n_rows, seed, embd=EMBD):
    return rand((n_rows, HC, embd), seed, torch.float32, 2)


def _read_float64(residual, w, eps):
    """models/hyper_connections.hc_read in float64 throughout."""
    n_rows, hc, embd = residual.shape
    x = residual.double()
    xn = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w.norm.double().view(hc, embd)
    flat = xn.reshape(n_rows, -1)
    low = F.silu(flat @ w.down.dequantize(torch.float64).T / hc)
    gate = torch.sigmoid(low @ w.up.dequantize(torch.float64).T).view_as(xn)
    inject = flat @ w.inject.dequantize(torch.float64).T if w.inject is not None else None
    return (xn * gate).mean(1), inject


def _rel(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@pytest.mark.parametrize("n_rows", [1, 2, 4])
def test_write_stats_matches_float64(n_rows):
    residual, y = _stack(n_rows, 1), rand((n_rows, EMBD), 2, torch.bfloat16, 3)
    inject = rand((n_rows, HC), 3, torch.float32, 4)
    got, rstd, _ = write_stats_triton(residual, EPS, y, inject)
    exact = residual.double() + y.double()[:, None, :] * (2 * torch.sigmoid(inject.double() / HC))[:, :, None]
    assert _rel(got, exact) < BOUND
    want_rstd = torch.rsqrt(exact.square().mean(-1) + EPS)
    assert ((rstd.double() - want_rstd).abs() <= BOUND * want_rstd).all()
    assert torch.allclose(got, hc_write(residual, y, inject), rtol=1e-6, atol=1e-6)
    same, rstd_alone, _ = write_stats_triton(residual, EPS)  # no pending write: statistics only, R untouched
    assert same is residual
    assert torch.allclose(rstd_alone.double(), torch.rsqrt(residual.double().square().mean(-1) + EPS), rtol=BOUND)


def _assert_float64_read(residual, w, pending, got, with_inject: bool, bound: float = BOUND):
    """A read with its pending write (new residual, mixed float32, inject) against the float64 write and read; the
    write is elementwise (BOUND), the read's GEMMs within `bound`."""
    new_residual, mixed, inject = got
    exact_residual = residual.double() + pending[0].double()[:, None, :] * (
        2 * torch.sigmoid(pending[1].double() / HC))[:, :, None]
    assert _rel(new_residual, exact_residual) < BOUND
    exact_mixed, exact_inject = _read_float64(exact_residual, w, EPS)
    assert mixed.dtype == torch.float32 and _rel(mixed, exact_mixed) < bound
    assert (inject is None) == (not with_inject)
    if with_inject:
        assert _rel(inject, exact_inject) < bound


def _gemm_modes(t: torch.Tensor):
    """(STRATA_HC_FP32, the bound of a prompt read's GEMMs) for the modes a read over t can take: on CUDA, TF32
    (the default) and float32; on the CPU, float32 only (TF32 is CUDA's)."""
    return ((False, TF32_BOUND), (True, BOUND)) if t.is_cuda else ((False, BOUND),)


@pytest.mark.parametrize("n_rows", [1, 3, 4])
@pytest.mark.parametrize("with_inject", [True, False])
def test_fused_read_matches_torch_and_float64(n_rows, with_inject):
    w = _weights(10, inject=with_inject)
    residual, y = _stack(n_rows, 4), rand((n_rows, EMBD), 5, torch.float32)
    pending = (y, rand((n_rows, HC), 6, torch.float32, 4))
    new_residual, mixed, inject = _fused_read(residual, w, pending)
    _assert_float64_read(residual, w, pending, (new_residual, mixed, inject), with_inject)
    want_mixed, want_inject = hc_read(new_residual, w, EPS)  # the torch reference (hc_read is always torch)
    assert _rel(mixed, want_mixed) < BOUND
    if with_inject:
        assert _rel(inject, want_inject) < BOUND


def test_mixed_in_the_compute_dtype():
    """The cast after the read happens in the kernel: the float32 result rounded once (interpreted: truncated)."""
    w, residual = _weights(20), _stack(2, 7)
    _, mixed32, _ = _fused_read(residual, w)
    _, mixed16, _ = _fused_read(residual, w, dtype=torch.bfloat16)
    assert mixed16.dtype == torch.bfloat16
    assert ((mixed16.float() - mixed32).abs() <= 2 ** -7 * mixed32.abs()).all()


def test_window_rows_equal_one_row_calls():
    """A verify window's row must be the one-row step's, bit for bit: each program computes one row."""
    w, residual = _weights(30), _stack(4, 8)
    pending = (rand((4, EMBD), 9, torch.bfloat16, 2), rand((4, HC), 10, torch.float32, 3))
    together = hc_write_read(residual, w, EPS, pending, torch.bfloat16)
    for r in range(4):
        alone = hc_write_read(residual[r:r + 1], w, EPS, (pending[0][r:r + 1], pending[1][r:r + 1]), torch.bfloat16)
        for got, want in zip(alone, together):
            assert torch.equal(got, want[r:r + 1])


def test_down_inject_tiles_and_masks():
    """An embd that no tile divides (48: 192 inputs, 128 a step) and output tiles straddling down and inject."""
    embd, rank = 48, 12
    w, residual = _weights(40, embd=embd, rank=rank), _stack(2, 11, embd=embd)
    _, _, xn = write_stats_triton(residual, EPS, norm=w.norm)
    down, inject = (m.dequantize(torch.bfloat16) for m in (w.down, w.inject))
    lo, injected = down_inject_triton(xn, down, inject, block_n=8, block_k=128)
    x = residual.double()
    flat = (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * w.norm.double().view(HC, embd)).flatten(1)
    assert _rel(lo, F.silu(flat @ down.double().T / HC)) < BOUND
    assert _rel(injected, flat @ inject.double().T) < BOUND
    unrolled = down_inject_triton(xn, down, inject, block_n=8, block_k=128, unroll=True)
    assert torch.equal(unrolled[0], lo) and torch.equal(unrolled[1], injected)  # the same sums in the same order


def test_dispatch_takes_the_kernels_below_float32_only(monkeypatch):
    """hc_write_read: few rows of a bf16/fp16 model take the kernels (same bytes as calling them); a float32 model
    (the exact mode) and STRATA_HC_TORCH keep the torch reference, byte for byte."""
    import strata.kernels.hc.read as read

    calls = []
    monkeypatch.setattr(read, "hc_read_triton", lambda *a, **k: calls.append(1) or hc_read_triton(*a, **k))
    w, residual = _weights(50), _stack(5, 12)
    pending = (rand((5, EMBD), 13, torch.bfloat16, 2), rand((5, HC), 14, torch.float32, 3))
    got = hc_write_read(residual[:4], w, EPS, (pending[0][:4], pending[1][:4]), torch.bfloat16)
    assert calls == [1]
    for a, b in zip(got, _fused_read(residual[:4], w, (pending[0][:4], pending[1][:4]), torch.bfloat16)):
        assert torch.equal(a, b)
    cases = ((4, torch.float32, pending[0].float(), False), (4, torch.bfloat16, pending[0], True))
    for rows, dtype, y, torch_switch in cases:
        with switches.override(STRATA_HC_TORCH=torch_switch):
            got = hc_write_read(residual[:rows], w, EPS, (y[:rows], pending[1][:rows]), dtype)
        layers.FUSED_ON_CPU = False
        written = residual[:rows] + y[:rows].float()[:, None, :] * (
            2 * torch.sigmoid(pending[1][:rows] / HC))[:, :, None]
        mixed, inject = hc_read(written, w, EPS)
        layers.FUSED_ON_CPU = True
        assert calls == [1] and torch.equal(got[0], written)
        assert torch.equal(got[1], mixed.to(dtype)) and torch.equal(got[2], inject)


def test_f32_weights_read_as_stored():
    """A file may keep the hyper-connection matrices in F32 (type 0): the kernels read them as they are."""
    w = _weights(60)
    as_f32 = [QuantWeight(m.name, 0, m.shape, m.dequantize(torch.float32).contiguous().view(torch.uint8)
                          .reshape(m.shape[0], -1)) for m in (w.down, w.up, w.inject)]
    w32 = HyperConnectionWeights(w.norm, *as_f32)
    residual = _stack(2, 15)
    got = hc_write_read(residual, w32, EPS, None, torch.bfloat16)
    want = _fused_read(residual, w, None, torch.bfloat16)  # the same values, read from BF16
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # Compiled, F32 and BF16 loads may lay a row out across threads differently, so the float32 sums of the
    # inject dot may take another order there (seen on the H200): equal to an ulp-level bound, not bit for bit.
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-6 * want[2].abs().max().item())


@pytest.mark.parametrize("with_inject", [True, False])
def test_prompt_read_matches_float64(monkeypatch, with_inject):
    """Past MAX_ROWS (a prompt): the GEMMs as torch runs them, the write + statistics + normalised stack in one
    row-wise kernel and the gate + mean + cast in another."""
    import strata.kernels.hc.gate_mix as gate_mix
    from strata.models.hyper_connections import _read_many_rows

    calls = []
    kernel = gate_mix.gate_mix_triton
    monkeypatch.setattr(gate_mix, "gate_mix_triton", lambda *a, **k: calls.append(a[0].shape[0]) or kernel(*a, **k))
    w, residual = _weights(70, inject=with_inject), _stack(7, 16)
    pending = (rand((7, EMBD), 17, torch.bfloat16, 2), rand((7, HC), 18, torch.float32, 3))
    mixed_by_mode = {}
    for fp32, bound in _gemm_modes(residual):
        with switches.override(STRATA_HC_FP32=fp32):
            new_residual, mixed, inject = _read_many_rows(residual, w, EPS, pending, torch.float32)  # to check
        _assert_float64_read(residual, w, pending, (new_residual, mixed, inject), with_inject, bound)
        mixed_by_mode[fp32] = mixed
    mixed, modes = mixed_by_mode[False], len(mixed_by_mode)  # the default mode's, as the bf16 read below takes it
    assert calls == [7] * modes
    _, mixed16, _ = hc_write_read(residual, w, EPS, pending, torch.bfloat16)  # a bf16 model's prompt takes it
    assert calls == [7] * (modes + 1) and mixed16.dtype == torch.bfloat16
    assert ((mixed16.float() - mixed).abs() <= 2 ** -7 * mixed.abs()).all()


def test_quantized_matrices_take_the_row_wise_kernels():
    """Q8_0 hyper-connection matrices on few rows: the matvecs as `linear` runs them (no float view to stream), the
    elementwise work still in the two row-wise kernels; the same values as the torch lines."""
    from strata.quant.registry import quantize

    def q8(m):
        values = m.dequantize(torch.float32)
        return QuantWeight(m.name, 8, m.shape, torch.from_numpy(quantize(values.cpu().numpy(), 8)).to(values.device))

    w = _weights(80, rank=32)  # Q8_0 blocks are 32 wide
    wq = HyperConnectionWeights(w.norm, q8(w.down), q8(w.up), q8(w.inject))
    residual = _stack(3, 19)
    pending = (rand((3, EMBD), 20, torch.bfloat16, 2), rand((3, HC), 21, torch.float32, 3))
    for fp32, bound in _gemm_modes(residual):  # Q8_0 on float32 rows: dequantized, then torch's GEMM
        with switches.override(STRATA_HC_FP32=fp32):
            new_residual, mixed, inject = hc_write_read(residual, wq, EPS, pending, torch.bfloat16)
        exact_mixed, exact_inject = _read_float64(new_residual.double(), wq, EPS)
        assert mixed.dtype == torch.bfloat16 and _rel(mixed, exact_mixed) < 2 ** -7
        assert _rel(inject, exact_inject) < bound


def test_prompt_gemms_take_tf32_only_inside_the_read():
    # The TF32 setting is global to torch: the read sets it for its own GEMMs and gives the caller's back, also when
    # the read fails; off (STRATA_HC_FP32, or a CPU stack) it leaves it alone.
    from strata.models.hyper_connections import _tf32

    matmul = torch.backends.cuda.matmul
    read = (lambda: matmul.fp32_precision) if hasattr(matmul, "fp32_precision") else (lambda: matmul.allow_tf32)
    before = read()
    with _tf32(True):
        assert read() in ("tf32", True)
    assert read() == before
    with pytest.raises(RuntimeError):
        with _tf32(True):
            raise RuntimeError("a failing GEMM")
    assert read() == before
    with _tf32(False):
        assert read() == before
