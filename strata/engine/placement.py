"""The placement plan: what lives where. Dense weights and the KV cache on the GPU; routed experts all there when
they fit, else in host RAM behind a GPU expert cache whose slots take the VRAM that is left."""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import torch

from strata import switches
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models.config import ModelConfig

GiB = 2**30
RESERVE_BYTES = 700 * 2**20  # left free for the allocator, CUDA context and kernels' scratch, as Strata does
HOST_TENSORS = ("per_layer_token_embd.weight",)  # read row by row from host memory, never placed on the device
SPLIT_COPIED = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")  # STRATA_DP4A_SPLIT's


@dataclass(frozen=True)
class PlacementPlan:
    device: str
    vram_budget: int | None  # bytes; None where nothing bounds it (the CPU)
    dense_bytes: int
    kv_bytes: int
    work_bytes: int
    expert_bytes: int  # all routed experts
    expert_bytes_each: int  # the largest single expert (a cache slot)
    n_experts: int  # routed experts over all layers
    n_slots: int  # cache slots on the device; n_experts when all are resident
    host_expert_bytes: int  # experts kept in host RAM
    host_kv_bytes: int = 0  # KV pages in host RAM (--kv-resident: the device holds kv_bytes of them)
    copy_bytes: int = 0  # of dense_bytes, second copies read in place of their originals (`split_copy_bytes`)

    @property
    def dense_read_bytes(self) -> int:
        """The dense bytes a token reads: each weight once, in whichever of its copies (a tied head counted once)."""
        return self.dense_bytes - self.copy_bytes

    @property
    def all_resident(self) -> bool:
        return self.n_slots >= self.n_experts

    def describe(self) -> str:
        budget = "unbounded" if self.vram_budget is None else f"{self.vram_budget / GiB:.2f} GiB"
        lines = [
            f"device        {self.device} (budget {budget})",
            f"dense weights {self.dense_bytes / GiB:8.3f} GiB on the device",
            f"KV cache      {self.kv_bytes / GiB:8.3f} GiB on the device",
            *([f"KV in host    {self.host_kv_bytes / GiB:8.3f} GiB: every page (the device caches the pages in use)"]
              if self.host_kv_bytes else []),
            f"work buffers  {self.work_bytes / GiB:8.3f} GiB on the device",
        ]
        if self.all_resident:
            lines.append(f"experts       {self.expert_bytes / GiB:8.3f} GiB: all {self.n_experts} on the device")
        else:
            share = self.n_slots / self.n_experts if self.n_experts else 0
            lines += [
                f"expert cache  {self.n_slots * self.expert_bytes_each / GiB:8.3f} GiB: {self.n_slots} of "
                f"{self.n_experts} experts ({share:.1%}) in slots of {self.expert_bytes_each / 2**20:.2f} MiB",
                f"host RAM      {self.host_expert_bytes / GiB:8.3f} GiB of experts (decode misses run on the CPU pool; "
                "GPU prompt chunks stream them)",
            ]
        return "\n".join(lines)


