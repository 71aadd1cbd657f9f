"""STRATA_DP4A: a decode step's Q4_0 matvecs through the int8-activation dp4a GEMVs (kernels/moe/dp4a_gemv.py).

Where the switch is on and a decode step (1-4 rows, bf16/fp16, on a GPU; on the CPU only where the tests make the
fused kernels run interpreted, `layers.FUSED_ON_CPU`) meets a Q4_0 weight the kernels read, `DecoderLM` takes:
  q/k/v   (the stacked matvec) `matvec`, its input's codes written by the norm before it (the residual add +
          norm's, layer 0's by the plain `rms_norm`);
  o       `matvec`, the attention's output rounded by one `quantize_x` launch (still: the decode attention's
          epilogue, kernels/attention/decode*.py, could write the codes instead);
  experts `routed_experts` (resident, gate/up/down all Q4_0): gate/up + SwiGLU from the codes `add_norm_route`
          wrote, its epilogue rounding H to codes itself (a row tile of whole 32-row groups; no float H), then the
          down sum.
With STRATA_DP4A_SPLIT too, q/k/v and o (rows of a multiple of 256 weights) read a copy of their rows re-laid for
16-byte code loads (`split_rows_of`, kernels/quant/q4_0_split.py) instead of the GGUF rows.
A layer's launches under the switch are so those of the switch unset plus one (o's input rounded).
STRATA_DP4A_PARTS narrows it to some of the three (`takes`): the others keep their float kernels, and a norm writes
codes only for a dp4a reader.
Anything else (other formats, prompt chunks, shapes the kernels refuse) returns None and the caller takes its
current path, so the switch unset changes nothing.

The codes travel with the normed tensor as an attribute (`attach`): the norm's caller makes them, the matvec that
reads that very tensor object finds them; a reshaped view or any other tensor carries none and is rounded by a
`quantize_x` launch instead (the same bytes either way, quantize32's rounding). Every buffer is a torch allocation
of the step (a CUDA graph keeps those static) and every launch takes STRATA_PDL's options (kernels/pdl.py's rule:
the dense matvec's weights before its wait, nothing else)."""

from __future__ import annotations

import torch

from strata import switches
from strata.errors import StrataError
from strata.models import layers

Q4_0 = 2  # GGML type id
MAX_ROWS = 4  # dp4a_matvec's rows (a decode step or a verify window)
MAX_BLOCKS = 4096  # blocks a program holds at once (one-shot: all of a row's), far above the models' 64-200
_ATTR = "_strata_dp4a_rows"


PARTS = ("qkv", "o", "experts")


def takes(part: str) -> bool:
    """Whether STRATA_DP4A takes this part of the step (STRATA_DP4A_PARTS: a comma list, unset all of PARTS)."""
    if not switches.get("STRATA_DP4A"):
        return False
    listed = switches.get("STRATA_DP4A_PARTS")
    if not listed:
        return True
    named = [p.strip() for p in listed.split(",")]
    unknown = [p for p in named if p not in PARTS]
    if unknown:
        raise StrataError(f"environment switch STRATA_DP4A_PARTS={listed}: {', '.join(unknown)} is not one of "
                          f"{', '.join(PARTS)}")
    return part in named


def on(x: torch.Tensor) -> bool:
    """Whether STRATA_DP4A takes a decode step over x [rows, K]: the switch, a GPU (or the interpreted CPU tests),
    a fused dtype, 1..MAX_ROWS rows of whole 32-value groups."""
    return bool(switches.get("STRATA_DP4A")) and (x.is_cuda or layers.FUSED_ON_CPU) and x.dim() == 2 \
        and x.dtype in (torch.bfloat16, torch.float16) and 1 <= x.shape[0] <= MAX_ROWS and x.shape[1] % 32 == 0


