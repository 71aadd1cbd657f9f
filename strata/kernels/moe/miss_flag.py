"""Whether a layer's step misses any expert, on the device: the predicate of `STRATA_MISSES_SKIP`'s conditional graph
node, which leaves out the misses' launches of a layer whose routed experts all hit (at a 98 % hit rate, most layers).

One program: flag = any pair p with missing[ids[p]] >= 0 (DeviceTable's complement table). A launch, where the same
predicate through torch takes three (gather, compare, reduce)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _any_missed_kernel(ids, missing, flag, PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr):
    lane = tl.arange(0, PAIRS_P2)
    live = lane < PAIRS
    e = tl.load(ids + lane, mask=live, other=0)
    slot = tl.load(missing + e, mask=live, other=-1)
    tl.store(flag, tl.max(slot, axis=0) >= 0)


def any_missed(ids: torch.Tensor, missing: torch.Tensor, flag: torch.Tensor | None = None) -> torch.Tensor:
    """bool [] on ids' device: whether any routed expert of ids (int32 [T, k]) is missing (missing[e] >= 0).
    On the GPU one launch (`launch_any_missed`); elsewhere torch, the definition."""
    if not ids.is_cuda:
        return (missing[ids.reshape(-1).long()] >= 0).any()
    return launch_any_missed(ids, missing, flag)


def launch_any_missed(ids: torch.Tensor, missing: torch.Tensor, flag: torch.Tensor | None = None) -> torch.Tensor:
    flag = torch.empty((), dtype=torch.bool, device=ids.device) if flag is None else flag
    pairs = ids.numel()
    _any_missed_kernel[(1,)](ids.reshape(-1), missing, flag, PAIRS=pairs, PAIRS_P2=triton.next_power_of_2(pairs),
                             num_warps=1)
    return flag
