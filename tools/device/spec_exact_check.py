"""On the GPU: is a verify window's row the very step plain decoding takes at that position (issue 10's greedy
exactness)? For each small synthetic model and placement: a plain engine's decode gives the logits at every
position of a greedy continuation; a --spec 4 engine then reads the same continuation in windows of 4, 3, 2, 1 rows
(drafts = the true tokens, so every row is kept) and each row's logits are compared with plain's at that position:
rows bit-equal, worst relative error, and the smallest top-2 logit margin seen (how near a tie the run came). Then
free-running greedy --spec 2/3/4 against plain.

Cases marked "exact" are exact by construction (docs/ARCHITECTURES.md, "Verify windows, bit for bit"): exit 1 when
one of their rows is not bit-equal or their free-running greedy differs. An expert cache that adapts is placed
differently under windows than under steps (a window counts once), so those cases only report; the same cache
frozen after its start ("frozen": adapt_every past the run) is exact again.

PRESET: small (default), tiny (adds qwen4exp tiny with its MTP block), or qwen4exp (that case alone, on the tiny
shape: its own time cap). qwen4exp's windows run through its static step (engine/decode_qwen4exp.py: captured
with graphs on, each row the one-row step's bytes), as its plain decode does.

    python3 tools/device/spec_exact_check.py MODEL_DIR [N] [PRESET]
"""

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

DEVICE, GRAPHS = ("cuda", "on") if torch.cuda.is_available() else ("cpu", "eager")  # the CPU: a dry run
if DEVICE == "cpu":  # torch's CPU reductions split by thread count and row count (qwen4exp's GDN): one thread
    torch.set_num_threads(1)
models = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
preset = sys.argv[3] if len(sys.argv) > 3 else "small"
only_qwen4exp = preset == "qwen4exp"
preset = "tiny" if only_qwen4exp else preset
tokens = torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(0)).tolist()
K = "Q4_0" if preset == "tiny" else "Q4_K"  # tiny rows are shorter than a Q4_K block
FROZEN = {"expert_cache": 40, "frozen": True}
QWEN4EXP_EXACT = True  # its windows run its static step over their rows, each row that step's (decode_qwen4exp.py)
# (arch, quant, model shape, engine options, exact by construction)
cases = [("qwen3moe", K, {}, {}, True), ("qwen3moe", K, {}, {"decode_graphs": "eager"}, True),
         ("qwen3moe", K, {}, {"decode_graphs": "off"}, True),
         ("qwen3next", "Q4_0", {"nextn_layers": 1}, {}, True),
         ("qwen3next", "Q4_0", {"nextn_layers": 1}, {"expert_cache": 40}, False),
         ("qwen3next", "Q4_0", {"nextn_layers": 1}, FROZEN, True),
         ("qwen3next", "Q4_0", {"nextn_layers": 1}, {"expert_cache": 40, "misses": "cpu"}, False),
         ("qwen3next", "Q4_0", {"nextn_layers": 1}, {**FROZEN, "misses": "cpu"}, True)]
QWEN4EXP = [("qwen4exp", "Q8_0", {"mtp": True, "top_k": 8}, {}, QWEN4EXP_EXACT),  # selecting past 11 cells
            ("qwen4exp", "Q8_0", {"mtp": True, "top_k": 8}, {"decode_graphs": "eager"}, QWEN4EXP_EXACT),
            # An indexer budget of 253 (256 cells): a span of 256 attends densely, 512 selects; windows at 250..
            # cross 256 cells, so a window at the span of 512 holds rows of both kinds (picked on the device).
            ("qwen4exp", "Q8_0", {"mtp": True, "top_k": 8}, {"top_k": 253, "prompt": 250}, QWEN4EXP_EXACT)]
if only_qwen4exp:
    cases = QWEN4EXP
elif preset == "tiny":  # qwen4exp has no small preset
    cases.append(QWEN4EXP[0])


