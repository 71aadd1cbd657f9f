"""On the GPU: the engine paths that only run on CUDA, each against its reference on the same GPU (bf16).

1. resident experts: the Triton prompt and decode (GEMV) kernels against the dequantize-on-use loop;
2. offloaded experts behind a small cache: the cached-hit slot GEMV + CPU pool against all-resident;
3. the int8 paged KV cache (compiled append / prompt / decode kernels) against the float16 cache.
Prints greedy-token agreement and the largest logit difference over the largest logit, per step.
Usage: python3 tools/device/validate_paths.py MODEL.gguf
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import strata.engine.experts as experts  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402

PROMPT, STEPS = 96, 24


def run(path: str, **config) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and each step's logits (float32, CPU)."""
    engine = Engine(path, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=256, **config))
    ids = torch.randint(0, engine.model.config.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    logits = engine.prefill(ids)
    tokens, steps = [], []
    for _ in range(STEPS):
        steps.append(logits[-1].float().cpu())
        token = int(steps[-1].argmax())
        tokens.append(token)
        logits = engine._forward([token], PROMPT + len(tokens) - 1, all_logits=False)
    del engine
    torch.cuda.empty_cache()
    return tokens, steps


def compare(name: str, a, b) -> None:
    (ta, la), (tb, lb) = a, b
    same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
    # Logits compared only while both runs saw the same tokens.
    err = max(float((x - y).abs().max() / x.abs().max()) for x, y in zip(la[: same + 1], lb[: same + 1]))
    print(f"{name:<44} greedy tokens equal for {same}/{len(ta)} steps, max |dlogit|/max|logit| {err:.2e}")


def main() -> None:
    path = sys.argv[1]
    resident = run(path)
    real_kernel_path = experts.kernel_path
    experts.kernel_path = lambda stack, x: None  # the dequantize-on-use loop, in bf16 on the same GPU
    loop = run(path)
    experts.kernel_path = real_kernel_path
    compare("resident: Triton kernels vs reference loop", resident, loop)
    cached = run(path, expert_cache=16)
    compare("cache of 16 slots + CPU pool vs resident", cached, resident)
    int8 = run(path, kv_dtype="int8")
    compare("int8 paged KV vs float16 KV", int8, resident)


if __name__ == "__main__":
    main()
