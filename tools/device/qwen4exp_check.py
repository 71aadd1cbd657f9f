"""qwen4exp on CUDA against the CPU: the tiny synthetic model's logits (float32: relative error, bound 1e-4;
bfloat16: argmax agreement), prompt path against token-by-token decode on CUDA, and greedy tokens. Then decode
through captured graphs (engine/decode_qwen4exp.py) against step by step (bfloat16, Q8_0 dense weights, Q2_0
experts; resident, behind an expert cache, int8 KV, and across 2,051 cells, where the indexer starts selecting):
teacher-forced argmax agreement, logits within GRAPH_BOUND of the largest, free-run tokens, tok/s both ways.

python3 tools/device/qwen4exp_check.py DIR [parity|graphs]   (writes DIR/tiny*.gguf; default: both parts)
"""

import dataclasses
import sys
import time
from pathlib import Path

import torch

import strata
from strata.engine.context import ForwardContext
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams
from strata.models.synthetic import make_model

BOUND = 1e-4
GRAPH_BOUND = 2e-2  # bf16 activations: the graphs' attention span (masked cells) may round differently
# (label, prompt tokens, options); "across": dense spans, then the 4,096 span's selecting step; "top_k" (not an
# engine option): the indexer keeps 8 + 3 cells, so every step of the 256 span selects and drops most cells; int8
# KV needs head_dim 64 (a second tiny file)
GRAPH_CASES = (("resident", 40, {}), ("expert_cache=12", 40, {"expert_cache": 12}),
               ("expert_cache=12, misses=direct", 40, {"expert_cache": 12, "misses": "direct"}),
               ("across 2,051 cells", 2030, {}), ("indexer top_k=8", 40, {"top_k": 8}),
               ("top_k=8, kv_dtype=int8", 40, {"top_k": 8, "kv_dtype": "int8"}))


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


def _timed_generate(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], float]:
    list(engine.generate(prompt, SamplingParams(temperature=0), 4))  # warm up (and capture the first span)
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = list(engine.generate(prompt, SamplingParams(temperature=0), n))
    torch.cuda.synchronize()
    return tokens, (n - 1) / (time.perf_counter() - start)


def graphs(out: Path, n: int = 64) -> int:
    """Captured decode against step by step on the tiny model; one table row per case, the failures' count."""
    paths = {64: make_model(out / "tiny-graphs-hd64.gguf", arch="qwen4exp", preset="tiny", quant="Q8_0", head_dim=64),
             32: make_model(out / "tiny-graphs.gguf", arch="qwen4exp", preset="tiny", quant="Q8_0")}
    failures = 0
    print("| case | steps | argmax agree | max rel err | free-run tokens equal | step-by-step tok/s | graph tok/s |"
          " graphs |")
    print("|---|---:|---:|---:|---|---:|---:|---|")
    for label, prompt_tokens, options in GRAPH_CASES:
        prompt = torch.randint(0, 512, (prompt_tokens,), generator=torch.Generator().manual_seed(1)).tolist()
        runs, options = {}, dict(options)
        top_k = options.pop("top_k", None)
        for mode in ("off", "on"):
            config = EngineConfig(device="cuda", n_ctx=4096, decode_graphs=mode, **options)
            engine = Engine(paths[64 if "kv_dtype" in options else 32], config)
            if top_k is not None:
                engine.model.qsa = dataclasses.replace(engine.model.qsa, top_k=top_k)
            runs[mode] = (engine, *_timed_generate(engine, prompt, n))
        (eager, want_tokens, eager_rate), (graph, got_tokens, graph_rate) = runs["off"], runs["on"]
        eager.prefill(prompt)
        graph.prefill(prompt)
        agree, worst = 0, 0.0
        for i, token in enumerate(want_tokens[:-1]):  # teacher-forced: one near-tie cannot hide the rest
            want = eager.decode(token, prompt_tokens + i).float()
            got = graph.decode(token, prompt_tokens + i).float()
            worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
            agree += int(got.argmax() == want.argmax())
        decoder, steps = graph.decoder, len(want_tokens) - 1
        captured = decoder is not None and decoder.capture and bool(decoder.programs)
        spans = sorted(decoder.programs) if decoder is not None else []
        cells = graph.model.qsa.selection_cells  # past it every step selects: a span beyond it must have run
        crossed = prompt_tokens + n <= cells or max(spans, default=0) > cells
        good = agree == steps and worst <= GRAPH_BOUND and captured and crossed and decoder.forward_steps == 0
        failures += not good
        print(f"| {label} | {steps} | {agree}/{steps} | {worst:.1e} | {'yes' if got_tokens == want_tokens else 'no'} | "
              f"{eager_rate:.1f} | {graph_rate:.1f} | {'captured' if captured else 'NOT captured'} (spans {spans}), "
              f"{decoder.steps if decoder else 0} static steps, {decoder.forward_steps if decoder else 0} forward"
              f"{'' if good else ' FAIL'} |", flush=True)
    return failures


if __name__ == "__main__":
    part = sys.argv[2] if len(sys.argv) > 2 else "all"
    failed = (main(Path(sys.argv[1])) if part in ("all", "parity") else 0) + \
        (graphs(Path(sys.argv[1])) if part in ("all", "graphs") else 0)
    print("ALL OK" if not failed else f"{failed} FAILURES")
    sys.exit(failed)
