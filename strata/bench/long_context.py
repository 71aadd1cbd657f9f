"""`strata bench long-context`: a long prompt through the int8 KV, dense vs `--qsa quest` vs quest with
`--kv-resident`, prompt and decode tokens/s and the GPU's kernel time of a decode step, beside how far each arm's
logits are from the first arm's.

The first arm decodes greedily; the others are fed the same tokens (teacher-forced), so their logits compare
position by position: argmax agreement, the largest error of a row relative to its norm, and whether an arm's logits
equal another's byte for byte (kv-resident must equal the all-VRAM arm it mirrors).
"""

from __future__ import annotations

import argparse
import time

import torch

from strata.bench.ceilings import sync
from strata.engine.engine import Engine, EngineConfig

ARMS = {  # name: engine options over kv_dtype=int8
    "dense": {},
    "quest": {"qsa": "quest"},
    # quest decoded step by step, as the resident arm must (its pages are fetched by the host): its byte mirror
    "quest-steps": {"qsa": "quest", "decode_graphs": "off"},
    "quest+resident": {"qsa": "quest", "kv_resident": None},  # None: filled from --resident
}


def run_arm(model: str, options: dict, prompt: list[int], forced: list[int] | None, gen: int):
    """(prompt seconds, decode seconds per token after the first, GPU ms per decode step (None on the CPU), logits
    [gen + 1, vocab] on the CPU, tokens, engine). Decode steps go through `engine.decode`: the captured step where
    the engine has one, as `strata run` decodes."""
    engine = Engine(model, EngineConfig(**options))
    device = engine.device
    sync(device)
    start = time.perf_counter()
    logits = [engine.prefill(prompt)[-1].float().cpu()]
    sync(device)
    prompt_s = time.perf_counter() - start
    tokens, start, gpu_ms = [], None, None
    for i in range(gen):
        if i == 1:  # the first step compiles the decode kernels (and captures the graphs): not the steady rate
            sync(device)
            start = time.perf_counter()
        token = int(logits[-1].argmax()) if forced is None else forced[i]
        tokens.append(token)
        if i == gen - 1 and device.type == "cuda":
            decode_s = (time.perf_counter() - start) / (gen - 2) if gen > 2 else float("nan")
            with device_time() as gpu:  # the last step, under the profiler: kernel time only
                logits.append(engine.decode(token, len(prompt) + i)[-1].float().cpu())
            gpu_ms = gpu.ms
        else:
            logits.append(engine.decode(token, len(prompt) + i)[-1].float().cpu())
    sync(device)
    if gpu_ms is None:
        decode_s = (time.perf_counter() - start) / (gen - 1) if start is not None else float("nan")
    return prompt_s, decode_s, gpu_ms, torch.stack(logits), tokens, engine


class device_time:
    """The GPU kernel milliseconds of what runs inside: the sum of torch.profiler's device events (each kernel, those
    a CUDA graph replays included)."""

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        self.profile = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self.profile.__enter__()
        return self

    def __exit__(self, *exc):
        from torch.autograd import DeviceType

        torch.cuda.synchronize()
        self.profile.__exit__(*exc)
        self.ms = sum(e.time_range.elapsed_us() for e in self.profile.events()
                      if e.device_type == DeviceType.CUDA) / 1000
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench long-context", description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--device", default="auto")
    p.add_argument("--prompt-tokens", type=int, default=32768)
    p.add_argument("--gen-tokens", type=int, default=16)
    p.add_argument("--prefill", default="auto", help="prompt chunk: tokens, auto or auto:MAX")
    p.add_argument("--budget", type=int, default=2048 + 3, help="--qsa-budget of the quest arms")
    p.add_argument("--resident", type=int, default=16384, help="--kv-resident cells per layer of the resident arm")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        p.error(f"unknown arm(s) {', '.join(unknown)}")
    prefill = int(args.prefill) if args.prefill.isdigit() else args.prefill
    prompt = torch.randint(0, 256, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"model {args.model}, prompt {args.prompt_tokens} tokens, {args.gen_tokens} decoded, int8 KV, "
          f"budget {args.budget}, resident {args.resident} cells/layer; agreement against {arms[0]}")
    print("| arm | prompt tok/s | decode tok/s | decode ms of GPU / step | argmax agreement | max rel logit error | "
          "equal bytes to | device KV MiB | evicted pages (4 cells) |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|", flush=True)
    results, forced = {}, None
    for arm in arms:  # each row printed when its arm ends, so a capped run still reports the arms it finished
        options = dict(device=args.device, kv_dtype="int8", n_ctx=args.prompt_tokens + args.gen_tokens + 8,
                       prefill_chunk=prefill, qsa_budget=args.budget, **ARMS[arm])
        if "kv_resident" in options:
            options["kv_resident"] = args.resident
        prompt_s, decode_s, gpu_ms, logits, tokens, engine = run_arm(args.model, options, prompt, forced,
                                                                     args.gen_tokens)
        forced = forced or tokens
        kv = engine.kv.kv if hasattr(engine.kv, "recurrent_layers") else engine.kv
        evictions, kv_bytes = getattr(kv, "evictions", None), engine.plan.kv_bytes
        del engine, kv
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        results[arm] = logits
        ref = results[arms[0]]
        agree = (logits.argmax(-1) == ref.argmax(-1)).float().mean()
        rel = ((logits - ref).norm(dim=-1) / ref.norm(dim=-1)).max()
        same = [other for other in results if other != arm and torch.equal(results[other], logits)]
        gpu = f"{gpu_ms:.3f}" if gpu_ms is not None else "-"
        print(f"| {arm} | {args.prompt_tokens / prompt_s:.1f} | {1 / decode_s:.2f} | {gpu} | {agree:.1%} | {rel:.2e} | "
              f"{', '.join(same) or '-'} | {kv_bytes / 2**20:.1f} | {evictions if evictions is not None else '-'} |",
              flush=True)
    if "quest" in results and "quest-steps" in results:  # the captured step against the step-by-step one
        a, b = results["quest"], results["quest-steps"]
        print(f"quest captured vs step by step: argmax agreement {(a.argmax(-1) == b.argmax(-1)).float().mean():.1%}, "
              f"max rel logit error {((a - b).norm(dim=-1) / b.norm(dim=-1)).max():.2e}")
    mirror = "quest-steps" if "quest-steps" in results else "quest"  # the captured step rounds differently on a GPU
    if mirror in results and "quest+resident" in results and not torch.equal(results[mirror],
                                                                             results["quest+resident"]):
        print(f"FAIL: quest+resident logits differ from {mirror}'s (they must be equal byte for byte)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
