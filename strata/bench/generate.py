"""`strata bench generate`: prompt and decode tokens/s, each beside its memory-bandwidth floor."""

from __future__ import annotations

import time

import torch

from strata.bench.ceilings import read_bandwidth, sync
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams


def bytes_per_decode_token(engine: Engine) -> int:
    """Weights one decode step reads: every dense tensor once, plus top-k experts' share of each expert stack."""
    model, c = engine.model, engine.model.config
    expert_total = sum(s.n_bytes for s in model.expert_stacks.values())
    dense = sum(t.n_bytes for t in engine.file.tensors.values()) - expert_total
    dense -= model.embed.n_bytes - model.embed.n_bytes // c.vocab_size  # one embedding row is read, not all
    if c.tied_embeddings:
        dense += model.embed.n_bytes  # ...but a tied head reads the whole table
    active = expert_total * c.n_experts_used // c.n_experts if c.is_moe else 0
    return dense + active


def bench_generate(args) -> None:
    n_ctx = args.ctx or args.prompt_tokens + args.gen_tokens + 1
    # No checkpoints: each repetition reads the whole prompt, and no copy of the cache is in its time.
    engine = Engine(args.model, EngineConfig(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype,
                                             prefill_chunk=args.prefill, n_ctx=n_ctx, checkpoints=0))
    device = engine.device
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, engine.model.config.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
    greedy = SamplingParams(temperature=0)
    prompt_times, decode_times = [], []
    for _ in range(args.reps + 1):  # the first run warms up allocations and kernels
        engine.cached_tokens = []
        sync(device)
        start = time.perf_counter()
        tokens = engine.generate(prompt, greedy, args.gen_tokens, stop_ids=frozenset())
        next(tokens)
        sync(device)
        mid = time.perf_counter()
        n = 1 + sum(1 for _ in tokens)
        sync(device)
        prompt_times.append(mid - start)
        decode_times.append((time.perf_counter() - mid) / max(n - 1, 1))
    prompt_s, decode_s = min(prompt_times[1:]), min(decode_times[1:])
    bandwidth = read_bandwidth(device)
    per_token = bytes_per_decode_token(engine)
    floor_s = per_token / bandwidth  # decode reads its weights once
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"model     {engine.file.path.name} ({engine.model.config.arch}), device {name}, dtype {engine.dtype}")
    print(f"prompt    {args.prompt_tokens} tokens: {args.prompt_tokens / prompt_s:10.1f} tok/s ({prompt_s * 1e3:.1f} ms)")
    print(f"decode    {args.gen_tokens} tokens: {1 / decode_s:10.1f} tok/s ({decode_s * 1e3:.2f} ms/token)")
    print(f"floor     {per_token / 1e6:.1f} MB of weights per decode token at {bandwidth / 1e9:.1f} GB/s read "
          f"= {1 / floor_s:.1f} tok/s; decode reaches {floor_s / decode_s:.1%} of it")
