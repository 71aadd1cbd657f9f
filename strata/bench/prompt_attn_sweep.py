"""`strata bench prompt-attn --sweep [CONFIG ...]`: the blocked prompt kernels (v2, v2t, imma) timed over a list of
tunable sets (queries and heads per program, chunk, warps, stages) at the parity tool's shapes, in one run.

Per shape: the merge of each block's selections (its time, and how much longer the merged list is than one
selection), then one line per variant and config: ms, fraction of the floor, speed against the variant's default
config, the parity bounds, whether its output bytes equal the default's (`=bytes`: it could become the default
without changing any output; `~bytes`: within the bounds only); before them `info probe` lines (prompt_probe.py: the
gathers alone, imma without its P.V) for the default and a few configs, which say where the time goes. At the end,
per variant, the configs ranked by the geometric mean of their speed-up over the default across the shapes (a config
failing its bounds or its compile anywhere is ranked out). With `--graph` each config is also timed replayed from a
CUDA graph, the kernels without the launches' host work (at ~0.3 ms a launch eager timing can be host-bound), and
that figure ranks them, the eager one beside.
"""

from __future__ import annotations

import math

import torch

from strata.bench.ceilings import Timer
from strata.bench.prompt_attn import fp32_yardstick, graph_ms, memory_line, shape_data, within_bounds

SWEEP = [  # around the defaults (v2 t1r128, imma t1p16r128: one query and its KV group a program, ids translated)
    # session 6 (`--sass` gives each one's registers and loop instructions without a GPU): x1 int8 codes to fp16
    # through their bits (full-rate adds, not the quarter-rate int-to-float unit; the same bytes), x2 V also converted
    # before it is staged for the dot (ldmatrix.trans, not a byte load per code); t2 cells resolved to KV head 0's pool
    # rows, int32 offsets (far fewer integer ops a row; the same bytes); d2 the fp16 P.V in two halves of the dims
    # (fewer registers; the same bytes); g1 imma's scores as a 2D dot per 64-dim group, warps over the cells (no
    # cross-warp sum of the groups); e1/e2 its K (and V) scales copied ahead by the pipeliner (one-hot dots); register
    # caps for 3-7 programs an SM. imma's own first, then v2's (imma runs those without d2 with its int8 P.V), n2 (q
    # in 16 bits) last. Session 7 (`imma2`) first: u1, p normalized by the pool's largest V scale (no cross-warp max
    # of each chunk's V scales, no accumulator rescale: 13 -> 8 barriers a chunk; --sass: 887 -> 750 loop
    # instructions with d2, 717 and no spill at two stages); a1, the next chunk's K and V scales loaded during this
    # one (no chunk waits on its scales' global loads); o1, V codes read as 16-bit words (ldmatrix) split into even
    # and odd dims by bitwise ops (64 byte loads a warp a chunk -> 32 ldmatrix; 850 -> 781 loop instructions); v1, p
    # made in the scores' layout (one layout change a chunk instead of two: 8 -> 5 barriers, 40 instructions more)
    # Session 8 (`imma3`): session 7's default first (at the long shapes the new default's bytes: `=bytes`), its
    # launch order (z1) and splits rule (y4, y8) alone, then prefix blocks (i1: consecutive queries whose selections
    # are prefixes of the block's last share its chunks; the rest one query a program after them, i2 beside them)
    # with 4 queries x 4 heads (16 real rows) or 8 x 2, and with the order and the splits rule
    "s2t2p16r128x1g1u1a1o1", "s2t2p16r128x1g1u1a1o1z1", "s2t2p16r128x1g1u1a1o1y4", "s2t2p16r128x1g1u1a1o1y8",
    "q4h4s2t2p16r128x1g1u1a1o1i1", "q4h4s2t2p16r128x1g1u1a1o1i2", "q4h4s2t2p16r128x1g1u1a1o1i2z1",
    "q4h4s2t2p16r128x1g1u1a1o1i1z1y4", "q4h4s2t2p16r128x1g1u1a1o1i2z1y8", "q8h2s2t2p16r128x1g1u1a1o1i2z1y4",
    "q4h4s2t2p16r136x1g1u1a1o1i2z1y4",
    "s2t2p16r128x1g1u1o1", "s2t2p16r128x1g1u1o1v1", "s2t2p16r168x1g1u1a1o1v1",
    "t2p16r128x1g1u1a1o1",
    "t2p16r128x1g1u1o1v1", "t2p16r128x1g1d2u1", "s2t2p16r168x1g1u1a1o1", "t2p16r128x1g1u1", "t2p16r128x1g1u1o1",
    "s2t2p16r128x1g1d2u1a1", "t2p16x1g1u1o1", "c64s2t2p16r128x1g1u1o1",
    "t2p16r128x1g1d2e1", "t2p16r128x1g1d2", "t2p16r128x1g1d2e2", "t2p16r128x1", "t2p16r128x1d2", "t2p16r128x1g1",
    "t2p16r168x1g1d2e2", "t2p16x1g1d2", "t2p16r96x1g1d2e1", "t2p16r64x1g1d2e1", "t2p16r128x2g1d2e1",
    "s4t2p16r128x1g1d2e1", "t1p16r128x1g1d2e1",
    "t2r128x1", "t2r128x1d2", "t2r128", "t2r168x1", "t2r128x2", "t2p16r128x1g1n2d2e1",
]
SWEPT = ["v2", "v2t", "imma"]


