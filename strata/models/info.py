"""`strata info`: what a GGUF model is, what it is made of, and what it will need in memory."""

from __future__ import annotations

from collections import defaultdict

from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models import config_of

GiB = 2**30


def describe(path: str, n_ctx: int, kv_dtype: str = "float16") -> str:
    from strata.engine.kv import kv_bytes_per_value
    from strata.engine.placement import cache_bytes

    model = GGUFModelFile(path)
    config = config_of(model)
    by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # tensors, parameters, bytes
    expert_bytes = 0
    for t in model.tensors.values():
        row = by_type[t.type_name]
        row[0] += 1
        row[1] += t.n_elements
        row[2] += t.n_bytes
        if "_exps." in t.name:
            expert_bytes += t.n_bytes
    n_params = sum(r[1] for r in by_type.values())
    weight_bytes = sum(r[2] for r in by_type.values())
    kv_bytes = cache_bytes(config, n_ctx, kv_bytes_per_value(kv_dtype))  # attention layers' KV + recurrent states
    lines = [
        f"file          {model.path} ({len(model.shards)} file{'s' if len(model.shards) > 1 else ''}, {model.n_bytes / GiB:.2f} GiB)",
        f"name          {model.metadata.get('general.name', '-')}",
        f"architecture  {config.arch}: {config.n_layers} layers, hidden {config.n_embd}, "
        f"{config.n_heads} query / {config.n_kv_heads} KV heads of {config.head_dim}, vocab {config.vocab_size}",
    ]
    if config.is_moe:
        shared = f", shared expert {config.shared_expert_ff}" if config.shared_expert_ff else ""
        lines.append(f"experts       {config.n_experts} per layer, top {config.n_experts_used}, width {config.expert_ff}{shared}")
        n_expert_layers = sum(1 for name in model.tensors if name.endswith("ffn_gate_exps.weight"))
        n_experts = n_expert_layers * config.n_experts
        if n_experts:
            lines.append(f"              {n_experts:,} experts in {n_expert_layers} layers, "
                         f"{expert_bytes // n_experts:,} bytes each ({expert_bytes:,} bytes)")
    else:
        lines.append(f"feed-forward  dense, width {config.n_ff}")
    lines += [
        f"context       {config.context_length} trained; rope theta {config.rope_theta:g}",
        f"parameters    {n_params / 1e9:.3f} B" if n_params >= 1e8 else f"parameters    {n_params / 1e6:.3f} M",
        "quant types:",
    ]
    for name, (count, params, nbytes) in sorted(by_type.items(), key=lambda kv: -kv[1][2]):
        bits = 8 * nbytes / params if params else 0
        lines.append(f"  {name:8} {count:5} tensors  {params:>15,} weights  {nbytes / GiB:8.3f} GiB  {bits:5.2f} bits/weight")
    lines += [
        f"memory at context {n_ctx}:",
        f"  weights     {weight_bytes / GiB:8.3f} GiB (routed experts {expert_bytes / GiB:.3f} GiB)",
        f"  KV cache    {kv_bytes / GiB:8.3f} GiB ({kv_dtype})",
        f"  total       {(weight_bytes + kv_bytes) / GiB:8.3f} GiB",
    ]
    return "\n".join(lines)


def describe_plan(path: str, n_ctx: int, device: str, vram_budget: float | None, expert_cache,
                  kv_dtype: str = "float16", kv_resident: int | None = None, gpus: str | None = None,
                  layer_split: str = "auto", prefill_borrow: str = "auto") -> str:
    """Where each part of the model would live on `device`, or on each card of `gpus` (strata.engine.placement*)."""
    from strata.engine.engine import EngineConfig
    from strata.engine.kv import check_kind, kv_bytes_per_value
    from strata.engine.placement import plan_placement
    from strata.engine.prefill import describe_chunks

    model = GGUFModelFile(path)
    config = config_of(model)
    per_value = kv_bytes_per_value(check_kind(kv_dtype, config.head_dim))
    if gpus:
        from strata.engine.placement_split import parse_gpus, parse_layer_split, plan_split

        if kv_resident:
            raise StrataError("--gpus does not run --kv-resident yet")
        split = plan_split(model, config, parse_gpus(gpus), n_ctx, per_value, vram_budget,
                           parse_layer_split(layer_split), expert_cache)
        return f"placement plan ({kv_dtype} KV):\n" + "\n".join("  " + line for line in split.describe().splitlines())
    resolved = EngineConfig(device=device).resolve_device()
    plan = plan_placement(model, config, resolved, n_ctx, per_value, vram_budget, expert_cache, kv_resident)
    resident = f", {kv_resident} cells per layer on the device" if kv_resident else ""
    masked = _mask_context(model, config, n_ctx, kv_dtype, resolved.type == "cuda")
    lines = [*plan.describe().splitlines(), describe_chunks(plan, config, masked, borrow=prefill_borrow)]
    return f"placement plan ({kv_dtype} KV{resident}):\n" + "\n".join("  " + line for line in lines)


def _mask_context(model: GGUFModelFile, config, n_ctx: int, kv_dtype: str, on_cuda: bool) -> int:
    """The context a prompt chunk's attention masks densely, as the engine's chunk rule will budget it
    (Engine._mask_context): none for the paged int8 cache, qwen4exp's own rule, else the whole context."""
    if kv_dtype == "int8":
        return 0
    if config.arch == "qwen4exp":
        from strata.models.qwen4exp import planned_mask_context

        return planned_mask_context(model, config, n_ctx, kv_dtype, on_cuda)
    return n_ctx
