"""On the GPU: the captured decode with STRATA_PDL (kernels/pdl.py: the step's kernels launched with programmatic
dependent launch) against the same engine without it: greedy tokens free-running after one random prompt, and the
logits before each token byte for byte (PDL reorders loads around a wait; the sums are the same, so the bytes must
be). One engine (one model load); each mode's graphs are captured afresh (a span's first step eager, then captured)
under switches.override, the prompt prefilled again each time (after a first default run, so that every compared
run reuses the prompt's cached prefix the same way).

    python3 tools/device/pdl_check.py MODEL.gguf [--tokens 32] [--prompt-tokens 32] [--modes 1,2,3] [--vram-budget GIB]

Prints per mode: whether the steps ran captured, tokens equal, logits equal (or the largest difference in units
of the largest logit, and the first step that differs). Exit 1 if any mode's tokens or logits differ, or if a
mode's steps did not run captured while the default's did (a capture that failed with PDL).
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402


def greedy(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor, bool]:
    """(greedy tokens, the logits before each [n, vocab] float32, whether the decoder ran captured), graphs fresh."""
    decoder = engine.decoder
    if decoder is not None and hasattr(decoder, "programs"):
        decoder.programs.clear()  # capture again under the current switches (the launches' options)
    logits, tokens, seen = engine.prefill(prompt), [], []
    for step in range(n):
        seen.append(logits[-1].float().clone())
        tokens.append(int(logits[-1].argmax()))
        logits = engine.decode(tokens[-1], len(prompt) + step)
    torch.cuda.synchronize()
    captured = decoder is not None and bool(getattr(decoder, "capture", False)) and bool(decoder.programs)
    return tokens, torch.stack(seen), captured


def compare(tokens, logits, want_tokens, want_logits) -> tuple[str, bool, bool]:
    """A run against the reference run: a line (tokens equal, the first that differs, the logits' bytes or their
    largest difference in units of the largest logit, up to that token), whether the tokens and the bytes agree."""
    same = sum(a == b for a, b in zip(tokens, want_tokens))
    first = next((i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), None)
    steps = min(len(logits), first + 1 if first is not None else len(logits))  # logits until the tokens part
    diff = (logits[:steps] - want_logits[:steps]).abs().amax(-1) / want_logits[:steps].abs().amax(-1)
    bytes_equal = torch.equal(logits[:steps], want_logits[:steps])
    differ = (diff > 0).nonzero()
    where = f", first at step {int(differ[0])}" if len(differ) else ""
    line = (f"tokens equal {same}/{len(want_tokens)}{'' if first is None else f' (first differs at step {first})'}; "
            f"logits {'byte-equal' if bytes_equal else f'differ: max {float(diff.max()):.3e} of the largest logit{where}'}")
    return line, first is None, bytes_equal


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--modes", default="1,2,3")
    parser.add_argument("--vram-budget", type=float, default=None)
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.ctx,
                                             vram_budget=args.vram_budget))
    vocab = engine.model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(7)).tolist()
    with switches.override(STRATA_PDL=0):
        greedy(engine, prompt, args.tokens)  # the first run prefills the whole prompt; later ones reuse its prefix
        want_tokens, want_logits, want_captured = greedy(engine, prompt, args.tokens)
    print(f"default: captured {want_captured}; tokens {want_tokens[:12]}...")
    ok = True
    for mode in (int(m) for m in args.modes.split(",")):
        with switches.override(STRATA_PDL=mode):
            tokens, logits, captured = greedy(engine, prompt, args.tokens)
        line, tokens_equal, bytes_equal = compare(tokens, logits, want_tokens, want_logits)
        print(f"STRATA_PDL={mode}: captured {captured}; {line}")
        ok = ok and tokens_equal and bytes_equal and (captured or not want_captured)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
