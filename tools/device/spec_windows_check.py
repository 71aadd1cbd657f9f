"""On the GPU: verify windows through captured graphs (engine/spec_windows.py) against eager windows.

For each small synthetic model and placement, two engines with --spec 4: eager windows (decode_graphs off) and
captured ones (decode_graphs on). Both read the same windows of 4, 3, 2 and 1 rows (the eager engine's greedy
continuation with wrong drafts at known places, so windows keep 1..4 rows), keeping the rows greedy acceptance
keeps: every row's argmax must agree and its logits lie within BOUND of the largest; a hybrid model's recurrent
states after keep_rows within BOUND too. Then free-running greedy --spec 2/3/4 through graphs against plain greedy
through graphs: "tokens equal" is printed (bf16 near-ties may flip a token between a window and one-row steps:
reported, not failed). Exit 1 on a mismatch or when no window was captured.

    python3 tools/device/spec_windows_check.py MODEL_DIR [N] [PRESET]
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.hybrid_cache import HybridCache  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

DEVICE, GRAPHS = ("cuda", "on") if torch.cuda.is_available() else ("cpu", "eager")  # the CPU: a dry run
BOUND = 2e-2  # bf16 activations: the graphs' span (masked cells) may round differently
models = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
preset = sys.argv[3] if len(sys.argv) > 3 else "small"  # tiny: a quick dry run of the script on the CPU
prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(0)).tolist()
cases = [("qwen3moe", "Q4_0" if preset == "tiny" else "Q4_K", {}, {}), ("qwen3next", "Q4_0", {"nextn_layers": 1}, {}),
         ("qwen3next", "Q4_0", {"nextn_layers": 1}, {"expert_cache": 40})]
greedy = SamplingParams(temperature=0)
ok = True
print("| model | options | windows | argmax agree | max rel err | state rel err | captured | greedy = plain "
      "(--spec 2/3/4) |")
print("|---|---|---:|---:|---:|---:|---|---|")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


for arch, quant, shape, options in cases:
    path = models / f"windows-{arch}-{preset}-{quant}.gguf"
    if not path.exists():
        make_model(path, arch=arch, preset=preset, quant=quant, **shape)
    plain = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024, **options))
    truth = list(plain.generate(prompt, greedy, n))
    eager = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024, spec=4, decode_graphs="off", **options))
    graphs = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024, spec=4, decode_graphs=GRAPHS, **options))
    for e in (eager, graphs):
        e.prefill(prompt)
    # The first token comes from the prompt pass; each window is the last token and up to 3 drafts after it.
    history, agree, rows_seen, worst, state_worst, windows = list(prompt) + truth[:1], 0, 0, 0.0, 0.0, 0
    while len(history) - len(prompt) < len(truth) - 4:
        size = 4 - windows % 4  # 4, 3, 2, 1 rows, round and round
        pos = len(history) - len(prompt)
        window = [history[-1]] + truth[pos:pos + size - 1]
        if windows % 3 == 1 and size > 2:
            window[2] = (window[2] + 1) % 512  # a wrong draft: rows from there on are rejected
        start = len(history) - 1
        want = eager.spec.verify(window, start).float().clone()
        got = graphs.spec.verify(window, start).float()
        worst = max(worst, rel(got, want))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        rows_seen += len(window)
        keep = 1
        while keep < len(window) and int(want[keep - 1].argmax()) == window[keep]:
            keep += 1
        for e in (eager, graphs):
            e.spec.keep(start, keep)
        if isinstance(eager.kv, HybridCache):
            for layer in eager.kv.state:
                state_worst = max(state_worst, rel(graphs.kv.state[layer], eager.kv.state[layer]))
        history += window[1:keep] + [int(want[keep - 1].argmax())]
        windows += 1
    decoders = graphs.spec.windows.decoders.values() if graphs.spec.windows is not None else []
    captured = bool(decoders) and all(d.capture and d.programs or DEVICE == "cpu" for d in decoders)
    equal = []
    for window in (2, 3, 4):
        spec = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024, spec=window, decode_graphs=GRAPHS, **options))
        equal.append("yes" if list(spec.generate(prompt, greedy, n)) == truth else "NO")
    good = agree == rows_seen and worst <= BOUND and state_worst <= BOUND and captured
    ok &= good
    label = " ".join(f"{k}={v}" for k, v in options.items()) or "resident"
    print(f"| {arch} {quant} | {label} | {windows} | {agree}/{rows_seen} | {worst:.1e} | {state_worst:.1e} | "
          f"{'yes' if captured else 'NO'} | {'/'.join(equal)}{'' if good else ' FAIL'} |", flush=True)
print("ALL OK" if ok else "FAILURES")
sys.exit(0 if ok else 1)
