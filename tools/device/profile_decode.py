"""On the GPU: where a decode token's GPU time goes. torch.profiler over a few greedy decode steps through
`Engine.decode` (the captured CUDA-graph step when graphs are on: CUPTI still reports each kernel inside a replay),
kernels per token and the most launched ones, kernels sorted by device time, then the same steps' host time.

With --increments: each kernel's share of the step's critical path, from the trace's kernel ends in launch order
(under PDL a kernel starts early and waits, so its duration says little; end minus the latest end before it is what
it added to the step), summed by kernel name per token, and apart from it the idle time before each kernel's starts;
then the same by place in a layer's cycle of launches (telling apart q/k/v's matvec from o's, which share a kernel).

Usage: python3 tools/device/profile_decode.py MODEL.gguf [--steps N] [--graphs on|off] [--prompt-tokens N]
       [--vram-budget GIB] [--increments] [--kv-dtype int8]
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from tools.device.prompt_timeline import trace_of  # noqa: E402


def increments(prof, steps: int) -> None:
    """Per kernel name: us a token it added to the critical path (its end past every earlier kernel's end, in start
    order), the idle time before its starts (nothing running: the host's gap between steps lands on a step's first
    kernel), its launches a token, and the median of its own durations."""
    kernels = sorted((e for e in trace_of(prof)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"),
                     key=lambda e: e["ts"])
    added, idle, durations, order = {}, {}, {}, []
    latest = None
    for e in kernels:
        start, end = e["ts"], e["ts"] + e["dur"]
        before = 0.0 if latest is None else max(0.0, start - latest)
        gain = max(0.0, end - max(start, latest if latest is not None else start))
        latest = end if latest is None else max(latest, end)
        added[e["name"]] = added.get(e["name"], 0.0) + gain
        idle[e["name"]] = idle.get(e["name"], 0.0) + before
        durations.setdefault(e["name"], []).append(e["dur"])
        order.append((e["name"], gain, e["dur"]))
    busy, gaps = sum(added.values()), sum(idle.values())
    print(f"critical path {busy / steps / 1000:.3f} ms a token busy, {gaps / steps / 1000:.3f} ms idle between kernels")
    print(f"{'us a token':>10} {'share':>6} {'idle':>7} {'launches':>8} {'median dur':>10}  kernel")
    for name, us in sorted(added.items(), key=lambda kv: -kv[1])[:20]:
        d = sorted(durations[name])
        print(f"{us / steps:10.1f} {us / busy:6.1%} {idle[name] / steps:7.1f} {len(d) / steps:8.1f} "
              f"{d[len(d) // 2]:10.2f}  {name[:90]}")
    layer_cycle(order, steps)


def layer_cycle(order: list, steps: int) -> None:
    """The same by a layer's kernels in launch order, telling apart launches of one kernel (q/k/v's matvec from o's
    and the experts' down): each step's kernels (the same sequence every step) cut into its repeating layer cycle
    (the shortest period most of the sequence repeats with), each place's added time averaged over the layers."""
    if not steps or len(order) % steps:
        print("layer cycle: steps of unequal kernel counts, not cut")
        return
    n = len(order) // steps
    names = [name for name, _, _ in order[:n]]

    def longest_run(p: int) -> tuple[int, int]:  # (length, start) of the longest stretch where names repeat at p
        best, run = (0, 0), 0
        for i in range(n - p):
            run = run + 1 if names[i] == names[i + p] else 0
            best = max(best, (run, i - run + 1))
        return best

    period = next((p for p in range(2, n // 3 + 1) if longest_run(p)[0] >= max(p, (n - p) // 2)), None)
    if period is None:
        print("layer cycle: no repeating layer found")
        return
    first = longest_run(period)[1]
    layers = (n - first) // period
    print(f"a layer's kernels in order (cycle of {period} from launch {first} of {n}, {layers} layers):")
    print(f"{'us a layer':>10} {'median dur':>10}  kernel")
    total = 0.0
    for place in range(period):
        picks = [order[s * n + first + layer * period + place] for s in range(steps) for layer in range(layers)]
        us = sum(gain for _, gain, _ in picks) / (steps * layers)
        total += us
        durations = sorted(dur for _, _, dur in picks)
        print(f"{us:10.2f} {durations[len(durations) // 2]:10.2f}  {picks[0][0][:90]}")
    print(f"{total:10.2f} {'':>10}  a layer; outside the layers: "
          f"{(sum(g for _, g, _ in order) / steps - total * layers):.1f} us a token")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--graphs", default="on", choices=("on", "off"))
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--top", type=int, default=40, help="kernels listed by launches per token")
    parser.add_argument("--vram-budget", type=float, default=None, help="GiB, as `bench decode` takes it")
    parser.add_argument("--increments", action="store_true", help="each kernel's share of the critical path")
    parser.add_argument("--kv-dtype", default="float16", help="as `bench decode` takes it (float16, int8, ...)")
    args = parser.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.ctx, kv_dtype=args.kv_dtype,
                                             decode_graphs=args.graphs, vram_budget=args.vram_budget))
    vocab = engine.model.config.vocab_size
    ids = torch.randint(0, vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    logits = engine.prefill(ids)
    position = len(ids)

    def step():
        nonlocal logits, position
        token = int(logits[-1].argmax())
        logits = engine.decode(token, position)
        position += 1

    for _ in range(4):  # compile, capture, warm
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    rate = args.steps / (time.perf_counter() - started)
    print(f"decode {rate:.2f} tok/s without the profiler (graphs {args.graphs}, {args.steps} steps)")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    if args.increments:
        increments(prof, args.steps)
        return
    table = prof.key_averages()
    kernels = [e for e in table if e.device_type == torch.autograd.DeviceType.CUDA]
    device_us = sum(e.self_device_time_total for e in kernels)
    print(f"GPU kernel time {device_us / args.steps / 1000:.2f} ms per token")
    print(f"kernels per token {sum(e.count for e in kernels) / args.steps:.0f}")
    print(f"{'per token':>9} {'us each':>8}  kernel (by launches)")
    for e in sorted(kernels, key=lambda e: -e.count)[: args.top]:
        print(f"{e.count / args.steps:9.1f} {e.self_device_time_total / max(e.count, 1):8.2f}  {e.key[:110]}")
    print(table.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=90))
    print(table.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
