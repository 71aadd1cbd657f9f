"""On the GPU: the captured decode with STRATA_DECODE_CHAIN (kernels/moe/chain_moe.py: each MoE layer's o
projection, routing, experts and closing norm in one launch; kernels/pointwise/chain_qkv_store.py: the q/k/v matvec
with its norm + RoPE + store in another) against the same engine without it: greedy tokens free-running after one
random prompt and the logits before each token. One engine (one model load); each config's graphs are captured
afresh under switches.override, the prompt prefilled again each time (after a first default run, so that every
compared run reuses the prompt's cached prefix the same way).

    python3 tools/device/chain_check.py MODEL.gguf [--tokens 32] [--prompt-tokens 32] [--configs 1,4:0:0]

Prints per config: whether the steps ran captured, how many launches of each chain were made (captures and eager
steps), tokens equal, logits byte-equal or their largest difference in units of the largest logit. Compiled, a
phase run at another warp count than its own kernel's may sum in another order (bench moe-chain checks the chained
bytes against the separate launches at the chain's warps), so logits may differ by roundings; tokens should not,
except at a near-tie. Exit 1 if a config made no chained launch, did not run captured while the default did, or
changed tokens.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine import static_kv  # noqa: E402
from strata.kernels.moe import chain_moe  # noqa: E402
from tools.device.pdl_check import compare, greedy  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--configs", default="1")
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.ctx))
    vocab = engine.model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(7)).tolist()
    launches = []
    real = chain_moe.chain_moe_triton

    def counted(*a, **k):  # the glue (models/moe_chain.py) looks the launch up on the module at each call
        out = real(*a, **k)
        launches.append(out is not None)
        return out

    chain_moe.chain_moe_triton = counted
    qkv_launches = []
    real_qkv = static_kv.chain_qkv_store

    def counted_qkv(*a, **k):  # the captured step's q/k/v chain, looked up on engine/static_kv.py at each call
        out = real_qkv(*a, **k)
        qkv_launches.append(out is not None)
        return out

    static_kv.chain_qkv_store = counted_qkv
    with switches.override(STRATA_DECODE_CHAIN=""):
        greedy(engine, prompt, args.tokens)  # the first run prefills the whole prompt; later ones reuse its prefix
        want_tokens, want_logits, want_captured = greedy(engine, prompt, args.tokens)
    print(f"unchained: captured {want_captured}; chained launches {sum(launches)}; tokens {want_tokens[:12]}...")
    ok = not launches
    for config in args.configs.split(","):
        launches.clear()
        qkv_launches.clear()
        with switches.override(STRATA_DECODE_CHAIN=config):
            tokens, logits, captured = greedy(engine, prompt, args.tokens)
        line, tokens_equal, _ = compare(tokens, logits, want_tokens, want_logits)
        print(f"STRATA_DECODE_CHAIN={config}: captured {captured}; chained launches {sum(launches)} "
              f"(declined {len(launches) - sum(launches)}), q/k/v chains {sum(qkv_launches)} (declined "
              f"{len(qkv_launches) - sum(qkv_launches)}); {line}")
        ok = ok and tokens_equal and sum(launches) > 0 and (captured or not want_captured)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
