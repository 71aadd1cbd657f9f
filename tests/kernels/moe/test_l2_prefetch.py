"""STRATA_L2_PREFETCH (kernels/l2_prefetch.py): the experts' one-shot gate/up programs bring other tensors' bytes to
the L2 before their PDL wait. Checked: the programs' lines cover both tensors' bytes exactly (addresses computed by
the kernels' own helper), a gate/up launch with a prefetch gives the bytes of one without, the decoder names layer
i + 1's attention weights only under the switch, and the sm_90 build carries the prefetch (CCTL) without spills.
Run as a script, this file builds the kernel for sm_90 and prints its JSON line.
"""

import json
import os
import re

if __name__ == "__main__":  # building for the GPU: Triton imported before strata.kernels can switch the interpreter on
    os.environ.pop("TRITON_INTERPRET", None)
    import triton  # noqa: F401

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from strata.kernels import l2_prefetch  # noqa: E402
from strata.kernels.moe.gemv import DecodeExperts, GemvConfig, gate_up_swiglu_triton  # noqa: E402
from tests.kernels.sm90 import builds_of, needs_ptxas  # noqa: E402


@triton.jit
def _lines_kernel(a, lines_a, b, lines_b, out, PER: tl.constexpr):
    p = tl.program_id(0)
    tl.store(out + p * PER + tl.arange(0, PER), l2_prefetch.share_lines(a, lines_a, b, lines_b, p, PER))


@pytest.mark.parametrize("sizes, programs", [((1000, 3000), 7), ((4096, 0), 3), ((128 * 40, 129), 64)])
def test_the_programs_lines_cover_both_tensors(device, sizes, programs):
    tensors = [torch.zeros(n, dtype=torch.uint8, device=device) for n in sizes]
    region = l2_prefetch.regions(tensors)
    per = l2_prefetch.per_program(region, programs)
    out = torch.empty(programs * per, dtype=torch.int64, device=device)
    _lines_kernel[(programs,)](*region, out, PER=per)
    want = {t.data_ptr() + 128 * i for t in tensors for i in range(-(-t.numel() // 128))}
    assert set(out.tolist()) == want


def test_no_tensor_no_region():
    assert l2_prefetch.regions([]) == () and l2_prefetch.regions([torch.empty(0)]) == ()


def test_a_gate_up_launch_with_a_prefetch_gives_the_same_bytes(device):
    from strata.bench.moe_decode import routing, synthetic_stack

    stack = synthetic_stack("Q4_0", "Q4_0", 4, 128, 64, seed=71, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(72)
    ids, _ = routing(1, 2, 4, gen, shared=0)
    x = torch.randn(1, 128, generator=gen).to(device)
    ids = ids.to(device)
    config = GemvConfig(bn=16, ns=4, warps=4, wide=True, split=1, oneshot=True)
    others = (torch.randn(300, device=device), torch.zeros(5000, dtype=torch.uint8, device=device))
    plain = gate_up_swiglu_triton(x, ids, experts, config)
    assert torch.equal(gate_up_swiglu_triton(x, ids, experts, config, prefetch=others), plain)


def test_the_decoder_names_the_next_layers_attention_weights(model_dir):
    from strata import switches
    from strata.engine.engine import Engine, EngineConfig
    from strata.models.synthetic import make_model

    path = make_model(model_dir / "tiny-qwen3moe-prefetch.gguf", arch="qwen3moe", preset="tiny", quant="Q4_0")
    model = Engine(path, EngineConfig(device="cpu")).model
    assert model.experts.next_weights == model.next_dense_weights
    assert model.next_dense_weights(0) == ()  # unset
    with switches.override(STRATA_L2_PREFETCH=True):
        w = model.attention[1]
        names = model.next_dense_weights(0)
        assert len(names) == 2 and names[0] is (w.qkv if w.qkv is not None else w.q).raw and names[1] is w.o.raw
        assert model.next_dense_weights(model.n_main_layers - 1) == ()  # the last layer: no next one


def _build_sm90():
    from strata.kernels.moe import oneshot_gemv
    from strata.kernels.moe.decode import SPECS
    from tests.kernels.sm90 import cubin_report

    constants = {**oneshot_gemv._constants(SPECS["Q4_0"], 768, 2048, 1, False, 8, 1), "TOP_K": 8, "PF_PER": 128}
    signature = {"x": "*bf16", "ids": "*i32", "slot_of": "*i32", "wg": "*u8", "wu": "*u8", "hid": "*fp32",
                 "stride_g": "i64", "stride_u": "i64", "pf_a": "*u8", "lines_a": "i32", "pf_b": "*u8",
                 "lines_b": "i32"}
    regs, stack, sass = cubin_report(oneshot_gemv._oneshot_gate_up_kernel, signature, constants, 4,
                                     unaligned=("stride_g", "stride_u", "lines_a", "lines_b"))
    print(json.dumps({"regs": regs, "stack": stack, "prefetches": len(re.findall(r"CCTL\.E\.PML2", sass))}))


@needs_ptxas
def test_the_gate_up_kernel_with_prefetch_builds_for_sm90():
    (build,) = builds_of(__file__)
    assert build["stack"] == 0 and build["prefetches"] >= 1, build


if __name__ == "__main__":
    _build_sm90()
