"""On the GPU: greedy decode one step ahead (STRATA_DECODE_AHEAD, engine/decode_ahead.py) against the plain loop,
in one engine: the same tokens (a run of N after a prompt, then one stopped at a token of its own from the third
on and a follow-up prompt reusing the cache), and each mode's wall clock a token, alternating; then a seeded sampled
request (the default parameters), plain and ahead: the same tokens, and each one's wall clock.

Usage: python3 tools/device/ahead_check.py MODEL.gguf [--tokens N] [--vram-budget GIB] [--kv-dtype KIND]
(`--device cpu`: the uncaptured static step, STRATA_DECODE_AHEAD 2, for a dry run of this script)
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.bench.ceilings import sync  # noqa: E402
from strata.engine.decode_ahead import runs_ahead  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from strata.kernels.sample import draw  # noqa: E402

GREEDY = SamplingParams(temperature=0)


def run(engine: Engine, mode: int, prompt: list[int], n: int, stop=frozenset(),
        params: SamplingParams = GREEDY) -> tuple[list[int], float]:
    """(tokens, wall seconds a decode token: from the first token's arrival to the last's)."""
    with switches.override(STRATA_DECODE_AHEAD=mode):
        tokens, stamps = [], []
        for token in engine.generate(list(prompt), params, n, frozenset(stop)):
            tokens.append(token)
            stamps.append(time.perf_counter())
        sync(engine.device)
    return tokens, (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--vram-budget", type=float, default=24.0)
    parser.add_argument("--kv-dtype", default="float16")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    engine = Engine(args.model, EngineConfig(device=args.device, vram_budget=args.vram_budget if cuda else None,
                                             n_ctx=4096, kv_dtype=args.kv_dtype, checkpoints=0,
                                             decode_graphs="auto" if cuda else "eager"))
    ahead_mode = 1 if cuda else 2
    with switches.override(STRATA_DECODE_AHEAD=ahead_mode):
        print(f"runs ahead: {runs_ahead(engine, GREEDY)} (decoder {type(engine.decoder).__name__}, "
              f"captured {getattr(engine.decoder, 'capture', None)})")
    vocab = engine.model.config.vocab_size
    prompt = [(i * 7919 + 13) % vocab for i in range(64)]
    ok = True
    run(engine, 0, prompt, 8)  # compiles and captures
    plain, _ = run(engine, 0, prompt, args.tokens)
    ahead, _ = run(engine, ahead_mode, prompt, args.tokens)
    same = plain == ahead
    ok &= same
    print(f"{args.tokens} greedy tokens ({len(set(plain))} distinct), plain loop against one step ahead: "
          f"{'equal' if same else 'DIFFER'}")
    # the stop: the first decode step's token not met before it (the run's first token is the prompt's)
    first = next((i + 1 for i in range(1, len(plain)) if plain[i] not in plain[:i]), None)
    if first is None:  # (a synthetic model may repeat one token: then the stop is that token, met at once)
        print(f"the run repeats its first token ({len(set(plain))} distinct): the stop is met at the first token")
        first = 1
    stop = plain[first - 1]
    stopped, _ = run(engine, ahead_mode, prompt, args.tokens, {stop})
    follow = prompt + stopped + [1, 2, 3]
    cont, _ = run(engine, ahead_mode, follow, 16)  # reuses the cache the stopped run left (its stop's step ran too)
    engine.cached_tokens.clear()  # (no checkpoints kept: the follow-up is now read from position 0)
    again, _ = run(engine, 0, follow, 16)
    good = stopped == plain[:first] and cont == again
    ok &= good
    print(f"stopped at its token {first} ({'equal' if stopped == plain[:first] else 'DIFFER'}); follow-up on the "
          f"cache it left against the follow-up read afresh: {'equal' if cont == again else 'DIFFER'}")
    times = {0: [], ahead_mode: []}
    for _ in range(3):
        for mode in (0, ahead_mode):
            times[mode].append(run(engine, mode, prompt, args.tokens)[1])
    for mode, name in ((0, "plain loop"), (ahead_mode, "one step ahead")):
        ms = sorted(times[mode])
        print(f"{name:15} {ms[1] * 1e3:.3f} ms a token (median of 3 runs: {', '.join(f'{t * 1e3:.3f}' for t in ms)})"
              f", {1 / ms[1]:.1f} tok/s")
    # a sampled request (the default parameters: temperature 0.7, top-k 20, top-p 0.8, seeded): the same tokens
    # plain and ahead, and each one's wall clock a token
    sampled = {0: [], ahead_mode: []}
    for _ in range(3):
        for mode in (0, ahead_mode):
            sampled[mode].append(run(engine, mode, prompt, args.tokens, params=SamplingParams(seed=0)))
    same = all(tokens == sampled[0][0][0] for runs in sampled.values() for tokens, _ in runs)
    ok &= same
    print(f"sampled (seed 0): {len(set(sampled[0][0][0]))} distinct tokens, every run "
          f"{'equal' if same else 'DIFFERS'}")
    kernel_limit, draw.MAX_K = draw.MAX_K, 0  # the torch reference's draw instead of the one-launch kernel
    reference = run(engine, 0, prompt, args.tokens, params=SamplingParams(seed=0))[0]
    draw.MAX_K = kernel_limit
    ok &= reference == sampled[0][0][0]
    print(f"sampled through the draw's torch reference: {'equal' if reference == sampled[0][0][0] else 'DIFFERS'}")
    for mode, name in ((0, "plain loop"), (ahead_mode, "one step ahead")):
        ms = sorted(seconds for _, seconds in sampled[mode])
        print(f"{'sampled, ' + name:25} {ms[1] * 1e3:.3f} ms a token (median of 3 runs), {1 / ms[1]:.1f} tok/s")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
