"""On the GPU: the decode misses' new paths (issue 4, branch missbw) give captured decode's tokens and bytes.

A small synthetic qwen3moe (Q4_0), captured decode behind a 48-slot cache with `--misses direct` (adapting: misses
and swaps every step), run with the misses read in place (the default), copied into scratch (STRATA_MISSES_COPY:
the gather launches, the down parts beside the gate/up GEMV), inside conditional graph nodes (STRATA_MISSES_SKIP),
and both. Each must give the default's greedy tokens and final logits bytes (the same kernels and tiles on the same
bytes; a skipped layer adds memset zeros where the kernels add exact zeros), and must have taken its path while
the graphs were captured. Prints one line per check; exit 1 on a failure.

    python3 tools/device/missbw_check.py MODEL_DIR [STEPS]
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine import direct_misses  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from strata.kernels.moe import miss_copy  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

models = Path(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 32
path = models / "small-qwen3moe-q4_0.gguf"
if not path.exists():
    make_model(path, arch="qwen3moe", preset="small", quant="Q4_0")
prompt = torch.randint(0, 4096, (20,), generator=torch.Generator().manual_seed(0)).tolist()  # < 32: direct too
ok = True
seen = {"gather": 0, "conditional": 0}


def check(name: str, passed: bool, detail: str = "") -> None:
    global ok
    ok &= bool(passed)
    print(f"{'PASS' if passed else 'FAIL'} {name} {detail}", flush=True)


def counting(fn, key):
    def wrapped(*args, **kwargs):
        if torch.cuda.is_current_stream_capturing():
            seen[key] += 1
        return fn(*args, **kwargs)
    return wrapped


miss_copy.launch_copy_misses = counting(miss_copy.launch_copy_misses, "gather")
direct_misses.only_if_missed = counting(direct_misses.only_if_missed, "conditional")


def run(**flags):
    for key in seen:
        seen[key] = 0
    with switches.override(**flags):
        engine = Engine(path, EngineConfig(device="cuda", n_ctx=256, expert_cache=48, misses="direct"))
        engine.model.experts.cache.adapt_every = 1
        tokens = list(engine.generate(prompt, SamplingParams(temperature=0), steps))
        logits = engine.decode(tokens[-1], len(prompt) + len(tokens) - 1).float().cpu().numpy().tobytes()
    torch.cuda.synchronize()
    captured = engine.decoder is not None and engine.decoder.capture and bool(engine.decoder.programs)
    return tokens, logits, captured, dict(seen)


want_tokens, want_logits, captured, _ = run()
check("default: graphs captured", captured)
for flags in (dict(STRATA_MISSES_COPY=True), dict(STRATA_MISSES_SKIP=True),
              dict(STRATA_MISSES_COPY=True, STRATA_MISSES_SKIP=True)):
    name = "+".join(k.removeprefix("STRATA_MISSES_").lower() for k in flags)
    try:
        tokens, logits, captured, counts = run(**flags)
    except Exception as e:  # noqa: BLE001  (a line: the other paths still run)
        check(f"{name}: decodes", False, f"{type(e).__name__}: {str(e)[:300]}")
        continue
    took = (counts["gather"] > 0 or "STRATA_MISSES_COPY" not in flags) and (
        counts["conditional"] > 0 or "STRATA_MISSES_SKIP" not in flags)
    check(f"{name}: graphs captured through its path", captured and took, str(counts))
    check(f"{name}: the default's tokens", tokens == want_tokens,
          f"({sum(a == b for a, b in zip(tokens, want_tokens))}/{len(want_tokens)} equal)")
    check(f"{name}: the default's logits bytes", logits == want_logits)
print("ALL OK" if ok else "SOME FAILED")
sys.exit(0 if ok else 1)