def rounded_buffers(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Empty (codes, scales, sums) for a norm kernel to round its output rows x's shape into, or None where no dp4a
    matvec would read them (the norm launches as before)."""
    if not on(x):
        return None
    rows, k = x.shape
    return (torch.empty(rows, k, dtype=torch.int8, device=x.device),
            torch.empty(rows, k // 32, dtype=torch.float32, device=x.device),
            torch.empty(rows, k // 32, dtype=torch.int32, device=x.device))


def attach(x: torch.Tensor, rounded) -> torch.Tensor:
    """x, carrying `rounded` (its quantize32 codes, scales, sums) for the dp4a matvecs that read x."""
    if rounded is not None:
        setattr(x, _ATTR, rounded)
    return x


def rows_of(x: torch.Tensor):
    """x's (codes, scales, sums): those a norm kernel wrote beside it, else one `quantize_x` launch."""
    rounded = getattr(x, _ATTR, None)
    if rounded is not None:
        return rounded
    from strata.kernels.moe import dp4a_gemv

    return dp4a_gemv.quantize_x(x)


def _readable(raw: torch.Tensor, matrices_bytes: int) -> bool:
    """Q4_0 bytes the kernels read as they are (contiguous uint8, an even address for the uint16 loads)."""
    return raw.dtype == torch.uint8 and raw.is_contiguous() and raw.numel() >= matrices_bytes \
        and raw.data_ptr() % 2 == 0


def _q4_0_fits(weight, k: int) -> bool:
    n_out, n_in = weight.shape[-2:]
    return (weight.ggml_type == Q4_0 and n_in == k and k // 32 <= MAX_BLOCKS and n_out > 0
            and _readable(weight.raw, n_out * k // 32 * 18))


def matvec(x: torch.Tensor, weight, part: str, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [rows, K] @ weight.T (+ bias) in x's dtype through `dp4a_matvec`, or None where STRATA_DP4A does not take
    it (the caller's `linear`); `part` "qkv" or "o" (STRATA_DP4A_PARTS)."""
    if not (on(x) and takes(part) and len(weight.shape) == 2 and _q4_0_fits(weight, x.shape[1])
            and weight.device == x.device):
        return None
    from strata.kernels.moe import dp4a_gemv

    n_out = weight.shape[0]
    y = torch.empty(x.shape[0], n_out, dtype=x.dtype, device=x.device)  # the kernel's store rounds to it
    split = split_rows_of(weight)
    if split is not None:
        from strata.kernels.quant import q4_0_split

        q4_0_split.split_dp4a_matvec(rows_of(x), split, n_out, bn=SPLIT_TILE[0], warps=SPLIT_TILE[1], out=y)
    else:
        dp4a_gemv.dp4a_matvec(rows_of(x), weight.raw, n_out, y=y, pdl=True)
    return y if bias is None else y + bias


SPLIT_TILE = (8, 4)  # rows, warps: session 15's chain of A3B's matvecs (tools/device/split_probe.py) found it fastest
_SPLIT_ATTR = "_strata_split_rows"


def split_rows_of(weight) -> torch.Tensor | None:
    """STRATA_DP4A_SPLIT: the weight's rows re-laid for 16-byte code loads (a copy kept on the weight, made at its
    first use outside a CUDA-graph capture: a decode span's first step runs eagerly), or None: the switch unset,
    rows the layout does not take, or no copy yet while a graph records (the GGUF rows then serve)."""
    if not switches.get("STRATA_DP4A_SPLIT"):
        return None
    from strata.kernels.quant import q4_0_split

    kept = getattr(weight, _SPLIT_ATTR, None)
    n_out, n_in = weight.shape[-2:]
    recording = weight.raw.is_cuda and torch.cuda.is_current_stream_capturing()
    if kept is None and q4_0_split.splits(n_in) and not recording:
        kept = q4_0_split.split_rows(weight.raw.reshape(n_out, -1))
        setattr(weight, _SPLIT_ATTR, kept)
    return kept


def routed_experts(stack, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor | None:
    """The resident experts' weighted sum [rows, embd] in x's dtype for x [rows, embd] (normed), the routing
    weights and ids [rows, k], or None where STRATA_DP4A does not take the layer (the backend's kernels)."""
    parts = (stack.gate, stack.up, stack.down)
    if not (on(x) and all(len(p.shape) == 3 and p.ggml_type == Q4_0 and p.device == x.device for p in parts)):
        return None
    n_experts, ff, embd = stack.gate.shape
    if (tuple(stack.up.shape) != (n_experts, ff, embd) or tuple(stack.down.shape) != (n_experts, embd, ff)
            or embd != x.shape[1] or ff % 32 or ids.shape[1] * ff // 32 > MAX_BLOCKS):
        return None
    stride_gu, stride_d = ff * embd // 32 * 18, embd * ff // 32 * 18  # an expert's bytes in each stack
    if not all(_readable(p.raw, n_experts * s) for p, s in zip(parts, (stride_gu, stride_gu, stride_d))):
        return None
    from strata.kernels.moe import dp4a_gemv

    top_k = ids.shape[1]
    # The tiles of a one-row step whatever the rows: a verify window's row then sums as that step's, bit for bit.
    # (the gate/up rows a multiple of 32: its epilogue rounds H per 32 values)
    bn_gu, warps_gu = dp4a_gemv.dp4a_tile(ff, embd // 32, top_k, 2, x.is_cuda, dp4a_gemv.GROUP)
    bn_d, warps_d = dp4a_gemv.dp4a_tile(embd, top_k * ff // 32, 1, 1, x.is_cuda)
    hq = dp4a_gemv.dp4a_gate_up(rows_of(x), ids, stack.gate.raw, stack.up.raw, stride_gu, ff, bn=bn_gu,
                                warps=warps_gu, pdl=True, rounded="codes")  # H's codes, no float H
    y = torch.empty(x.shape[0], embd, dtype=x.dtype, device=x.device)
    return dp4a_gemv.dp4a_down(hq, ids, weights, stack.down.raw, stride_d, embd, y=y, bn=bn_d, warps=warps_d,
                               pdl=True)


def reads_qkv(model, i: int) -> bool:
    """Whether layer i's q/k/v matvec would read dp4a codes (so the norm before it should write them): the switch,
    a model class wired for it (`DecoderLM.dp4a_wired`), a stacked Q4_0 q/k/v."""
    if not takes("qkv") or not model.dp4a_wired or i >= model.n_main_layers:
        return False
    qkv = model.attention[i].qkv
    return qkv is not None and qkv.ggml_type == Q4_0


def resident_stack(model, i: int, w=None):
    """Layer i's resident expert stack where STRATA_DP4A takes its experts (all three parts Q4_0; `w`, where given,
    the layer's own FFN weights: not an MTP block's, whose index is past the trunk's), else None."""
    from strata.engine.experts import ResidentExperts

    if not takes("experts") or not model.dp4a_wired or type(model.experts) is not ResidentExperts:
        return None
    if i >= len(model.ffn) or (w is not None and w is not model.ffn[i]):
        return None
    stack = model.experts.stacks.get(i)
    if stack is None or not all(p.ggml_type == Q4_0 for p in (stack.gate, stack.up, stack.down)):
        return None
    return stack
