"""On the GPU: the captured decode with session 6's kernels (the one-launch decode attention of
kernels/attention/decode_short.py, the MoE add + norm + router + top-k of kernels/pointwise/add_norm_route.py: the
defaults) against the same model with STRATA_DECODE_ATTN_SPLITK and STRATA_ROUTE_SEPARATE (the kernels before
them): greedy tokens free-running with the defaults, then the previous kernels fed the same tokens: where their
argmax first differs is where their own greedy run would part (argmax agreement, the largest logit difference in
units of the largest logit), for each prompt length (its span bucket). `--only attn|route` switches one back only.

    python3 tools/device/attn_tokens_check.py MODEL.gguf [--tokens 32] [--prompts 300,900] [--kv-dtype float16]

Exit 1 if the free-running tokens differ where no near-tie (top-2 gap under 1e-2 of the largest logit) explains it.
"""

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402


def run(model: str, kv_dtype: str, prompts: list[list[int]], n: int, forced: list[list[int]] | None):
    """Per prompt (tokens, logits per step) of greedy decode after it, or of its `forced` tokens fed in; whether
    the steps ran captured."""
    engine = Engine(model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=4096, kv_dtype=kv_dtype))
    results = []
    for i, prompt in enumerate(prompts):
        logits, tokens, out = engine.prefill(prompt), [], []
        for step in range(n):
            tokens.append(int(logits[-1].argmax()) if forced is None else forced[i][step])
            out.append(logits[-1].float().clone())
            logits = engine.decode(tokens[-1], len(prompt) + step)
        results.append((tokens, torch.stack(out)))
    graphs = engine.decoder is not None and engine.decoder.capture
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return results, graphs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompts", default="300,900")
    parser.add_argument("--kv-dtype", default="float16")
    parser.add_argument("--only", choices=("attn", "route"), default=None, help="switch back only this kernel")
    args = parser.parse_args()
    before = {"STRATA_DECODE_ATTN_SPLITK": args.only != "route", "STRATA_ROUTE_SEPARATE": args.only != "attn"}
    lengths = [int(p) for p in args.prompts.split(",")]
    prompts = [torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in lengths]
    short, graphs = run(args.model, args.kv_dtype, prompts, args.tokens, None)
    with switches.override(**before):  # the previous kernels fed the new ones' tokens
        split, _ = run(args.model, args.kv_dtype, prompts, args.tokens, [tokens for tokens, _ in short])
    ok = True
    print(f"graphs {graphs}; against {' + '.join(k for k, v in before.items() if v)}; logits before each greedy "
          "pick (the prompt's last, then every decode step's)")
    print("| prompt | kv | greedy tokens equal | first difference | its top-2 gap / max | argmax agree | "
          "max logit diff / max |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for length, (tokens, short_logits), (_, split_logits) in zip(lengths, short, split):
        picks = split_logits.argmax(-1).tolist()
        first = next((i for i, (a, b) in enumerate(zip(tokens, picks)) if a != b), None)
        gap = "-"
        if first is not None:  # split-K free-running would have picked differently here
            top2 = split_logits[first].topk(2).values
            ratio = (top2[0] - top2[1]).item() / split_logits[first].abs().max().item()
            gap = f"{ratio:.1e}"
            ok &= ratio < 1e-2
        agree = sum(a == b for a, b in zip(tokens, picks)) / len(tokens)
        diff = ((split_logits - short_logits).abs().max() / short_logits.abs().max()).item()
        print(f"| {length} | {args.kv_dtype} | {first is None} | {'-' if first is None else first} | {gap} | "
              f"{agree:.3f} | {diff:.2e} |")
    print("OK" if ok else "FAIL: greedy tokens differ without a near-tie")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
