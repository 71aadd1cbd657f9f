"""qwen4exp on CUDA against the CPU: the tiny synthetic model's logits (float32: relative error, bound 1e-4;
bfloat16: argmax agreement), prompt path against token-by-token decode on CUDA, and greedy tokens.

python3 tools/device/qwen4exp_check.py DIR   (writes DIR/tiny-0000{1,2}-of-00002.gguf)
"""

import sys
from pathlib import Path

import torch

import strata
from strata.engine.context import ForwardContext
from strata.models.synthetic import make_model

BOUND = 1e-4


def main(out: Path) -> int:
    path = make_model(out / "tiny.gguf", arch="qwen4exp", preset="tiny", quant="F32")
    ids = torch.randint(0, 512, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = strata.LLM(path, device="cpu", kv_dtype="float32").logits(ids).double()
    failures = 0
    for dtype in ("float32", "bfloat16"):
        llm = strata.LLM(path, device="cuda", dtype=dtype, kv_dtype="float32")
        ours = llm.logits(ids).double().cpu()
        err = ((ours - ref).abs().max() / ref.abs().max()).item()
        agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
        ok = ours.isfinite().all().item() and (err < BOUND if dtype == "float32" else agree > 0.9)
        failures += not ok
        print(f"tiny qwen4exp cuda {dtype:8}: rel err vs cpu {err:.2e} (bound {BOUND:g} in float32), "
              f"argmax agree {agree:.1%}  {'ok' if ok else 'FAIL'}")
    model = strata.LLM(path, device="cuda", dtype="float32", kv_dtype="float32").engine.model
    cache = model.new_cache(64, torch.float32)
    prompt = ids[:40]
    whole = model.forward(torch.tensor(prompt, device="cuda"), ForwardContext(cache, 0, 40, want_all_logits=True))
    steps = torch.cat([model.forward(torch.tensor([t], device="cuda"), ForwardContext(cache, i, 1))
                       for i, t in enumerate(prompt)])
    err = ((steps - whole).abs().max() / whole.abs().max()).item()
    failures += not err < BOUND
    print(f"tiny qwen4exp cuda prompt vs token by token: rel err {err:.2e} (bound {BOUND:g})  "
          f"{'ok' if err < BOUND else 'FAIL'}")
    llm = strata.LLM(path, device="cuda", dtype="float32", kv_dtype="float32")
    gen = llm.generate(prompt, max_tokens=16, temperature=0).token_ids
    same = llm.logits(prompt + gen[:-1])[len(prompt) - 1 :].argmax(-1).tolist() == gen
    failures += not same
    print(f"tiny qwen4exp cuda greedy 16 tokens: {'same as' if same else 'DIFFERENT from'} the prompt path's argmax")
    return failures


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
