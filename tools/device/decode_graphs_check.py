"""On the GPU: captured decode (engine/decode.py) against the step-by-step decode on small synthetic models.

For each model and placement: the step-by-step engine decodes N greedy tokens; the graph engine is then fed the
same tokens (teacher-forced, so one early near-tie cannot hide the rest) and must pick the same argmax at every
step, with logits within BOUND of the largest; a free-running greedy run of the graph engine must give the same
tokens too. Prints one table row per case; exit 1 on any mismatch or when no graph was captured.

    python3 tools/device/decode_graphs_check.py MODEL_DIR [N] [ARCH]   (ARCH: only that architecture's rows)
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

BOUND = 2e-2  # bf16 activations: the graphs' attention kernel and torch's SDPA round differently
# ... or the graph step may sit further from the float32 truth than the step-by-step one by at most this factor:
# each is checked against a float32 step-by-step run of the same tokens.
models = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 48
prompt = torch.randint(0, 4096, (40,), generator=torch.Generator().manual_seed(0)).tolist()
cases = [("qwen3moe", "Q4_K", {}), ("qwen3moe", "Q4_0", {"kv_dtype": "int8"}), ("qwen3moe", "Q4_0", {"expert_cache": 40}),
         ("qwen3moe", "Q4_0", {"expert_cache": 40, "misses": "direct"}),
         ("qwen3next", "Q4_0", {}), ("qwen3next", "Q4_0", {"expert_cache": 40}),
         ("qwen3next", "Q4_0", {"expert_cache": 40, "misses": "direct"})]
if len(sys.argv) > 3:
    cases = [case for case in cases if case[0] == sys.argv[3]]
ok = True
WORSE = 1.5
print("| model | options | steps | argmax agree | max rel err | vs float32: step-by-step / graphs | free-run tokens "
      "equal | eager tok/s | graph tok/s | graphs |")
print("|---|---|---:|---:|---:|---|---|---:|---:|---|")
for arch, quant, options in cases:
    path = models / f"graphs-{arch}-small-{quant}.gguf"
    if not path.exists():
        make_model(path, arch=arch, preset="small", quant=quant)
    runs = {}
    for mode in ("off", "on"):
        engine = Engine(path, EngineConfig(device="cuda", n_ctx=1024, decode_graphs=mode, **options))
        list(engine.generate(prompt, SamplingParams(temperature=0), 4))  # warm up (and capture the first span)
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = list(engine.generate(prompt, SamplingParams(temperature=0), n))
        torch.cuda.synchronize()
        runs[mode] = (engine, tokens, (n - 1) / (time.perf_counter() - start))
    (eager_engine, eager_tokens, eager_rate), (graph_engine, graph_tokens, graph_rate) = runs["off"], runs["on"]
    truth_engine = Engine(path, EngineConfig(device="cuda", n_ctx=1024, decode_graphs="off", dtype="float32"))
    agree, worst, eager_off, graph_off = 0, 0.0, 0.0, 0.0
    for engine in (eager_engine, graph_engine, truth_engine):
        engine.prefill(prompt)
    for i, token in enumerate(eager_tokens[:-1]):
        position = len(prompt) + i
        want = eager_engine.decode(token, position).float().clone()
        got = graph_engine.decode(token, position).float().clone()  # a static buffer: copied before the next step
        truth = truth_engine.decode(token, position).float()
        scale = truth.abs().max()
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
        eager_off = max(eager_off, ((want - truth).abs().max() / scale).item())
        graph_off = max(graph_off, ((got - truth).abs().max() / scale).item())
        agree += int(got.argmax() == want.argmax())
    decoder = graph_engine.decoder
    captured = decoder is not None and decoder.capture and bool(decoder.programs)
    steps = len(eager_tokens) - 1
    good = agree == steps and (worst <= BOUND or graph_off <= WORSE * eager_off) and captured
    ok &= good
    free = graph_tokens == eager_tokens
    label = " ".join(f"{k}={v}" for k, v in options.items()) or "resident"
    print(f"| {arch} {quant} | {label} | {steps} | {agree}/{steps} | {worst:.1e} | {eager_off:.1e} / {graph_off:.1e} | "
          f"{'yes' if free else 'no'} | "
          f"{eager_rate:.1f} | {graph_rate:.1f} | {'captured' if captured else 'NOT captured'}"
          f"{'' if good else ' FAIL'} |", flush=True)
print("ALL OK" if ok else "FAILURES")
sys.exit(0 if ok else 1)