def _kernels():
    from strata.kernels.attention import prompt_imma, prompt_v2

    return {"v2": (prompt_v2.prompt_attn_v2, prompt_v2.DEFAULT), "v2t": (prompt_v2.prompt_attn_v2t, prompt_v2.DEFAULT),
            "imma": (prompt_imma.prompt_attn_imma, prompt_imma.DEFAULT)}


def _merge_lines(data, queries: list[int], timer: Timer, reps: int) -> None:
    """Per queries-per-program value: the merge's time (torch's sort; the Triton passes of STRATA_PA_MERGE_KERNEL, and
    whether they give the same cells) and how much longer a merged list is than one selection."""
    from strata.kernels.attention.prompt_blocks import shared_cells

    width = data.width.float().mean().item()
    for n in queries:
        cells, members, count = shared_cells(data.ids, data.width, n)
        ms = timer(lambda n=n: shared_cells(data.ids, data.width, n), reps)
        if not data.ids.is_cuda:  # the interpreter would take seconds; tests check the kernel's cells
            kernel = "kernel on the GPU only"
        else:
            kernel = _merge_kernel_line(data, n, (cells, members, count), timer, reps)
        print(f"  merge q{n:<3} torch {ms:.3f} ms, {kernel}; merged cells per block {count.float().mean().item():.1f} "
              f"({count.float().mean().item() / width:.2f}x one selection)")


def _prefix_lines(data, queries: list[int], timer: Timer, reps: int) -> None:
    """Per queries-per-program value of the prefix configs (`i1`, `i2`): how many blocks qualify (their queries
    share the last one's chunks; the rest run one query a program) and the flags' launch time."""
    from strata.kernels.attention.prompt_prefix import prefix_flags

    ids, width = data.ids.to(torch.int32).contiguous(), data.width.to(torch.int32).contiguous()
    for n in queries:
        flags = prefix_flags(ids, width, n)
        ms = timer(lambda n=n: prefix_flags(ids, width, n), reps)
        shared = int(flags.repeat_interleave(n)[: ids.shape[0]].sum())
        print(f"  prefix q{n:<3} {int(flags.sum())} of {flags.numel()} blocks qualify ({shared} of {ids.shape[0]} "
              f"queries); flags {ms:.3f} ms")


def _merge_kernel_line(data, n: int, want, timer: Timer, reps: int) -> str:
    from strata.kernels.attention.merge_cells import merge_cells_triton

    try:
        same = _same_merge(want, merge_cells_triton(data.ids, data.width, n))
        ms = timer(lambda: merge_cells_triton(data.ids, data.width, n), reps)
        return f"kernel {ms:.3f} ms ({'same cells' if same else 'DIFFERENT cells'})"
    except Exception as e:  # noqa: BLE001  (information only)
        return f"kernel failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"


