"""On the GPU: `--misses direct` adapting without host waits (issue 4), on a small synthetic qwen3moe (Q4_0).

Captured decode with a small expert cache that adapts every step (the most windows and swaps): no readout is ever
waited for while decoding; hits + misses = every routed pair of every step; two runs give the same tokens, logits
bytes, decayed counts and slots; the tokens match the all-resident engine's (argmax agreement under teacher
forcing is decode_graphs_check.py's job; here the free run, reported). STRATA_ADAPT_SYNC (the old schedule) runs
too. Prints one line per check; exit 1 on a failure.

    python3 tools/device/adaptasync_check.py MODEL_DIR [STEPS]
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine.direct_misses import Readout  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.expert_cache import ExpertCache  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

models = Path(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 48
path = models / "small-qwen3moe-q4_0.gguf"
if not path.exists():
    make_model(path, arch="qwen3moe", preset="small", quant="Q4_0")
prompt = torch.randint(0, 4096, (20,), generator=torch.Generator().manual_seed(0)).tolist()  # < 32: direct too
ok = True


def check(name: str, passed: bool, detail: str = "") -> None:
    global ok
    ok &= bool(passed)
    print(f"{'PASS' if passed else 'FAIL'} {name} {detail}")


def run(adapt_every: int, **options):
    engine = Engine(path, EngineConfig(device="cuda", n_ctx=256, **options))
    cached = "expert_cache" in options
    if cached:
        engine.model.experts.cache.adapt_every = adapt_every
    tokens = list(engine.generate(prompt, SamplingParams(temperature=0), steps))
    logits = engine.decode(tokens[-1], len(prompt) + len(tokens) - 1).float().cpu().numpy().tobytes()
    torch.cuda.synchronize()
    return engine, tokens, logits


waits = []
wait = Readout.wait
Readout.wait = lambda self: (waits.append(1), wait(self))
end_step = ExpertCache.end_step


def strict_end_step(self):
    """The cache's step end (readouts, adapting, swaps, table updates) with any synchronizing torch op an error."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        end_step(self)
    finally:
        torch.cuda.set_sync_debug_mode(0)


resident, want, _ = run(1)
ExpertCache.end_step = strict_end_step
engine, tokens, logits = run(1, expert_cache=48, misses="direct")
decode_waits = len(waits)
print("PASS no synchronizing op in the cache's step ends (sync debug mode: error)")
again, tokens2, logits2 = run(1, expert_cache=48, misses="direct")
ExpertCache.end_step = end_step
cache = engine.model.experts.cache
check("graphs captured", engine.decoder is not None and engine.decoder.capture and engine.decoder.programs)
check("no readout waited for while decoding", decode_waits == 0, f"({decode_waits} waits)")
table = cache.device_table
table.read_stats()
c = engine.model.config
n_moe = len(table.row)
# The prompt, a decode step after each token (generate's last one too), and the decode() that reads the logits.
pairs = (len(prompt) + len(tokens) + 1) * c.n_experts_used * n_moe
check("hits + misses = routed pairs", cache.stats.hits + cache.stats.misses == pairs,
      f"({cache.stats.hits} + {cache.stats.misses} vs {pairs}; hit rate {cache.stats.hit_rate:.1%}, "
      f"{cache.stats.swaps} swaps in {cache.stats.adapts} adapts)")
check("the table on the device is its host mirror", torch.equal(table.table.cpu(), table.host))
check("the misses' table is its complement", torch.equal(table.missing, torch.where(table.table >= 0, -1,
                                                                                  table.expert_ids)))
same = (tokens, logits) == (tokens2, logits2) and list(cache.owner) == list(again.model.experts.cache.owner) and all(
    torch.equal(a, b) for a, b in zip(cache.counts.values(), again.model.experts.cache.counts.values()))
check("the same run twice: same tokens, logits bytes, slots, decayed counts", same)
agree = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), len(want))
print(f"INFO free-run tokens equal to all-resident for {agree} of {len(want)}")
with switches.override(STRATA_ADAPT_SYNC=True):
    old, old_tokens, _ = run(4, expert_cache=48, misses="direct")
old.model.experts.cache.device_table.read_stats()
s = old.model.experts.cache.stats
check("STRATA_ADAPT_SYNC runs (old schedule)", s.hits + s.misses == pairs and s.adapts > 0,
      f"({s.adapts} adapts, {s.swaps} swaps, tokens equal to the default's for "
      f"{next((i for i, (a, b) in enumerate(zip(old_tokens, tokens)) if a != b), len(tokens))})")
sys.exit(0 if ok else 1)
