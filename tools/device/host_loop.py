"""On the GPU: where a decode token's wall time goes outside the GPU (issue 4). `strata bench decode` measured
8.8 ms a token all resident where the profiler's loop (`profile_decode.py`: argmax on the device) measured 3.5:
this times the same captured step three ways (the profiler's loop, Engine.generate with the greedy Sampler, and
the step with a device sync around it), then runs Engine.generate under cProfile and prints the host functions
that take the time.

Usage: python3 tools/device/host_loop.py MODEL.gguf [--steps N] [--vram-budget GIB]
"""

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.bench.ceilings import sync  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.sampling import Sampler, SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--vram-budget", type=float, default=None)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    engine = Engine(args.model, EngineConfig(device=args.device, dtype="bfloat16" if args.device != "cpu" else "float32", n_ctx=args.ctx,
                                             vram_budget=args.vram_budget))
    vocab = engine.model.config.vocab_size
    prompt = torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(0)).tolist()

    def timed(label: str, run) -> None:
        sync(engine.device)
        start = time.perf_counter()
        run(args.steps)
        sync(engine.device)
        ms = (time.perf_counter() - start) / args.steps * 1e3
        print(f"{label:<44} {ms:7.2f} ms/token = {1e3 / ms:7.1f} tok/s", flush=True)

    def device_argmax(n: int) -> None:  # profile_decode.py's loop
        position = len(engine.cached_tokens)
        logits = engine.decode(7, position)
        for _ in range(n - 1):
            position += 1
            logits = engine.decode(int(logits[-1].argmax()), position)

    def host_sampler(n: int) -> None:  # Engine.generate's loop, without the generator
        sampler, history = Sampler(SamplingParams(temperature=0)), list(engine.cached_tokens)
        logits = engine.decode(7, len(history))
        history.append(7)
        for _ in range(n - 1):
            token = sampler(logits[-1], history)
            history.append(token)
            logits = engine.decode(token, len(history) - 1)

    def step_only(n: int) -> None:  # the same token each step: the step and one sync, nothing else
        position = len(engine.cached_tokens)
        for _ in range(n):
            engine.decode(7, position)
            sync(engine.device)
            position += 1

    def generate(n: int) -> None:
        for _ in engine.generate(prompt, SamplingParams(temperature=0), n, stop_ids=frozenset()):
            pass

    engine.prefill(prompt)
    device_argmax(4)  # compile, capture
    for label, run in (("device argmax (profile_decode's loop)", device_argmax),
                       ("host Sampler (Engine.generate's loop)", host_sampler),
                       ("step + sync", step_only), ("Engine.generate (with its prompt)", generate)):
        engine.prefill(prompt)
        timed(label, run)
    profiler = cProfile.Profile()
    profiler.enable()
    generate(args.steps)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
