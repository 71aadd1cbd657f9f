"""The dp4a GEMVs launched with STRATA_PDL's options (`pdl=True`, as the decode step launches them): the same bytes
as without (the dense matvec loads its weights before the wait, the routed forms wait first; on the CPU the waits
are the interpreter's no-ops, forced on through kernels/pdl.py's FORCE_ON_CPU; on a GPU the real instructions)."""

import pytest
import torch

from strata import switches
from strata.kernels import pdl
from strata.kernels.moe.dp4a_gemv import dp4a_down, dp4a_gate_up, dp4a_matvec, quantize_x
from tests.kernels.moe.test_dp4a_gemv import q4_0


@pytest.mark.parametrize("mode", [1, 2])
def test_pdl_launches_give_the_same_bytes(device, monkeypatch, mode):
    monkeypatch.setattr(pdl, "FORCE_ON_CPU", True)
    gen = torch.Generator().manual_seed(5)
    n_experts, embd, ff, top_k = 4, 64, 32, 2
    dense, _ = q4_0(1, 24, embd, seed=6)
    gate, _ = q4_0(n_experts, ff, embd, seed=7)
    up, _ = q4_0(n_experts, ff, embd, seed=8)
    down, _ = q4_0(n_experts, embd, ff, seed=9)
    dense, gate, up, down = (t.to(device) for t in (dense, gate, up, down))
    xq = quantize_x(torch.randn(2, embd, generator=gen).to(device))
    ids = torch.tensor([[0, 3], [2, 1]], dtype=torch.int32, device=device)
    weights = torch.rand(2, top_k, generator=gen).to(device)
    stride_gu, stride_d = ff * embd // 32 * 18, embd * ff // 32 * 18

    def run(on: bool):
        y = dp4a_matvec(xq, dense, 24, pdl=on)
        hid = dp4a_gate_up(xq, ids, gate, up, stride_gu, ff, pdl=on)
        out = torch.empty(2, embd, dtype=torch.bfloat16, device=device)  # the step's: the store rounds
        hq = dp4a_gate_up(xq, ids, gate, up, stride_gu, ff, pdl=on, rounded="codes")  # the step's: H's codes
        return y, hid, dp4a_down(hq, ids, weights, down, stride_d, embd, y=out, pdl=on), *hq

    with switches.override(STRATA_PDL=mode):
        assert pdl.mode_for(xq[0]) == mode
        with_pdl = run(True)
    without = run(False)
    assert with_pdl[2].dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(with_pdl, without))
