"""`strata bench spec`: decode tokens/s with and without speculative decoding, acceptance by draft position, the cost
of a verify window by its rows, and whether speculation pays on this model and device.

Speculation pays when the tokens a window yields (1 + a1 + a1 a2 + ..., a_j the acceptance at draft position j)
outgrow what the window costs against one decode step (the verify-window ratio printed here, plus the drafts).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from importlib import resources
from pathlib import Path

import torch

from strata.bench.ceilings import sync
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams
from strata.engine.spec import MAX_WINDOW, SpecDecoder, SpecStats
from strata.errors import StrataError


def _prompt(engine: Engine, args) -> list[int]:
    text = Path(args.text).read_text(encoding="utf-8") if args.text else \
        resources.files("strata").joinpath("data/tokenizer_corpus.txt").read_text(encoding="utf-8")
    ids = engine.tokenizer.encode(text)
    if len(ids) < args.prompt_tokens:
        raise StrataError(f"the text has {len(ids)} tokens, fewer than --prompt-tokens {args.prompt_tokens}")
    return ids[:args.prompt_tokens]


def _use(engine: Engine, window: int, args) -> None:
    engine.spec = SpecDecoder(engine, window, args.spec_min_p, args.suffix_draft) if window > 1 else None


def _decode(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], float]:
    """Greedy tokens and decode seconds per token (the first token, from the prompt pass, not counted)."""
    engine.cached_tokens = []  # the same work every run: the prompt from position 0
    tokens = engine.generate(prompt, SamplingParams(temperature=0), n, stop_ids=frozenset())
    out = [next(tokens)]
    sync(engine.device)
    start = time.perf_counter()
    out += list(tokens)
    sync(engine.device)
    return out, (time.perf_counter() - start) / max(len(out) - 1, 1)


def _window_ms(engine: Engine, prompt: list[int], rows: int, reps: int) -> float:
    """Milliseconds of one verify window of `rows` tokens through the trunk (keeping one row each time)."""
    _use(engine, MAX_WINDOW, argparse.Namespace(spec_min_p=0.0, suffix_draft=0))
    engine.cached_tokens = []
    engine.prefill(prompt)
    start_pos = len(prompt)
    times = []
    for rep in range(reps + 1):
        window = prompt[rep:rep + rows]
        sync(engine.device)
        start = time.perf_counter()
        engine.spec.verify(window, start_pos + rep)
        engine.spec.keep(start_pos + rep, 1)
        sync(engine.device)
        times.append(time.perf_counter() - start)
    return min(times[1:]) * 1e3


def _step_ms(engine: Engine, prompt: list[int], reps: int) -> float:
    """Milliseconds of one plain decode step (Engine.decode: the captured graphs when the engine has them)."""
    engine.spec = None
    engine.cached_tokens = []
    engine.prefill(prompt)
    times = []
    for rep in range(reps + 1):
        sync(engine.device)
        start = time.perf_counter()
        engine.decode(prompt[rep], len(prompt) + rep)
        sync(engine.device)
        times.append(time.perf_counter() - start)
    return min(times[1:]) * 1e3


def _phases(engine: Engine, prompt: list[int], n: int) -> tuple[Counter, float, int]:
    """One more run with the device synced between a window's parts: (seconds by part, decode seconds, windows)."""
    spec = engine.spec
    spec.phase_seconds, spec.stats = Counter(), SpecStats(spec.window)
    try:
        _, per_token = _decode(engine, prompt, n)
    finally:
        parts, spec.phase_seconds = spec.phase_seconds, None
    return parts, per_token * (n - 1), spec.stats.windows


def _print_phases(phases: dict, step_ms: float, engine: Engine) -> None:
    mtp = engine.spec.mtp_steps if engine.spec is not None else None
    drafting = "no MTP block" if not engine.spec.has_mtp else "MTP step by step (eager)" if mtp is None else \
        "MTP through captured graphs" if mtp.capture else "MTP through the static step, uncaptured"
    print(f"\nwhere a window's time goes (ms per window, device synced between parts; drafts: {drafting}):")
    print("| --spec | draft | verify | accept + keep | rest (host loop) | window | in decode steps |")
    print("|---|---|---|---|---|---|---|")
    for window, (parts, seconds, n_windows) in phases.items():
        n = max(n_windows, 1)
        ms = {part: parts[part] * 1e3 / n for part in ("draft", "verify", "accept + keep")}
        total = seconds * 1e3 / n
        rest = total - sum(ms.values())
        print(f"| {window} | {ms['draft']:.2f} | {ms['verify']:.2f} | {ms['accept + keep']:.2f} | {rest:.2f} | "
              f"{total:.2f} | {total / step_ms:.2f}x |")