def engine(path, frozen: bool, top_k: int | None = None, **options) -> Engine:
    """An engine; `frozen`: its expert cache never adapts (its placement stays the start's, for every engine);
    `top_k`: qwen4exp's indexer budget, in place of the file's."""
    made = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024, **options))
    if top_k is not None:
        made.model.qsa = dataclasses.replace(made.model.qsa, top_k=top_k)
    cache = getattr(made.model.experts, "cache", None)
    if frozen and cache is not None:
        cache.adapt_every = 1 << 40
    return made


greedy = SamplingParams(temperature=0)
ok = True
print("| model | options | rows | bit-equal rows | argmax agree | max rel err | min top-2 margin | greedy = plain "
      "(--spec 2/3/4) |")
print("|---|---|---:|---:|---:|---:|---:|---|")
for arch, quant, shape, options, exact in cases:
    path = models / f"exact-{arch}-{preset}-{quant}.gguf"
    made = path.with_name(path.stem + "-00001-of-00002.gguf")  # qwen4exp's split GGUF: the first shard
    if made.exists():
        path = made
    elif not path.exists():
        path = make_model(path, arch=arch, preset=preset, quant=quant, **shape)
    options = {"decode_graphs": GRAPHS, **options}
    frozen = options.pop("frozen", False)
    prompt = tokens[:options.pop("prompt", 40)]
    label = " ".join(f"{k}={v}" for k, v in options.items()) + (" frozen" if frozen else "")
    if len(prompt) != 40:
        label += f" prompt={len(prompt)}"
    try:
        plain = engine(path, frozen, **options)
        logits = plain.prefill(prompt)[-1:].float().clone()
        truth, steps = [], []
        for i in range(n):
            token = int(logits[-1].argmax())
            truth.append(token)
            steps.append(logits[-1].clone())
            logits = plain.decode(token, len(prompt) + i).float()
        spec = engine(path, frozen, spec=4, **options)
        spec.prefill(prompt)
        pos, n_windows, rows, equal, agree, worst, margin = 1, 0, 0, 0, 0, 0.0, float("inf")
        while pos + 4 < n:
            size = 4 - n_windows % 4
            window = truth[pos - 1:pos - 1 + size]
            got = spec.spec.verify(window, len(prompt) + pos - 1).float()
            for r in range(size):
                want = steps[pos + r]
                rows += 1
                equal += int(torch.equal(got[r], want))
                agree += int(int(got[r].argmax()) == int(want.argmax()))
                worst = max(worst, ((got[r] - want).abs().max() / want.abs().max()).item())
                top = want.topk(2).values
                margin = min(margin, (top[0] - top[1]).item())
            spec.spec.keep(len(prompt) + pos - 1, size)
            pos += size
            n_windows += 1
        windows = spec.spec.windows  # after its runs: a capture that failed leaves them uncaptured
        label += (" [windows: " + ("eager forward" if windows is None else "captured" if windows.capture else
                                   "static, uncaptured") + "]")
        same = []
        for w in (2, 3, 4):
            e = engine(path, frozen, spec=w, **options)
            same.append("yes" if list(e.generate(prompt, greedy, n)) == truth else "NO")
        good = equal == rows and "NO" not in same if exact else True
        ok &= good
        verdict = ("" if good else " FAIL") if exact else (" (adapting: exact only frozen)" if "expert_cache" in options
                                                             else " (reported: not exact by construction yet)")
        print(f"| {arch} {quant} | {label} | {rows} | {equal}/{rows} | {agree}/{rows} | {worst:.1e} | {margin:.3g} | "
              f"{'/'.join(same)}{verdict} |", flush=True)
    except Exception as exc:  # one case's failure must not hide the others'
        ok = False
        print(f"| {arch} {quant} | {label} | error: {type(exc).__name__}: {str(exc)[:160]} |", flush=True)
print("ALL OK" if ok else "FAILURES")
sys.exit(0 if ok else 1)
