"""On the GPU: offloaded prompt chunks with streamed experts give the bytes of all-resident (same kernels, experts read
from cache and ring slots), on the `small` qwen3moe (Q4_0, 8 layers of 32 experts) and caches of 64 and 160 slots;
with 200 slots, the chunks' expert work buffers in borrowed slots too (--prefill-borrow on): the same bytes, every
buffer inside the borrowed run, and the cache's experts back in their slots after the prompt."""

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import strata  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"  # "cpu" checks this script (reference loop, float32)
STREAM = "auto" if DEVICE == "cuda" else "on"  # auto: what a user gets on the GPU (chunks of >= 32 tokens)
CHUNKED_BOUND = 3e-2  # bf16 chunked vs one pass, next-token logits relative to the largest (the CPU test: 1e-3, fp32)
path = make_model(Path(tempfile.mkdtemp()) / "small-q4_0.gguf", arch="qwen3moe", preset="small", quant="Q4_0")
ids = torch.randint(0, 4096, (300,), generator=torch.Generator().manual_seed(0)).tolist()
resident = strata.LLM(path, device=DEVICE, prefill_chunk="auto:100").logits(ids)
ok = True
# A ring of one layer (32 slots lent of 64); of two layers (64 lent of 160); two layers and a run for work buffers.
for slots, borrow in ((64, "off"), (160, "off"), (200, "on")):
    llm = strata.LLM(path, device=DEVICE, expert_cache=slots, prefill_chunk="auto:100", prefill_stream=STREAM,
                     prefill_borrow=borrow)
    cache, streamer = llm.engine.model.experts.cache, llm.engine.model.experts.prompt
    cache.adapt_every = 10**9  # no adapting: the slots must come back as they were
    owners = list(cache.owner)
    arenas = []  # the engine gives the slots back when the prompt ends: keep the arena to look at
    give_back = streamer.return_slots
    streamer.return_slots = lambda: (arenas.append(streamer.arena), give_back())
    streamed = llm.logits(ids)
    stats = streamer.stats
    same = torch.equal(streamed, resident)
    ok &= same and stats.bytes_streamed > 0
    if borrow == "on":
        arena, n_work = next((a for a in arenas if a is not None), None), llm.engine.chunk_plan.work_slots
        high, over = (arena.high_water, arena.overflow_bytes) if arena is not None else (0, -1)
        used = high > 0 or DEVICE != "cuda"  # the CPU's reference loop takes no work buffers
        inside = arena is not None and over == 0 and used and high <= n_work * cache.slot_bytes
        back = cache.owner == owners and not cache.lent
        ok &= inside and back
        print(f"  work buffers in {n_work} borrowed slots: high water {high / 2**20:.1f} MiB, overflow {over} B: "
              f"{'PASS' if inside else 'FAIL'}; cache as before: {'PASS' if back else 'FAIL'}")
    print(f"cache {slots} slots, borrow {borrow}: streamed {stats.bytes_streamed / 1e6:.1f} MB in {stats.chunks} chunks "
          f"({stats.bytes_late / max(stats.bytes_streamed, 1):.0%} after the router, {stats.streamed_unused} unused); "
          f"logits identical to all-resident: {'PASS' if same else 'FAIL'}")
    if not same:
        print(f"  max abs difference {(streamed - resident).abs().max().item():.3e}")
whole = strata.LLM(path, device=DEVICE, prefill_chunk=len(ids)).logits(ids)[-1]
err = ((streamed[-1] - whole).abs().max() / whole.abs().max()).item()
ok &= err < CHUNKED_BOUND
print(f"chunked+streamed vs one resident pass, next-token logits: rel err {err:.2e} (bound {CHUNKED_BOUND:g}, bf16)")
print("ALL OK" if ok else "FAILURES")
sys.exit(0 if ok else 1)