def expert_tensor_bytes(model: GGUFModelFile) -> tuple[int, int, int]:
    """(bytes of all routed experts, bytes of the largest single expert, number of experts) from the file."""
    per_layer: dict[str, list] = {}
    for t in model.tensors.values():
        if "_exps." in t.name:
            layer = t.name.split(".")[1]
            per_layer.setdefault(layer, []).append(t)
    total = sum(t.n_bytes for ts in per_layer.values() for t in ts)
    each = max((sum(t.n_bytes for t in ts) // ts[0].shape[0] for ts in per_layer.values()), default=0)
    count = sum(ts[0].shape[0] for ts in per_layer.values())
    return total, each, count


def split_copy_bytes(model: GGUFModelFile) -> int:
    """Bytes of the second, re-laid copies STRATA_DP4A_SPLIT keeps of the attention's Q4_0 q/k/v and o matrices
    (models/dp4a_step.py: made at the first decode step), 0 unless both switches are on."""
    if not (switches.get("STRATA_DP4A") and switches.get("STRATA_DP4A_SPLIT")):
        return 0
    from strata.kernels.quant.q4_0_split import splits

    return sum(t.n_bytes for t in model.tensors.values() if t.name.endswith(SPLIT_COPIED)
               and t.ggml_type == gguf.GGMLQuantizationType.Q4_0 and splits(t.shape[-1]))


def cache_bytes(config: ModelConfig, n_ctx: int, kv_bytes_per_value: float) -> int:
    """KV of the attention layers for n_ctx tokens, plus the fixed float32 state of each GatedDeltaNet layer."""
    attention = config.recurrent_layers.count(False) if config.is_hybrid else config.n_layers
    kv = 2 * attention * n_ctx * config.n_kv_heads * config.head_dim * kv_bytes_per_value
    recurrent = config.recurrent_layers.count(True)
    key_dim = config.ssm_state_size
    conv_channels = 2 * config.ssm_group_count * key_dim + config.ssm_inner_size
    state = config.ssm_inner_size * key_dim + (config.ssm_conv_kernel - 1) * conv_channels if recurrent else 0
    return int(kv + recurrent * state * 4)


def plan_placement(model: GGUFModelFile, config: ModelConfig, device: torch.device, n_ctx: int, kv_bytes_per_value: int,
                   vram_budget_gib: float | None = None, expert_cache: str | int = "auto",
                   kv_resident: int | None = None) -> PlacementPlan:
    expert_bytes, each, n_experts = expert_tensor_bytes(model)
    # qwen4exp's n-gram table stays memory-mapped on the host: rows are gathered from it, never moved whole.
    host_only = sum(t.n_bytes for name, t in model.tensors.items() if name in HOST_TENSORS)
    copies = split_copy_bytes(model)
    dense = model.n_bytes - expert_bytes - host_only + copies
    kv = cache_bytes(config, min(n_ctx, kv_resident or n_ctx), kv_bytes_per_value)  # what the device holds
    host_kv = cache_bytes(config, n_ctx, kv_bytes_per_value) - cache_bytes(config, 0, kv_bytes_per_value) \
        if kv_resident else 0
    # Activations of a prompt chunk and the logits dominate the scratch space (a rough, generous bound).
    work = 512 * (8 * config.n_embd + config.vocab_size) * 4
    budget = None
    if vram_budget_gib is not None:
        if not vram_budget_gib > 0:  # (NaN too)
            raise StrataError(f"--vram-budget must be a positive number of GiB, got {vram_budget_gib}")
        budget = int(vram_budget_gib * GiB)
    elif device.type == "cuda":
        budget = torch.cuda.mem_get_info(device)[0]
    if budget is not None:
        fixed = dense + kv + work + RESERVE_BYTES
        if fixed > budget:
            raise StrataError(
                f"{model.path}: dense weights ({dense / GiB:.2f} GiB), KV cache for {n_ctx} tokens ({kv / GiB:.2f} GiB) "
                f"and work buffers need {fixed / GiB:.2f} GiB but the VRAM budget is {budget / GiB:.2f} GiB "
                f"({'raise --vram-budget' if vram_budget_gib is not None else 'free GPU memory'}, lower --ctx, use "
                "--kv-dtype with fewer bytes, or a smaller quant)")
        room = budget - fixed
    if expert_cache == "auto":
        slots = n_experts if budget is None or not each else min(n_experts, room // each)
    else:
        slots = int(expert_cache)
        if slots < 0:
            raise StrataError(f"--expert-cache must be 'auto' or a number of experts >= 0, got {expert_cache}")
        if budget is not None and each and slots > room // each:
            raise StrataError(f"--expert-cache {slots} needs {slots * each / GiB:.2f} GiB but only "
                              f"{room / GiB:.2f} GiB of the VRAM budget is left (ask for at most {room // each})")
        slots = min(slots, n_experts)
    host = 0 if slots >= n_experts else expert_bytes
    return PlacementPlan(str(device), budget, dense, kv, work, expert_bytes, each, n_experts, slots, host, host_kv,
                         copies)
