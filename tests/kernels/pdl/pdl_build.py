"""Build the decode step's PDL kernels for sm_90 without a GPU and print, per kernel and form, where the grid
dependency instructions sit in the PTX: one JSON line each.

Run as a script in a process without TRITON_INTERPRET (test_pdl_build.py does): Triton then compiles to PTX with
its bundled tools. Shapes are the A3B decode step's (2048 wide, 32/4 heads of 128, 128 experts, top 8, Q4_0).
`python3 tests/kernels/pdl_build.py --ptx DIR` also writes each form's PTX there (to compare builds by hand).
"""

import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402  (before strata.kernels, which would switch the interpreter on)
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from strata.kernels.attention import decode_short  # noqa: E402
from strata.kernels.moe import oneshot_gemv, wide_gemv  # noqa: E402
from strata.kernels.moe.decode import SPECS  # noqa: E402
from strata.kernels.pointwise import (add_norm_route, add_rms_norm, qk_norm_rope_store, rms_norm,  # noqa: E402
                                      shared_gate_add_norm)

EMBD, HEADS, KV_HEADS, DIM, EXPERTS, TOP_K, FF = 2048, 32, 4, 128, 128, 8, 768
BF16 = "*bf16"


def _ptx(kernel, signature: dict, constants: dict, **options) -> str:
    aligned = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in signature.items()
               if kind.startswith("*")}
    full = {**signature, **{name: "constexpr" for name in constants}}
    return triton.compile(ASTSource(kernel, full, constants, aligned), target=GPUTarget("cuda", 90, 32),
                          options=options).asm["ptx"]


def _oneshot(kind: str):
    """(kernel, signature, constexprs, warps) of the A3B step's one-shot launches: "qkv" (the dense matvec), "down"
    (the experts'), "gate_up"."""
    spec = SPECS["Q4_0"]
    if kind == "gate_up":
        c = oneshot_gemv._constants(spec, FF, EMBD, 1, False, 8, 1)
        c["TOP_K"] = TOP_K
        sig = {"x": BF16, "ids": "*i32", "slot_of": "*i32", "wg": "*u8", "wu": "*u8", "hid": "*fp32",
               "stride_g": "i64", "stride_u": "i64"}
        return oneshot_gemv._oneshot_gate_up_kernel, sig, c, 4
    shared = kind == "qkv"
    n_out, n_in, top_k = ((HEADS + 2 * KV_HEADS) * DIM, EMBD, 1) if shared else (EMBD, FF, TOP_K)
    c = oneshot_gemv._constants(spec, n_out, n_in, top_k, False, 8, 1)
    c.update(ROWS=1, SHARED=shared)
    sig = {"h": BF16 if shared else "*fp32", "ids": "*i32", "topk_w": "*fp32", "slot_of": "*i32", "wd": "*u8",
           "y": BF16, "stride_d": "i64"}
    return oneshot_gemv._oneshot_down_kernel, sig, c, 16


