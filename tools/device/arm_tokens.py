"""On the GPU, for A/B arms (package copies under .ab/ARM): the greedy tokens and logits of the package in the
current directory, saved to compare with another arm's. Run in each arm, then compare:

    env -C .ab/ARM python3 $PWD/tools/device/arm_tokens.py MODEL.gguf --save /tmp/ARM.pt [--tokens 32]
    python3 tools/device/arm_tokens.py --compare /tmp/base.pt /tmp/ARM.pt

The comparison prints whether the tokens are equal, where they first part, and the largest logit difference over
the steps both ran with the same inputs, in units of the largest logit; exit 1 where the tokens differ.
"""

import argparse
import os
import sys

import torch


def generate(model: str, n: int, kv_dtype: str, device: str) -> dict:
    """Greedy tokens after a fixed prompt and the logits each was picked from, by the `strata` package imported."""
    import strata
    from strata.engine.engine import Engine, EngineConfig

    engine = Engine(model, EngineConfig(device=device, dtype="bfloat16", n_ctx=4096, kv_dtype=kv_dtype))
    prompt = [(7 * i + 3) % 1000 + 10 for i in range(40)]  # any fixed ids: the model is synthetic
    logits, tokens, out = engine.prefill(prompt), [], []
    for step in range(n):
        tokens.append(int(logits[-1].argmax()))
        out.append(logits[-1].float().cpu().clone())
        logits = engine.decode(tokens[-1], len(prompt) + step)
    graphs = engine.decoder is not None and engine.decoder.capture
    return {"tokens": tokens, "logits": torch.stack(out), "graphs": graphs,
            "package": os.path.dirname(os.path.dirname(strata.__file__))}


def compare(a: dict, b: dict) -> bool:
    """Print how two records agree; whether their tokens are equal."""
    same = a["tokens"] == b["tokens"]
    first = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), len(a["tokens"]))
    upto = min(first + 1, len(a["tokens"]))  # the steps fed the same tokens (the first differing pick's included)
    scale = a["logits"][:upto].abs().max().item()
    diff = (a["logits"][:upto] - b["logits"][:upto]).abs().max().item()
    print(f"{a['package']} vs {b['package']}: tokens {'equal' if same else f'differ from step {first}'} "
          f"({len(a['tokens'])} steps, graphs {a['graphs']}/{b['graphs']}); logits within {diff / scale:.3e} of the "
          f"largest over the first {upto} steps; bytes {'equal' if torch.equal(a['logits'], b['logits']) else 'differ'}")
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--save")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--kv-dtype", default="float16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compare", nargs=2)
    args = parser.parse_args()
    if args.compare:
        return 0 if compare(*(torch.load(p) for p in args.compare)) else 1
    sys.path.insert(0, os.getcwd())  # the arm's package (the directory this runs in), not the repository's
    torch.save(generate(args.model, args.tokens, args.kv_dtype, args.device), args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
