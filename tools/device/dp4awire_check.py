"""On the GPU: the captured decode with STRATA_DP4A (models/dp4a_step.py: the step's Q4_0 q/k/v, o and resident
experts through the dp4a GEMVs) against the same engine unset: greedy tokens free-running after one random prompt
and the logits before each token (pdl_check.py's comparison: tokens equal out of N, the logits' largest difference
in units of the largest logit up to the first token that differs), with how many times each dp4a entry point ran
while the graphs were made (eager first step + capture: none means the switch took nothing).

    python3 tools/device/dp4awire_check.py MODEL.gguf [--tokens 32] [--prompt-tokens 32] [--bound 0.05] [--split]

--split: the dp4a run with STRATA_DP4A_SPLIT too (the dense matvecs on split rows, counted as split_dp4a_matvec).

Exit 1 if the dp4a run did not run captured (while the unset one did), ran no dp4a launch, or its logits sit more
than --bound of the largest logit from the unset run's before the tokens part (tokens themselves may differ at
near-ties: reported, not failed)."""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pdl_check import compare, greedy  # noqa: E402

from strata import switches  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.kernels.moe import dp4a_gemv  # noqa: E402
from strata.kernels.quant import q4_0_split  # noqa: E402
from strata.models import dp4a_step  # noqa: E402


def count_calls() -> dict:
    """Wrap dp4a_gemv's entry points with counters (the step module calls them through the module)."""
    calls: dict = {}
    for module, name in ((dp4a_gemv, "dp4a_matvec"), (dp4a_gemv, "dp4a_gate_up"), (dp4a_gemv, "dp4a_down"),
                         (dp4a_gemv, "quantize_x"), (q4_0_split, "split_dp4a_matvec")):
        real = getattr(module, name)

        def spy(*a, _real=real, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **k)

        setattr(module, name, spy)
    return calls


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--bound", type=float, default=0.05)
    parser.add_argument("--split", action="store_true", help="STRATA_DP4A_SPLIT too in the dp4a run")
    args = parser.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.ctx))
    vocab = engine.model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(7)).tolist()
    calls = count_calls()
    with switches.override(STRATA_DP4A=False):
        greedy(engine, prompt, args.tokens)  # the first run prefills the whole prompt; later ones reuse its prefix
        want_tokens, want_logits, want_captured = greedy(engine, prompt, args.tokens)
    unset_calls = dict(calls)
    print(f"unset: captured {want_captured}; dp4a calls {unset_calls}; tokens {want_tokens[:12]}...")
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_SPLIT=args.split):
        tokens, logits, captured = greedy(engine, prompt, args.tokens)
    line, _, _ = compare(tokens, logits, want_tokens, want_logits)
    first = next((i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), len(tokens) - 1)
    steps = first + 1
    diff = float(((logits[:steps] - want_logits[:steps]).abs().amax(-1)
                  / want_logits[:steps].abs().amax(-1)).max())
    switched = "STRATA_DP4A=1" + (" STRATA_DP4A_SPLIT=1" if args.split else "")
    print(f"{switched}: captured {captured}; dp4a calls {calls}; {line}")
    matvecs = calls.get("split_dp4a_matvec" if args.split else "dp4a_matvec", 0)
    with switches.override(STRATA_DP4A=True):  # STRATA_DP4A_PARTS from the environment: whose launches to expect
        experts = dp4a_step.takes("experts")
        dense = dp4a_step.takes("qkv") or dp4a_step.takes("o")
    ok = (not unset_calls and (matvecs > 0) == dense
          and (calls.get("dp4a_down", 0) > 0) == experts and (calls.get("dp4a_gate_up", 0) > 0) == experts
          and (captured or not want_captured) and diff <= args.bound)
    print(f"logits max diff {diff:.3e} of the largest (bound {args.bound}); {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