def kernels():
    """name -> (kernel, signature, constexprs, warps, the constexprs a PDL launch adds beside PDL)."""
    rows = {"h_ptr": BF16, "d_ptr": BF16, "nw_ptr": BF16, "router_ptr": BF16, "res_ptr": BF16, "out_ptr": BF16,
            "logits_ptr": "*fp32", "count_ptr": "*i32", "weights_ptr": "*fp32", "ids_ptr": "*i32", "n_cols": "i32",
            "n_experts": "i32", "eps": "fp32"}
    qk = {**{n: BF16 for n in ("q_ptr", "k_ptr", "v_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "q_out")},
          "pos_ptr": "*i32", "page_table_ptr": "*i32", **{n: "*fp16" for n in ("kc_ptr", "vc_ptr", "ks_ptr", "vs_ptr")},
          **{n: "i32" for n in ("n_heads", "n_kv_heads", "q_token_stride", "q_head_stride", "k_token_stride",
                                "v_token_stride")}, "eps": "fp32"}
    attn = {"q_ptr": BF16, "ids_ptr": "*i32", "width_ptr": "*i32", "page_table_ptr": "*i32",
            **{n: "*fp16" for n in ("k_ptr", "v_ptr", "ks_ptr", "vs_ptr")}, "acc_ptr": "*fp32", "ml_ptr": "*fp32",
            "count_ptr": "*i32", "out_ptr": BF16, "cap": "i32", "n_kv_heads": "i32", "scale_log2": "fp32"}
    attn_c = dict(G=HEADS // KV_HEADS, BM=16, D=DIM, CH=32, SPLITS=2, INT8=False, DENSE=True, QK="tf32",
                  PV="tf32x3", BY_SPAN=False, PER=0, CELLS=64, MAX_SPLITS=16)
    yield "add_rms_norm", (add_rms_norm._add_rms_norm_kernel,
                           {"h_ptr": BF16, "d_ptr": BF16, "w_ptr": BF16, "res_ptr": BF16, "out_ptr": BF16,
                            "n_cols": "i32", "eps": "fp32"}, dict(BLOCK=EMBD), 8, {})
    yield "shared_gate_add_norm", (shared_gate_add_norm._shared_gate_add_norm_kernel,
                                   {n: BF16 for n in ("routed_ptr", "shared_ptr", "x_ptr", "gate_ptr", "h_ptr", "nw_ptr",
                                                      "res_ptr", "out_ptr")} | {"n_cols": "i32", "eps": "fp32"},
                                   dict(BLOCK=EMBD), 8, {})
    yield "rms_norm", (rms_norm._rms_norm_kernel, {"x_ptr": BF16, "w_ptr": BF16, "out_ptr": BF16, "n_cols": "i32",
                                                   "x_row_stride": "i32", "eps": "fp32"}, dict(BLOCK=EMBD), 8, {})
    yield "add_norm_route", (add_norm_route._add_norm_route_kernel, rows,
                             dict(BLOCK=EMBD, EB=4, PROGRAMS=EXPERTS // 4, K=TOP_K, NORMALIZE=True, EBLOCK=EXPERTS,
                                  KB=TOP_K), 8, {})
    yield "qk_norm_rope_store", (qk_norm_rope_store._qk_norm_rope_store_kernel, qk,
                                 dict(DIM=DIM, HALF=DIM // 2, BLOCK=DIM, PAGED=False, INT8=False), 1, {})
    yield "decode_short", (decode_short._decode_short_kernel, attn, attn_c, 4, {})
    for kind in ("qkv", "down", "gate_up"):
        kernel, sig, c, warps = _oneshot(kind)
        yield f"oneshot_{kind}", (kernel, sig, c, warps, {"AHEAD": 1} if kind == "qkv" else {})
    kernel, sig, c, warps = _oneshot("down")
    yield "oneshot_down_routing_ahead", (kernel, sig, c, warps, {"AHEAD": 2})  # STRATA_PDL=3's experts' down
    yield "split_sum", (wide_gemv._split_sum_kernel, {"part": "*fp32", "out": "*fp32", "n": "i32"},
                        dict(SPLIT=2, SWIGLU=False, BLOCK=1024), 4, {})


def placement(ptx: str) -> dict:
    """Where the grid dependency instructions sit among the global loads and stores of the PTX body."""
    lines = [re.sub(r"^@!?%p\d+\s+", "", line.strip()) for line in ptx.splitlines()]  # predicates off

    def first(prefix: str) -> int:
        return next((i for i, line in enumerate(lines) if line.startswith(prefix)), -1)

    wait = first("griddepcontrol.wait")
    loads = [i for i, line in enumerate(lines) if line.startswith("ld.global")]
    return {"waits": sum(line.startswith("griddepcontrol.wait") for line in lines),
            "loads": len(loads), "loads_before_wait": sum(i < wait for i in loads),
            "triggers": sum(line.startswith("griddepcontrol.launch_dependents") for line in lines),
            "first_wait": first("griddepcontrol.wait"), "first_trigger": first("griddepcontrol.launch_dependents"),
            "first_load": min((i for i, line in enumerate(lines) if line.startswith("ld.global")), default=-1),
            "first_store": min((i for i, line in enumerate(lines)
                                if line.startswith(("st.global", "atom.global", "red.global"))), default=-1)}


def main(argv: list[str]) -> None:
    out_dir = argv[argv.index("--ptx") + 1] if "--ptx" in argv else None
    modes = [0, 1, 2] if "--modes" in argv else [0, 1]
    for name, (kernel, sig, constants, warps, early) in kernels():
        for mode in modes:
            extra = {"PDL": mode, **early} if mode else {}
            options = {"num_warps": warps}
            if name == "decode_short":
                options["num_stages"] = 2
            if mode:
                options["launch_pdl"] = True
            ptx = _ptx(kernel, sig, {**constants, **extra}, **options)
            if out_dir:
                with open(os.path.join(out_dir, f"{name}.{mode}.ptx"), "w") as f:
                    f.write(ptx)
            print(json.dumps({"kernel": name, "mode": mode, "ahead": early.get("AHEAD", 0) if mode else 0,
                              **placement(ptx)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
