"""The launch configurations `bench moe-decode --sweep` and `bench matvec --sweep` time beside the default.

One device run then shows which tile wins on the GPU at hand: each line is a config's time, GB/s, % of the HBM floor
and its ratio to the default's time (first line). Variants move one tunable at a time from the default (rows per
program BN, units per step NU with the warps that hold them, warps alone, the split over the input), plus a few
pairs that trade one for another (twice the rows with twice the split keeps the program count), the streamed word
kernels (`stream_gemv.py`, Q2_0 / Q4_0 / Q8_0 / Q4_K: on the default tile, persistent programs per SM as many as
stay resident ("fit"), 1, those filling 32 and 64 warps an SM, and 64 = a program per tile; then the tile's variants
and warp-local tiles, as many as fit), the one-shot kernels (`oneshot_gemv.py`, the same formats: their reasoned
tile, then rows and warps that give 32 or 64 code words a thread, then the input in 2 and 3 slices), and last the byte
kernel. `family="stream"` keeps only the default and the streamed lines (a short device run), "oneshot" only the
default and the one-shot lines, "words" all but the streamed and one-shot ones (the sweep before them).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from strata.kernels.moe.decode import DecodeSpec
from strata.kernels.moe.gemv import GemvConfig, byte_config, gemv_config, oneshot_config
from strata.kernels.moe.oneshot_gemv import ONESHOT_FORMATS, slice_units
from strata.kernels.moe.stream_gemv import FIT, STREAM_FORMATS
from strata.kernels.moe.wide_gemv import UNIT, WORDS

MAX_WARPS = 16
FAMILIES = ("all", "words", "stream", "oneshot")
ONESHOT_WORDS = (32, 64)  # code words a thread of the one-shot variants holds (64: ~12 % fewer instructions a
# weight in sm_90 builds, ~127 registers, half the warps)
RESIDENT_WARPS = (32, 64)  # warps an SM the streamed grids aim at (sm_90 holds 64, registers permitting)
ONE_TILE_EACH = 64  # programs an SM beyond any residency: the grid is capped at the tiles, a program per tile


def stream_per_sm(warps: int) -> list[int]:
    """The persistent programs an SM to time for programs of `warps` warps: as many as stay resident (FIT, from the
    compiled kernel's registers), 1, those giving RESIDENT_WARPS, and ONE_TILE_EACH."""
    return list(dict.fromkeys([FIT, 1, *(max(1, w // warps) for w in RESIDENT_WARPS), ONE_TILE_EACH]))


def stream_configs(base: GemvConfig, words: int) -> list[GemvConfig]:
    """The streamed kernels on base's tile (base without its split) at each `stream_per_sm`, then base's tile moved
    one tunable at a time, and warp-local tiles (a warp's lanes on the units x `words` words of one step, warps and
    each thread's rows on the rows: the sums end in shuffles, not shared memory and barriers), all with as many
    programs as stay resident. Tiles sharing a build come first (a short device run still gets the per-SM lines)."""
    tile = replace(base, split=1)
    half, double = max(1, base.warps // 2), min(MAX_WARPS, base.warps * 2)
    warp_units = max(1, 32 // words)
    moved = [replace(tile, warps=half), replace(tile, warps=double), replace(tile, bn=base.bn * 2),
             replace(tile, bn=max(1, base.bn // 2)), replace(tile, ns=base.ns * 2),
             replace(tile, ns=max(1, base.ns // 2), warps=half)]
    moved += [replace(tile, ns=warp_units, warps=w, bn=rows * w) for w, rows in ((4, 4), (8, 2), (8, 4))]
    return [replace(tile, stream=n) for n in stream_per_sm(base.warps)] + [
        replace(c, stream=FIT) for c in moved]


def oneshot_configs(kind: str, spec: DecodeSpec, n_out: int, n_in: int, top_k: int) -> list[GemvConfig]:
    """The one-shot kernels' reasoned tile, then rows 1-16 at the warps (1-16) that give each thread ONESHOT_WORDS
    code words (the reasoned rows also at 16 words), then the reasoned tile's input in 2 and 3 slices."""
    base = oneshot_config(kind, spec, n_out, n_in, top_k, True)
    units = n_in // UNIT[spec.name] * (top_k if kind == "down" else 1)
    words_per_warp = (2 if kind == "gate_up" else 1) * slice_units(units, 1)[1] * WORDS[spec.name] / 32
    tiles = [base]
    for bn in (1, 2, 4, 8, 16):
        for words in ONESHOT_WORDS + ((16,) if bn == base.bn else ()):
            warps = int(words_per_warp * bn / words)
            if 1 <= warps <= 16 and warps & (warps - 1) == 0 and warps * words == words_per_warp * bn:
                tiles.append(replace(base, bn=bn, warps=warps, split=1))
    tiles += [replace(base, split=s) for s in (2, 3) if s != base.split]
    return list(dict.fromkeys(tiles))


def sweep_configs(kind: str, spec: DecodeSpec, n_out: int, n_in: int, top_k: int, family: str = "all"
                  ) -> list[GemvConfig]:
    """The default GPU config of `kind` ("gate_up", "down", "matvec") first, then distinct variants (of `family`)."""
    base = gemv_config(kind, spec, n_out, n_in, top_k, True)
    variants = [base]
    streamed = base.wide and spec.name in STREAM_FORMATS and family != "words"
    streams = stream_configs(base, WORDS[spec.name]) if streamed else []
    oneshots = (oneshot_configs(kind, spec, n_out, n_in, top_k) if base.wide and spec.name in ONESHOT_FORMATS
                and family in ("all", "oneshot") else [])
    if family == "stream":
        return list(dict.fromkeys(variants + streams))
    if family == "oneshot":
        return list(dict.fromkeys(variants + oneshots))
    if base.wide:
        half, double = max(1, base.warps // 2), min(MAX_WARPS, base.warps * 2)
        variants += [
            replace(base, warps=half), replace(base, warps=double),
            replace(base, bn=base.bn * 2), replace(base, bn=max(1, base.bn // 2)),
            replace(base, ns=max(1, base.ns // 2), warps=half), replace(base, ns=base.ns * 2, warps=double),
            replace(base, split=1), replace(base, split=2), replace(base, split=4),
            replace(base, bn=base.bn * 2, split=base.split * 2), replace(base, bn=max(1, base.bn // 2), split=1),
            replace(base, ns=max(1, base.ns // 2), warps=half, split=base.split * 2),
        ]
    else:
        variants += [replace(base, warps=max(1, base.warps // 2)), replace(base, warps=min(MAX_WARPS, base.warps * 2)),
                     replace(base, bn=base.bn * 2), replace(base, bn=max(1, base.bn // 2)),
                     replace(base, ns=max(1, base.ns // 2))]
    variants += streams + oneshots
    variants.append(byte_config(kind, spec, n_out, n_in, top_k, True))  # the byte kernel the word ones replaced
    return list(dict.fromkeys(variants))


def describe(cfg: GemvConfig) -> str:
    units = "nu" if cfg.wide else "ns"
    kernel = ("oneshot" if cfg.oneshot else "stream" if cfg.stream else "words") if cfg.wide else "bytes"
    schedule = f"per_sm={'fit' if cfg.stream == FIT else cfg.stream}" if cfg.stream else f"split={cfg.split}"
    if cfg.oneshot:  # no step: a program's slice is all its units
        return f"{kernel} bn={cfg.bn:<3} warps={cfg.warps:<2} {schedule}"
    return f"{kernel} bn={cfg.bn:<3} {units}={cfg.ns:<3} warps={cfg.warps:<2} {schedule}" + (
        "" if cfg.wide else f" kc={cfg.kc}")


def sweep_line(label: str, cfg: GemvConfig, us: float, n_bytes: float, floor_bw: float, default_us: float) -> str:
    """One timed config: microseconds, GB/s, % of the floor (n_bytes / floor_bw) and the default's time over it."""
    floor_us = n_bytes / floor_bw * 1e6
    return (f"  sweep {label:<24} {describe(cfg):<44} {us:8.2f} us {n_bytes / us / 1e3:6.0f} GB/s "
            f"{floor_us / us:6.1%} of floor  {default_us / us:5.2f}x default")


def time_config(label: str, cfg: GemvConfig, fn, args: list, want, n_bytes: float, floor_bw: float,
                default_us: float | None, device, out, outputs: dict | None = None) -> tuple[bool, float | None]:
    """Time `fn` over `args` (a CUDA graph of the calls) and print its sweep line with its error against `want`
    (from fn(*args[0])): (within ERROR_BOUND, the default's time: this one's when it is the first). `outputs`
    (a dict the caller keeps over a sweep): the line also says whether fn(*args[0]) equals the first config's bit
    for bit ("same bytes": a new default that changes no output). A config that does not build is a line, not the
    end of the sweep."""
    from strata.bench.ceilings import graph_us
    from strata.kernels.moe import stream_gemv
    from strata.kernels.moe.gemv import ERROR_BOUND, relative_error

    try:
        got = fn(*args[0])
        err = relative_error(got, want)
        us = graph_us(fn, args, device)
    except Exception as e:
        print(f"  sweep {label} {describe(cfg)}: {type(e).__name__}: {str(e)[:200]}", file=out, flush=True)
        return True, default_us
    default_us = default_us or us
    same = ""
    if outputs is not None:
        first = outputs.setdefault(label, got.clone())
        same = "  same bytes" if torch.equal(got, first) else "  other bytes"
    fitted = f"  (fit: {stream_gemv.last_fit[0]} an SM)" if cfg.stream == FIT else ""
    print(sweep_line(label, cfg, us, n_bytes, floor_bw, default_us)
          + f" {err:9.2e}{'' if err <= ERROR_BOUND else '  FAIL'}{same}{fitted}", file=out, flush=True)
    return err <= ERROR_BOUND, default_us
