"""The copy stream against the compute stream in one profiled prompt (profile_prompt.py --timeline): from torch
profiler's trace, each stream's kernels as intervals; how much of the streamed experts' gather time runs while the
compute stream is busy (overlap), how long the link sits idle between gathers while the prompt runs, and the
gathers one by one (start, length, what the compute stream did meanwhile).
"""

import collections
import json
import tempfile

GATHER = "_gather_kernel"  # kernels/moe/expert_gather.py: the streamed experts' copy


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
    trace = trace_of(prof)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e
              and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not events:
        print("timeline: no device events in the trace")
        return
    # The compute stream is the one with the most kernels; the copy streams are the other ones gathers or transfers
    # run on (STRATA_PF_STREAM=dma: memcpys only; the refill at a prompt's end gathers on the compute stream, which
    # has small memcpys of its own too).
    per_stream = collections.Counter(e["args"].get("stream") for e in events
                                     if GATHER not in e["name"] and e.get("cat") == "kernel")
    main = per_stream.most_common(1)[0][0]
    copy_streams = {e["args"].get("stream") for e in events
                    if GATHER in e["name"] or e.get("cat") == "gpu_memcpy"} - {main}
    launched = {e["args"].get("correlation"): e["ts"] for e in trace["traceEvents"]
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    copies = [e for e in events if e["args"].get("stream") in copy_streams]
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
    print(f"  the first {show} large copies (ms): start, launched by the host that long before, length, compute "
          f"busy during it; the compute kernels running at its start, and the last one before it")
    for e in [c for c in sorted(copies, key=lambda e: e["ts"]) if c["dur"] > 1000][:show]:  # gathers (dma: none)
        span = [[e["ts"], e["ts"] + e["dur"]]]
        at_start = [k["name"][:30] for k in compute if k["ts"] <= e["ts"] < k["ts"] + k["dur"]]
        before = [k for k in compute if k["ts"] + k["dur"] <= e["ts"]]
        last = max(before, key=lambda k: k["ts"] + k["dur"])["name"][:30] if before else "-"
        host = launched.get(e["args"].get("correlation"))
        lag = f"{(e['ts'] - host) / 1e3:7.2f}" if host is not None else "      ?"
        print(f"  {(e['ts'] - t0) / 1e3:9.2f} {lag} {e['dur'] / 1e3:7.2f} {_overlap(span, c_busy) / 1e3:7.2f}  "
              f"at start: {', '.join(at_start) or 'idle'}; before: {last}")
        # What the copy stream ran just before (the pairs' upload, waits) and any host-to-device transfer in flight.
        ahead = [c for c in copies if e["ts"] - 30000 < c["ts"] < e["ts"]][-3:]
        for c in ahead:
            host_c = launched.get(c["args"].get("correlation"))
            print(f"      before it on the copy stream: {c['name'][:30]} at {(c['ts'] - e['ts']) / 1e3:+.2f} ms, "
                  f"{c['dur'] / 1e3:.3f} ms, {c['args'].get('bytes', '-')} bytes, host launch "
                  f"{(c['ts'] - host_c) / 1e3 if host_c is not None else float('nan'):.2f} ms before its start")
        dma = [m for m in events if m.get("cat") == "gpu_memcpy" and m["args"].get("stream") not in copy_streams
               and m["ts"] < e["ts"] and m["ts"] + m["dur"] > e["ts"] - 10000]
        for m in dma[-3:]:
            print(f"      compute-stream transfer: {m['name'][:30]} at {(m['ts'] - e['ts']) / 1e3:+.2f} ms, "
                  f"{m['dur'] / 1e3:.3f} ms, {m['args'].get('bytes', '-')} bytes")
    transfers = sorted((c for c in copies if c.get("cat") == "gpu_memcpy"), key=lambda c: c["ts"])
    if len(transfers) > 2 * show:  # STRATA_PF_STREAM=dma: a layer's batch is many copies back to back
        batches = [[transfers[0]]]
        for c in transfers[1:]:
            prev = batches[-1][-1]
            (batches[-1].append(c) if c["ts"] - (prev["ts"] + prev["dur"]) < 200 else batches.append([c]))
        print(f"  copy-engine batches (transfers < 0.2 ms apart): {len(batches)}; the first {show}: start ms, length "
              f"ms, copies, MB, GB/s, compute busy during it (ms)")
        for b in batches[:show]:
            lo, hi = b[0]["ts"], max(c["ts"] + c["dur"] for c in b)
            n_bytes = sum(int(c["args"].get("bytes", 0) or 0) for c in b)
            print(f"  {(lo - t0) / 1e3:9.2f} {(hi - lo) / 1e3:7.2f} {len(b):5d} {n_bytes / 1e6:8.1f} "
                  f"{n_bytes / max(hi - lo, 1) / 1e3:6.1f} {_overlap([[lo, hi]], c_busy) / 1e3:7.2f}")


def trace_of(prof) -> dict:
    """The profiler's chrome trace as a dict (a profile exports once)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return json.load(open(f.name))


def _events(trace: dict) -> tuple[list, list]:
    """(device events: kernels, copies and memsets; host runtime/driver calls), each sorted by start."""
    spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    device = sorted((e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    host = sorted((e for e in spans if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    return device, host


def dump(trace: dict, start_frac: float = 0.4, span_ms: float = 45.0, host_min_us: float = 50.0) -> None:
    """Every device event and every host runtime call of `host_min_us` or more (waits, syncs; and each gather's
    launch) in a window of a run's trace (`trace_of`), in time order: which stream ran what while the host waited."""
    device, host = _events(trace)
    if not device:
        print("dump: no device events")
        return
    t0 = min(e["ts"] for e in device)
    t1 = max(e["ts"] + e["dur"] for e in device)
    lo = t0 + start_frac * (t1 - t0)
    hi = lo + span_ms * 1e3
    launches = {e["args"].get("correlation"): e for e in host}
    gather_launches = {launches[e["args"]["correlation"]]["ts"] for e in device
                       if GATHER in e["name"] and e["args"].get("correlation") in launches}
    rows = []
    for e in device:
        if lo <= e["ts"] <= hi:
            rows.append((e["ts"], f"dev s{e['args'].get('stream')}", e["name"][:60], e["dur"]))
    for e in host:
        if lo <= e["ts"] <= hi and (e["dur"] >= host_min_us or e["ts"] in gather_launches):
            tag = " (gather launch)" if e["ts"] in gather_launches else ""
            rows.append((e["ts"], "host", e["name"][:60] + tag, e["dur"]))
    print(f"\ndump: {len(rows)} events from {(lo - t0) / 1e3:.1f} ms for {span_ms:.0f} ms (time ms, where, what, "
          f"length ms); the host's calls of {host_min_us:.0f} us or more")
    last_dev = {}
    for ts, where, name, dur in sorted(rows):
        stream = where
        gap = ""
        if where.startswith("dev") and stream in last_dev:
            idle = (ts - last_dev[stream]) / 1e3
            gap = f"  [+{idle:.2f} idle]" if idle > 0.05 else ""
        if where.startswith("dev"):
            last_dev[stream] = max(last_dev.get(stream, 0), ts + dur)
        print(f"  {(ts - t0) / 1e3:9.3f} {where:8s} {dur / 1e3:7.3f} {name}{gap}")


def waits(trace: dict, idle_ms: float = 0.5, show: int = 4, calls: int = 14) -> None:
    """The `show` longest stretches (of `idle_ms` or more) the compute stream sat idle, each with the host's runtime
    calls just before the launch of the kernel that ended it (every one, however short: stream waits, event records,
    uploads, allocations): what the stream waited on. Then every allocation, free, sync or stream wait of the run,
    counted by name."""
    device, host = _events(trace)
    if not device:
        return
    t0 = device[0]["ts"]
    per_stream = collections.Counter(e["args"].get("stream") for e in device if e.get("cat") == "kernel")
    main = per_stream.most_common(1)[0][0]
    launch = {e["args"].get("correlation"): e for e in host}
    gaps, end = [], None
    for e in (d for d in device if d["args"].get("stream") == main):
        if end is not None and (e["ts"] - end) / 1e3 >= idle_ms:
            gaps.append(((e["ts"] - end) / 1e3, e))
        end = max(end or 0, e["ts"] + e["dur"])
    print(f"\ncompute stream idle {idle_ms} ms or more: {len(gaps)} times, {sum(g for g, _ in gaps):.1f} ms in all; "
          f"the {show} longest:")
    for idle, e in sorted(gaps, key=lambda g: -g[0])[:show]:
        at = launch.get(e["args"].get("correlation"))
        print(f"\nwait: {idle:.2f} ms idle before {e['name'][:50]} at {(e['ts'] - t0) / 1e3:.2f} ms; launched at "
              f"{(at['ts'] - t0) / 1e3 if at else float('nan'):.2f} ms; the host's calls before that launch:")
        for h in ([h for h in host if h["ts"] <= at["ts"]][-calls:] if at is not None else []):
            print(f"    {(h['ts'] - t0) / 1e3:9.3f} {h['dur'] / 1e3:7.3f} {h['name'][:60]}")
    watch = ("Malloc", "Free", "HostAlloc", "Synchronize", "WaitEvent", "Query", "HostRegister")
    counted, spent = collections.Counter(), collections.Counter()
    for h in host:
        if any(w in h["name"] for w in watch):
            counted[h["name"]] += 1
            spent[h["name"]] += h["dur"] / 1e3
    print("\nhost calls of the run that allocate, free, sync or wait (count, host ms):")
    for name, n in counted.most_common():
        print(f"    {n:6d} {spent[name]:9.2f}  {name}")
