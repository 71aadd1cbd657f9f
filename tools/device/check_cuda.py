"""On the GPU: the engine's CUDA path against its CPU path and transformers, on exported tiny models (float32)."""

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import strata  # noqa: E402
from strata.tokenizer_train import train_small_bpe  # noqa: E402
from tools.export_hf import K_QUANT_SIZES, dequantized_hf_model, export_gguf, make_hf_model  # noqa: E402

BOUND = 1e-4  # relative to the largest logit, as the CPU tests require
tmp = Path(tempfile.mkdtemp())
ok = True
for arch in ("qwen2", "qwen3", "qwen3moe"):
    for qtype in ("F32", "Q8_0", "Q4_K"):
        model = make_hf_model(arch, seed=7, **(K_QUANT_SIZES if qtype == "Q4_K" else {}))
        path = tmp / f"{arch}-{qtype}.gguf"
        export_gguf(model, path, qtype, tokenizer_metadata=train_small_bpe(model.config.vocab_size))
        ids = torch.randint(0, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
        with torch.no_grad():
            ref = dequantized_hf_model(model, qtype)(torch.tensor([ids])).logits[0].double()
        for dtype, bound in (("float32", BOUND), ("bfloat16", 5e-2)):
            ours = strata.LLM(path, device="cuda", dtype=dtype).logits(ids).double()
            err = ((ours - ref).abs().max() / ref.abs().max()).item()
            agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
            good = err < bound
            ok &= good or dtype != "float32"
            print(f"{arch:9} {qtype:5} cuda {dtype:8}: max rel err vs transformers {err:.2e} (bound {bound:g}) "
                  f"argmax agree {agree:.1%} {'ok' if good else 'FAIL'}")
print("ALL OK" if ok else "FAILURES")
sys.exit(0 if ok else 1)
