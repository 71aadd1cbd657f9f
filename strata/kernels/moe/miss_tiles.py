"""Launch tiles of the misses' GEMVs that read pinned host RAM in place (zero-copy, `--misses direct`).

The hits' tiles (`gemv.MEASURED_TILES`) are tuned for HBM. A miss's loads cross PCIe instead: ~1-2 us of latency
where HBM has ~0.6, and a link whose payload rate falls with small read requests. MISS_TILES holds the tiles
`bench miss-bw --sweep` measured for the misses, per (kernel, format); a format absent there reads its misses on the
hits' tile (then the misses' bytes are exactly those before this table existed).

Reasoned default, until measured: none (the hits' tiles). The one-shot tiles already issue every load of a program
at once: a missed qwen4exp expert's gate/up is 160 programs of ~5.8 KB each, ~0.9 MB in flight, about 8x the link's
bandwidth-delay product (55 GB/s x ~2 us); more programs or split-K add requests, not bytes in flight. What a tile
cannot change is each warp's request: 2-byte words over 4 blocks of a row, ~64-72 bytes, where the copy path
(`miss_copy.py`) asks for 512 aligned bytes. The sweep times the alternatives anyway (fewer rows, more warps,
split-K, the word and streamed kernels): a line that beats the default at both shapes goes here, as printed.
Other tiles may sum a row in another order (split, warps): within gemv.ERROR_BOUND of float64, other bytes.
"""

from __future__ import annotations

from dataclasses import replace

from strata.kernels.moe.decode import DecodeSpec
from strata.kernels.moe.gemv import GemvConfig, gemv_config, oneshot_config
from strata.kernels.moe.oneshot_gemv import ONESHOT_FORMATS
from strata.kernels.moe.stream_gemv import FIT, STREAM_FORMATS
from strata.kernels.moe.wide_gemv import UNIT, WORDS, word_tile

MISS_TILES: dict[tuple[str, str], dict] = {}  # (kind, format) -> GemvConfig fields, from a `--sweep` line


def miss_config(kind: str, spec: DecodeSpec, n_out: int, n_in: int, top_k: int) -> GemvConfig | None:
    """The misses' GPU tile of "gate_up" or "down", or None: the hits' (`gemv.gemv_config`)."""
    entry = MISS_TILES.get((kind, spec.name))
    if entry is None:
        return None
    if entry.get("oneshot"):
        return replace(oneshot_config(kind, spec, n_out, n_in, top_k, True), **entry)
    return replace(gemv_config(kind, spec, n_out, n_in, top_k, True), oneshot=False, **entry)


def miss_configs(host, top_k: int) -> tuple[GemvConfig | None, GemvConfig | None]:
    """(gate_up, down) tiles for host experts (gemv.DecodeExperts) read in place."""
    g, d = host.gate, host.down
    return (miss_config("gate_up", g.spec, g.rows, g.cols, top_k), miss_config("down", d.spec, d.rows, d.cols, top_k))


def miss_sweep_configs(kind: str, spec: DecodeSpec, n_out: int, n_in: int, top_k: int) -> list[GemvConfig]:
    """The misses' current tile first, then PCIe-minded variants: the one-shot kernel with 1-8 rows a program at
    2-16 warps and split-K 2, 4, 8 (more programs, more requests in flight), the word kernels' tile with split-K
    1-8 and half the rows, the streamed kernels with as many programs as stay resident."""
    from strata.bench.gemv_sweep import oneshot_configs

    current = miss_config(kind, spec, n_out, n_in, top_k) or gemv_config(kind, spec, n_out, n_in, top_k, True)
    configs = [current]
    if not current.wide:
        return configs
    n_units = n_in // UNIT[spec.name] * (top_k if kind == "down" else 1)
    bn, nu, warps, _ = word_tile(spec, n_out, n_units, True, top_k if kind == "gate_up" else 1)
    words = GemvConfig(bn, nu, warps, 1, True, 1)
    if spec.name in ONESHOT_FORMATS:
        base = oneshot_config(kind, spec, n_out, n_in, top_k, True)
        configs += oneshot_configs(kind, spec, n_out, n_in, top_k)
        configs += [replace(base, split=s) for s in (4, 8)]
        configs += [replace(base, bn=max(1, base.bn // 2), warps=min(16, base.warps * 2)),
                    replace(base, bn=1, warps=max(1, base.warps // 2), split=4)]
    configs += [replace(words, split=s) for s in (1, 2, 4, 8)] + [replace(words, bn=max(1, bn // 2), split=4)]
    if spec.name in STREAM_FORMATS:
        configs.append(replace(words, stream=FIT))
    return list(dict.fromkeys(configs))


def tile_entry(cfg: GemvConfig) -> str:
    """A sweep line's config as a MISS_TILES entry (the fields that differ from GemvConfig's defaults)."""
    fields = dict(bn=cfg.bn, warps=cfg.warps, split=cfg.split)
    if cfg.oneshot:
        fields["oneshot"] = True
    else:
        fields["ns"] = cfg.ns
        if cfg.stream:
            fields["stream"] = cfg.stream
    return "dict(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"
