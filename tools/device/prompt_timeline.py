"""The copy stream against the compute stream in one profiled prompt (profile_prompt.py --timeline): from torch
profiler's trace, each stream's kernels as intervals; how much of the streamed experts' gather time runs while the
compute stream is busy (overlap), how long the link sits idle between gathers while the prompt runs, and the
gathers one by one (start, length, what the compute stream did meanwhile).
"""

import json
import tempfile

GATHER = "_gather_kernel"  # kernels/moe/expert_gather.py: the streamed experts' copy
COPY_KINDS = ("memcpy", "gpu_memcpy")  # copy-engine transfers, where a path uses them


def _union(intervals):
    """Sorted, merged [start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _overlap(a, b) -> float:
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def report(prof, show: int = 12) -> None:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e
              and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not events:
        print("timeline: no device events in the trace")
        return
    copies = [e for e in events if GATHER in e["name"] or e.get("cat") == "gpu_memcpy"]
    copy_streams = {e["args"].get("stream") for e in copies}
    compute = [e for e in events if e["args"].get("stream") not in copy_streams]
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    c_busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in compute])
    g_busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in copies])
    wall = (t1 - t0) / 1e3
    c_ms = sum(e - s for s, e in c_busy) / 1e3
    g_ms = sum(e - s for s, e in g_busy) / 1e3
    both = _overlap(c_busy, g_busy) / 1e3
    print(f"\ntimeline: {wall:.1f} ms from the first device event to the last; compute streams busy {c_ms:.1f} ms "
          f"({c_ms / wall:.0%}), copy stream(s) {sorted(copy_streams)} busy {g_ms:.1f} ms ({g_ms / wall:.0%}) in "
          f"{len(copies)} copies; both at once {both:.1f} ms ({both / max(g_ms, 1e-9):.0%} of the copies' time); "
          f"neither {wall - c_ms - g_ms + both:.1f} ms")
    gaps = [(g_busy[i + 1][0] - g_busy[i][1]) / 1e3 for i in range(len(g_busy) - 1)]
    if gaps:
        print(f"  link idle between copies: {sum(gaps):.1f} ms in {len(gaps)} gaps (largest {max(gaps):.2f} ms)")
    print(f"  the first {show} copies: start ms, length ms, compute busy during it (ms), compute kernels during it")
    for e in sorted(copies, key=lambda e: e["ts"])[:show]:
        span = [[e["ts"], e["ts"] + e["dur"]]]
        inside = [k for k in compute if k["ts"] < e["ts"] + e["dur"] and k["ts"] + k["dur"] > e["ts"]]
        names = sorted({k["name"][:40] for k in inside})[:4]
        print(f"  {(e['ts'] - t0) / 1e3:9.2f} {e['dur'] / 1e3:8.2f} {_overlap(span, c_busy) / 1e3:8.2f}  "
              f"{len(inside)} kernels: {', '.join(names)}")
