"""Copy-then-compute misses (`kernels/moe/miss_copy.py`): the gather launch under Triton's interpreter against its
torch definition (the same slots and table entries, byte for byte), and the GEMVs over the copied slots against the
GEMVs reading the host stacks in place (the same bytes: the same kernels, tiles and sums) and float64."""

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.moe.gemv import (ERROR_BOUND, DecodeExperts, GemvConfig, moe_gemv_float64, moe_gemv_triton,
                                     relative_error)
from strata.kernels.moe.miss_copy import (DOWN, GATE_UP, CopyConfig, copy_misses_ref, launch_copy_misses,
                                         scratch_bytes)

SMALL = CopyConfig(chunk=512, warps=1)  # under the interpreter: a few programs a part, the last chunk partial


def _layer(fmt="Q4_0", n_experts=6, embd=128, ff=64, seed=71):
    from strata.bench.moe_decode import synthetic_stack

    return DecodeExperts.of_stack(synthetic_stack(fmt, fmt, n_experts, embd, ff, seed=seed))


def _missing(n_experts, missed):
    return torch.tensor([e if e in missed else -1 for e in range(n_experts)], dtype=torch.int32)


def test_the_gather_launch_matches_its_definition(device):
    host = _layer(n_experts=6, embd=256, ff=128)  # gate/up parts of 128 * 144 B: 4608 words, 9 chunks of 512
    ids = torch.tensor([[4, 1, 5], [1, 2, 4]], dtype=torch.int32)  # expert 4 and 1 twice: copied once each
    missing = _missing(6, {1, 4, 3})
    slot = scratch_bytes(host)
    want_scratch = torch.zeros(6, slot, dtype=torch.uint8)
    want_table = torch.full((6,), 7, dtype=torch.int32)
    copy_misses_ref(ids, missing, host, want_scratch, want_table)
    assert want_table.tolist() == [7, 1, -1, 7, 0, -1]  # first pairs of the missed, -1 for hits, others untouched
    assert want_scratch[[0, 1]].bool().any(dim=1).all() and not want_scratch[[2, 3, 4, 5]].any()
    g = host.gate
    assert torch.equal(want_scratch[0, : g.expert_bytes], g.raw[4 * g.stride: 4 * g.stride + g.expert_bytes])
    scratch = torch.zeros_like(want_scratch).to(device)
    table = torch.full((6,), 7, dtype=torch.int32, device=device)
    on_device = DecodeExperts.of_stack(_to(host, device))
    launch_copy_misses(ids.to(device), missing.to(device), on_device, scratch, table, SMALL)
    assert torch.equal(scratch.cpu(), want_scratch) and torch.equal(table.cpu(), want_table)
    # In two launches (gate/up, then down: the overlapped schedule), the same slots and table.
    scratch.zero_()
    table.fill_(7)
    for parts in (GATE_UP, DOWN):
        launch_copy_misses(ids.to(device), missing.to(device), on_device, scratch, table, SMALL, parts)
    assert torch.equal(scratch.cpu(), want_scratch) and torch.equal(table.cpu(), want_table)
    halves = torch.zeros_like(want_scratch)
    copy_misses_ref(ids, missing, host, halves, table.cpu().fill_(7), GATE_UP)
    assert not halves[:, 2 * g.expert_bytes:].any() and torch.equal(halves[:, : 2 * g.expert_bytes],
                                                                    want_scratch[:, : 2 * g.expert_bytes])


def _to(host, device):
    from types import SimpleNamespace

    def part(m):
        n = m.raw.numel() // m.stride
        raw = m.raw.to(device).reshape(n, m.rows, -1)
        return SimpleNamespace(raw=raw, ggml_type=m.qtype, shape=(n, m.rows, m.cols))

    return SimpleNamespace(gate=part(host.gate), up=part(host.up), down=part(host.down))


@pytest.mark.parametrize("fmt", ["Q2_0", "Q4_0"])
def test_copied_misses_give_the_zero_copy_bytes(device, fmt):
    """The hits' tiles over copied slots = the same tiles over the host stack in place, bit for bit."""
    n = 6
    host = _layer(fmt, n_experts=n, embd=128, ff=128, seed=72)
    dev = DecodeExperts.of_stack(_to(host, device))
    ids = torch.tensor([[0, 3, 5]], dtype=torch.int32, device=device)
    w = torch.softmax(torch.randn(1, 3, generator=torch.Generator().manual_seed(73)), dim=-1).to(device)
    x = torch.randn(1, 128, generator=torch.Generator().manual_seed(74)).to(device)
    missing = _missing(n, {3, 5, 1}).to(device)
    tiles = (GemvConfig(bn=32, ns=4, warps=4, wide=True, oneshot=True), GemvConfig(bn=64, ns=4, warps=4,
                                                                                    wide=True, oneshot=True))
    in_place = moe_gemv_triton(x, ids, w, DecodeExperts(dev.gate, dev.up, dev.down, missing), torch.float32, tiles)
    scratch = torch.zeros(3, scratch_bytes(dev), dtype=torch.uint8, device=device)
    table = torch.full((n,), -1, dtype=torch.int32, device=device)
    launch_copy_misses(ids, missing, dev, scratch, table, SMALL)
    stack = _to(host, device)
    copied = moe_gemv_triton(x, ids, w, DecodeExperts.of_slots(scratch, table, stack), torch.float32, tiles)
    assert torch.equal(copied, in_place)
    missed = torch.tensor([[0.0, 1.0, 1.0]], device=device)
    _, y64 = moe_gemv_float64(x.cpu(), ids.cpu(), (w * missed).cpu(), host)
    assert relative_error(copied, y64) <= ERROR_BOUND


def test_unaligned_experts_are_one_line(device):
    host = _layer("Q4_0", n_experts=2, embd=64, ff=32)  # 32 rows of 36 B: 1152 B an expert, fine; shift the base
    odd = torch.zeros(host.gate.raw.numel() + 4, dtype=torch.uint8)[4:]
    bad = DecodeExperts(type(host.gate)(odd, host.gate.qtype, host.gate.rows, host.gate.cols, host.gate.stride + 4),
                        host.up, host.down)
    with pytest.raises(StrataError, match="16-byte aligned"):
        launch_copy_misses(torch.zeros(1, 1, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), bad,
                    torch.zeros(1, 4096, dtype=torch.uint8), torch.zeros(2, dtype=torch.int32), SMALL)


def test_the_gather_builds_for_sm90_with_16_byte_loads():
    """Every load and store of expert bytes is a v4 of 32-bit words (one 16-byte access a thread; a warp asks for
    512 contiguous bytes): the point of the copy path. Only the routing (ids, the missing table) is read narrower."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton build carries no ptxas")
    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("miss_copy_build.py"))], cwd=root, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    built = json.loads(run.stdout.splitlines()[-1])
    wide = [op for op in built["loads"] if ".v4." in op]
    assert len(wide) >= 8 and len(built["loads"]) - len(wide) <= 3, built["loads"]  # + ids, routed ids, missing
    assert built["stores"] and all(".v4." in op or ".b32" in op for op in built["stores"]), built["stores"]
    assert sum(".v4." in op for op in built["stores"]) == len(wide)
