"""On the GPU: greedy MTP drafts through captured graphs (engine/spec_mtp.py) against eager MTP drafts, and the host
syncs a window costs.

For each model (the trained default model, whose MTP head is accepted; a small synthetic qwen3next with a random
one), two --spec 4 engines with captured windows: one drafts through the MTP graphs, the other eagerly (its
mtp_steps removed). Both follow plain greedy decoding's continuation (drafts cut where they are wrong, as
acceptance would), each proposing its own drafts for the same history: "drafts equal" counts the windows whose
drafts agree (bf16: the graphs' span masks cells the eager step never sees, so a near-tie may flip; at least
MIN_EQUAL of them must agree). Then free-running greedy --spec 4 against plain greedy ("greedy = plain"; bf16
near-ties between a window and one-row steps: reported, not failed), counting the synchronizing CUDA calls per
window (torch.cuda.set_sync_debug_mode) once the prompt's cells are in. Exit 1 when the MTP steps were not captured
or too few drafts agree.

    python3 tools/device/spec_mtp_check.py MODEL_DIR [N] [qwen4exp]

With `qwen4exp`: the tiny qwen4exp with its MTP block (Q8_0) alone, whose drafts read the trunk's [hc, embd] stack.
"""

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.sampling import Sampler, SamplingParams  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

DEVICE, GRAPHS = ("cuda", "on") if torch.cuda.is_available() else ("cpu", "eager")  # the CPU: a dry run
MIN_EQUAL = 0.9
ROOT = Path(__file__).resolve().parents[2]
models = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 48
only_qwen4exp = len(sys.argv) > 3 and sys.argv[3] == "qwen4exp"
greedy = SamplingParams(temperature=0)


def cases():
    if only_qwen4exp:
        path = models / "mtp-check-qwen4exp-tiny.gguf"
        shard = path.with_name(path.stem + "-00001-of-00002.gguf")
        if not shard.exists():
            make_model(path, arch="qwen4exp", preset="tiny", quant="Q8_0", mtp=True)
        yield "qwen4exp tiny", shard, torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(0)).tolist()
        return
    default = ROOT / "strata/data/default-model/strata-default-qwen3next-q8_0.gguf"
    if default.exists():
        yield "trained default", default, None
    path = models / "mtp-check-qwen3next-small.gguf"
    if not path.exists():
        make_model(path, arch="qwen3next", preset="small" if DEVICE == "cuda" else "tiny", quant="Q4_0",
                   nextn_layers=1)
    yield "synthetic small", path, torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(0)).tolist()


def syncs_per_window(engine: Engine, prompt: list[int]) -> tuple[list[int], float]:
    """Greedy --spec tokens and the synchronizing CUDA calls per window after the first (the prompt's catch-up)."""
    spec, out, counted = engine.spec, [], []
    tokens = engine.generate(prompt, greedy, n)
    out.append(next(tokens))
    out.append(next(tokens))  # the first window (eager MTP over the prompt's cells) has run
    windows = spec.stats.windows
    if DEVICE != "cuda":
        return out + list(tokens), float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out += list(tokens)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        counted = [w for w in caught if "synchroniz" in str(w.message)]
    return out, len(counted) / max(spec.stats.windows - windows, 1)


ok = True
print("| model | windows | MTP captured | drafts equal (graphs / eager) | acceptance graphs | acceptance eager | "
      "syncs per window | greedy = plain |")
print("|---|---:|---|---:|---|---|---:|---|")
for label, path, prompt in cases():
    plain = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024))
    if prompt is None:
        text = (ROOT / "strata/data/tokenizer_corpus.txt").read_text(encoding="utf-8")
        prompt = plain.tokenizer.encode(text)[:200]
    truth = list(plain.generate(prompt, greedy, n))
    graphs = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024, spec=4, decode_graphs=GRAPHS))
    eager = Engine(path, EngineConfig(device=DEVICE, n_ctx=1024, spec=4, decode_graphs=GRAPHS))
    eager.spec.mtp_steps = None
    for e in (graphs, eager):
        e.prefill(prompt)
    history, equal, windows = list(prompt) + truth[:1], 0, 0
    while len(history) - len(prompt) < len(truth) - 4:
        proposed = [e.spec.propose(history, 3, Sampler(greedy)) for e in (graphs, eager)]
        tokens = [[d.token for d in drafts] for drafts in proposed]
        equal += tokens[0] == tokens[1]
        pos = len(history) - len(prompt)
        keep = 0  # the drafts greedy acceptance keeps: those equal to the continuation
        while keep < len(tokens[0]) and tokens[0][keep] == truth[pos + keep]:
            keep += 1
        window, start = [history[-1]] + tokens[0], len(history) - 1
        for e in (graphs, eager):
            e.spec.verify(window, start)
            e.spec.keep(start, keep + 1)
        history += truth[pos:pos + keep + 1]
        windows += 1
    steps = graphs.spec.mtp_steps
    captured = steps is not None and (DEVICE == "cpu" or (steps.capture and bool(steps.programs)))
    acceptance = []
    for e in (graphs, eager):
        e.spec.stats = type(e.spec.stats)(4)
    for e in (graphs, eager):
        e.cached_tokens = []  # the same work as the plain run: the prompt from position 0
    runs = [syncs_per_window(e, prompt) for e in (graphs, eager)]
    for e in (graphs, eager):
        acceptance.append(" ".join(f"{a:.2f}" for a in e.spec.stats.acceptance()))
    same = "/".join("yes" if out == truth else "NO" for out, _ in runs)
    good = captured and equal >= MIN_EQUAL * windows
    ok &= good
    print(f"| {label} | {windows} | {'yes' if captured else 'NO'} | {equal}/{windows} | {acceptance[0]} | "
          f"{acceptance[1]} | {runs[0][1]:.1f} (eager MTP: {runs[1][1]:.1f}) | {same}{'' if good else ' FAIL'} |",
          flush=True)
print("ALL OK" if ok else "FAILURES")
sys.exit(0 if ok else 1)