def _same_merge(a, b) -> bool:
    """Equal counts, and equal cells and bits up to each block's count."""
    if not torch.equal(a[2], b[2]):
        return False
    used = torch.arange(a[0].shape[1], device=a[0].device)[None] < a[2][:, None]
    return torch.equal(a[0][used], b[0][used]) and torch.equal(a[1][used], b[1][used])


def run_sweep(args, device: torch.device, bandwidth: float, shapes: list[tuple[int, int]]) -> int:
    """Print the sweep; 0 if every variant's default config passes its bounds at every shape, else 1."""
    from strata.kernels.attention.prompt import VARIANTS
    from strata.kernels.attention.prompt_blocks import PromptConfig

    kernels = _kernels()
    variants = [n for n in args.variants if n in SWEPT]  # in the order asked (lines print as measured)
    configs = [PromptConfig.parse(text) for text in (args.sweep or SWEEP)]
    timer = Timer(device)
    speedups = {(n, c.label): [] for n in variants for c in configs}
    ok = True
    for ctx, n_q in shapes:
        data = shape_data(ctx, min(n_q, ctx), args, device, bandwidth)
        fp32, fp32_scale, err_fp32 = fp32_yardstick(data, VARIANTS["fp32"](*data.inputs()))
        _merge_lines(data, sorted({c.queries for c in configs if not c.prefix} - {1}), timer, args.reps)
        _prefix_lines(data, sorted({c.queries for c in configs if c.prefix} - {1}), timer, args.reps)
        _probe_lines(data, configs, variants, timer, args.reps, device)
        for name in variants:
            call, default = kernels[name]
            results, default_out = {}, None  # label: (ms, within bounds)
            for config in [default] + configs:
                if imma_only(config) and name != "imma" or not fits(name, config):
                    continue  # imma's own options, or a combination the variant refuses
                tag = "default " + config.label if config is default else config.label
                try:
                    out = call(*data.inputs(), config=config)
                    ms = eager = min(timer(lambda: call(*data.inputs(), config=config), args.reps)
                                     for _ in range(rounds(device)))
                    if args.graph:  # the kernels alone rank the configs; eager beside
                        graphed = graph_ms(lambda: call(*data.inputs(), config=config), args.reps, device)
                        ms = eager if math.isnan(graphed) else graphed
                except Exception as e:  # noqa: BLE001  (a config that does not compile is reported and ranked out)
                    print(f"  FAIL {name:<5} {tag:<22} {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    results[tag] = (math.nan, False)
                    continue
                err, vs_fp32 = data.errors(out, fp32)
                results[tag] = (ms, within_bounds(err, vs_fp32, err_fp32, data.ref_scale, fp32_scale))
                base = results["default " + default.label][0]
                default_out = out if config is default else default_out
                # a config giving the default's bytes can become the default without changing any output
                same = "" if config is default else ("  =bytes" if default_out is not None
                                                     and torch.equal(out, default_out) else "  ~bytes")
                print(f"  {'PASS' if results[tag][1] else 'FAIL'} {name:<5} {tag:<22} {ms:9.3f} ms  "
                      f"{data.floor_ms / ms:6.1%} of floor  {base / ms:5.2f}x default  "
                      + (f"eager {eager:7.3f} ms  " if args.graph else "")
                      + f"vs FP64 {err / data.ref_scale:.2e}  vs fp32 {vs_fp32 / fp32_scale:.2e}{same}"
                      f"{resources(device)}")
            passing = [(ms, label) for label, (ms, good) in results.items() if good]  # the default included
            base, ok_default = results.pop("default " + default.label)
            ok &= ok_default
            for label, (ms, good) in results.items():
                speedups[name, label].append(base / ms if good else math.nan)
            if passing:
                ms, label = min(passing)
                print(f"  best {name:<5} {label:<22} {ms:9.3f} ms  {data.floor_ms / ms:6.1%} of floor  "
                      f"{base / ms:5.2f}x default")
        memory_line(device)
    for name in variants:
        ranked = sorted(((_geomean(v), label) for (n, label), v in speedups.items() if n == name and v),
                        key=lambda x: -x[0] if not math.isnan(x[0]) else math.inf)
        print(f"{name} configs by speed-up over its default {kernels[name][1].label} (geometric mean over shapes): "
              + ", ".join(f"{label} {x:.2f}x" for x, label in ranked))
    print("defaults PASS" if ok else "some default FAIL")
    return 0 if ok else 1


def imma_only(config) -> bool:
    """Whether `config` uses one of imma's own options (v2 and v2t skip it)."""
    return bool(config.pv or config.scores or config.qparts or config.early or config.uniform or config.prefix)


def fits(name: str, config) -> bool:
    """Whether `name` takes `config`'s combination of options (imma: d2 needs p16, n2 needs g1)."""
    from strata.errors import StrataError
    from strata.kernels.attention.prompt_imma import check_config

    try:
        check_config(config) if name == "imma" else None
    except StrataError:
        return False
    return True


PROBED = ()  # the swept configs whose probes print too (imma's default always does)


def _probe_lines(data, configs, variants: list[str], timer: Timer, reps: int, device: torch.device) -> None:
    """Where the time goes (information, never results): the loads alone, and imma without its P.V, per config."""
    from strata.kernels.attention import prompt_imma
    from strata.kernels.attention.prompt_blocks import PromptConfig
    from strata.kernels.attention.prompt_probe import probe_config, probe_gather, probe_imma_scores

    wanted = {PromptConfig.parse(text).label for text in PROBED}
    for config in [prompt_imma.DEFAULT] + [c for c in configs if c.label in wanted and c != prompt_imma.DEFAULT]:
        config = probe_config(config)  # the form the probes run (a prefix config's one-query launch)
        probes = [("gathers only", probe_gather)] + [("imma without P.V", probe_imma_scores)] * ("imma" in variants)
        for what, probe in probes:
            try:
                probe(*data.inputs(), config=config)
                ms = min(timer(lambda: probe(*data.inputs(), config=config), reps) for _ in range(rounds(device)))
                print(f"  info probe {what:<17} {config.label:<22} {ms:9.3f} ms  {data.floor_ms / ms:6.1%} of floor"
                      f"{resources(device)}")
            except Exception as e:  # noqa: BLE001  (information only)
                print(f"  info probe {what:<17} {config.label:<22} failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:100] if str(e) else ''}")


def resources(device: torch.device) -> str:
    """`  168 regs, 0 spilled, 50 KB smem: 3/SM` for the last blocked launch (empty under the interpreter): the
    programs resident per SM by registers, shared memory and warps, whichever binds first."""
    from strata.kernels.attention.prompt_blocks import last_resources

    found = last_resources()
    if found is None or device.type != "cuda":
        return ""
    regs, spills, smem, warps = found
    props = torch.cuda.get_device_properties(device)
    sm = (getattr(props, "regs_per_multiprocessor", 65536), getattr(props, "shared_memory_per_multiprocessor", 233472),
          getattr(props, "max_threads_per_multi_processor", 2048))
    return f"  {regs} regs, {spills} spilled, {smem / 1024:.0f} KB smem: {programs_per_sm(regs, smem, warps, *sm)}/SM"


def programs_per_sm(regs: int, smem: int, warps: int, sm_regs: int = 65536, sm_smem: int = 233472,
                    sm_threads: int = 2048) -> int:
    """Programs resident per SM (H100/H200 limits by default): registers go to warps in 256s, each block reserves
    1 KB of shared memory; whichever of registers, shared memory and threads binds first."""
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    return min(sm_regs // (per_warp * warps), sm_smem // (smem + 1024), sm_threads // (32 * warps))


def rounds(device: torch.device) -> int:
    """Timings per config: the better of two on the GPU (clocks settle); one on the CPU, which only checks."""
    return 2 if device.type == "cuda" else 1


def _geomean(values: list[float]) -> float:
    if not values or any(math.isnan(v) for v in values):
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))