def _windows_kind(engine: Engine) -> str:
    windows = engine.spec.windows if engine.spec is not None else None
    if windows is None:
        return "an eager forward per window"
    return "captured CUDA graphs" if windows.capture else "the static decode step, uncaptured"


def bench_spec(args, placement: dict) -> None:
    windows = sorted({int(w) for w in args.windows.split(",")} | {1})
    if not all(1 <= w <= MAX_WINDOW for w in windows):
        raise StrataError(f"--windows: each must be 1..{MAX_WINDOW}, got {args.windows}")
    n_ctx = args.ctx or args.prompt_tokens + args.gen_tokens + MAX_WINDOW + 8
    engine = Engine(args.model, EngineConfig(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype,
                                             prefill_chunk=args.prefill, n_ctx=n_ctx, **placement))
    prompt = _prompt(engine, args)
    has_mtp = bool(getattr(engine.model, "mtp", None))
    name = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "CPU"
    print(f"model     {engine.file.path.name} ({engine.model.config.arch}), device {name}, dtype {engine.dtype}; "
          f"drafts: {'MTP block' if has_mtp else 'prompt lookup (no MTP block)'}"
          f"{f' + {args.suffix_draft} prompt lookup' if has_mtp and args.suffix_draft else ''}, "
          f"spec-min-p {args.spec_min_p}")
    print(f"prompt    {len(prompt)} tokens, {args.gen_tokens} greedy tokens per run, best of {args.reps}")
    step_ms = _step_ms(engine, prompt, args.reps * 4)
    window_ms = {rows: _window_ms(engine, prompt, rows, args.reps * 4) for rows in range(1, max(windows) + 1)}
    plain = "captured CUDA graphs" if engine.decoder is not None and engine.decoder.capture else \
        "the static step, uncaptured" if engine.decoder is not None else "an eager forward"
    print(f"decode step {step_ms:.2f} ms ({plain}); verify windows through {_windows_kind(engine)}")
    print("verify window: " + ", ".join(f"{r} rows {ms:.2f} ms ({ms / step_ms:.2f}x a decode step)"
                                        for r, ms in window_ms.items()))
    results, baseline, phases = {}, None, {}
    for window in windows:
        _use(engine, window, args)
        # Warm-up: the very run timed after, so every row count and span it meets is captured (graphs live in the
        # SpecDecoder's windows, kept for the timed runs); then fresh counters.
        _decode(engine, prompt, args.gen_tokens)
        if engine.spec is not None:
            engine.spec.stats = SpecStats(window)
        runs = [_decode(engine, prompt, args.gen_tokens) for _ in range(args.reps)]
        tokens, seconds = runs[0][0], min(s for _, s in runs)
        baseline = baseline or (tokens, seconds)
        results[window] = (tokens, seconds, engine.spec.stats if engine.spec else None)
        if engine.spec is not None:
            phases[window] = _phases(engine, prompt, args.gen_tokens)  # on counters of its own
    print("\n| --spec | tok/s | vs --spec 1 | tokens/window | acceptance by draft position | greedy = plain |")
    print("|---|---|---|---|---|---|")
    best = 1
    for window, (tokens, seconds, stats) in results.items():
        speedup = baseline[1] / seconds
        if speedup > baseline[1] / results[best][1]:
            best = window
        acceptance = " ".join("-" if a != a else f"{a:.2f}" for a in stats.acceptance()) if stats else "-"
        per_window = f"{stats.tokens_per_window:.2f}" if stats else "1.00"
        same = "yes" if tokens == baseline[0] else "NO"
        print(f"| {window} | {1 / seconds:.1f} | {speedup:.2f}x | {per_window} | {acceptance} | {same} |")
    if phases:
        _print_phases(phases, step_ms, engine)
    if best == 1:
        print("\nspeculation does not pay here: keep --spec 1 (the default)")
    else:
        print(f"\nspeculation pays here: --spec {best} decodes {baseline[1] / results[best][1]:.2f}x as fast")

