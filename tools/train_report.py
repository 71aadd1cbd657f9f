"""After a training run of tools/train_small.py: check its GGUF with our engine, and ship it into the package.

    python tools/train_small.py check --run DIR [--device cuda]   # held-out perplexity vs transformers, samples
    python tools/train_small.py ship --run DIR                    # strata/data/default-model + pins + docs section
"""

from __future__ import annotations

import datetime
import json
import math
import subprocess
from pathlib import Path

from strata.default_model import (
    HELDOUT_EVAL,
    MANIFEST,
    PINNED_DEVICE,
    PINNED_TOKENS,
    SAMPLE_PROMPTS,
    SHIPPED_GGUF,
    heldout_nll,
    heldout_perplexity,
    read_windows,
    sha256_of,
)

from tools.train_small import GGUF_NAME


def check_command(args) -> None:
    """Our engine on a training run's GGUF: held-out perplexity beside transformers', and greedy samples."""
    import strata

    result = json.loads((args.run / "result.json").read_text())
    record = result["heldout_transformers"]
    llm = strata.LLM(args.run / GGUF_NAME, device=args.device, dtype="float32", kv_dtype="float32")
    nll = heldout_nll(llm, read_windows(args.run / "heldout_eval.bin", record["window_tokens"]))
    ours, theirs = math.exp(nll), record["perplexity"]
    n_tokens = args.sample_tokens or int(result["args"]["sample_tokens"])
    samples = {p: llm.generate(p, max_tokens=n_tokens, temperature=0).text for p in SAMPLE_PROMPTS}
    same = {p: samples[p] == result["samples_transformers"].get(p) for p in SAMPLE_PROMPTS}
    check = {"device": args.device, "heldout_perplexity_strata": ours, "heldout_perplexity_transformers": theirs,
             "relative_difference": ours / theirs - 1, "samples_strata": samples, "same_greedy_text": same}
    (args.run / f"check_{args.device}.json").write_text(json.dumps(check, indent=1))
    print(json.dumps(check, indent=1))
    verdict = "OK" if abs(ours / theirs - 1) <= 0.01 else "FAIL"
    print(f"{verdict}: held-out perplexity strata {ours:.3f} vs transformers {theirs:.3f} ({ours / theirs - 1:+.3%})")


def ship_command(args) -> None:
    """Copy a run's GGUF and held-out windows into the package (strata/data/default-model) with its manifest, pin
    our engine's greedy outputs for the tests and write the docs' section."""
    import strata

    result = json.loads((args.run / "result.json").read_text())
    args.dest.mkdir(parents=True, exist_ok=True)
    (args.dest / SHIPPED_GGUF).write_bytes((args.run / GGUF_NAME).read_bytes())
    (args.dest / HELDOUT_EVAL).write_bytes((args.run / "heldout_eval.bin").read_bytes())
    manifest = {
        "file": SHIPPED_GGUF,
        "sha256": sha256_of(args.dest / SHIPPED_GGUF),
        "bytes": (args.dest / SHIPPED_GGUF).stat().st_size,
        "heldout_eval_sha256": sha256_of(args.dest / HELDOUT_EVAL),
        **{k: result[k] for k in ("heldout_transformers", "heldout_transformers_all", "samples_transformers",
                                  "training", "args", "data_manifest")},
    }
    if manifest["sha256"] != result["gguf"]["sha256"]:
        raise SystemExit("the copied GGUF's sha256 differs from the one the training run recorded")
    (args.dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"shipped {args.dest / SHIPPED_GGUF} ({manifest['bytes']} bytes, sha256 {manifest['sha256'][:16]}...)")
    llm = strata.LLM(args.dest / SHIPPED_GGUF, device=PINNED_DEVICE, dtype="float32", kv_dtype="float32")
    pin_greedy(llm, args.pins, args.pin_tokens)
    if args.benchmarks:
        write_benchmarks(args.benchmarks, manifest, llm, args.dest)


BENCH_BEGIN, BENCH_END = "<!-- default-model: written by tools/train_small.py ship -->", "<!-- /default-model -->"


def write_benchmarks(path: Path, manifest: dict, llm, folder: Path) -> None:
    """The default model's section of docs/BENCHMARKS.md: held-out perplexity and greedy samples, ours (CPU,
    float32, the shipped Q8_0 file) beside transformers' (the float32 training checkpoint)."""
    ours, theirs = heldout_perplexity(llm, folder)
    n_tokens = int(manifest["args"]["sample_tokens"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    training, record = manifest["training"], manifest["heldout_transformers"]
    whole = manifest["heldout_transformers_all"]
    lines = [
        BENCH_BEGIN,
        "## The default model (issue 9): held-out perplexity and greedy samples",
        "",
        f"`strata/data/default-model/{manifest['file']}` ({manifest['bytes'] / 2**20:.1f} MiB, Q8_0), trained by "
        f"`tools/device/train_small.sh` on {training['device']}: {training['steps']} steps, "
        f"{training['tokens'] / 1e6:.1f} M tokens in {training['seconds']:.0f} s (best held-out loss at step "
        f"{training['best_step']}). Held-out text: documents the model never trained on (every 40th of the corpus).",
        "",
        "| date | commit | measured by | held-out windows | perplexity |",
        "|---|---|---|---:|---:|",
        f"| {datetime.date.today()} | {commit} | transformers, float32 training checkpoint | "
        f"{record['windows']} x {record['window_tokens']} | {theirs:.3f} |",
        f"| {datetime.date.today()} | {commit} | Strata, CPU float32, the shipped Q8_0 GGUF | "
        f"{record['windows']} x {record['window_tokens']} | {ours:.3f} ({ours / theirs - 1:+.2%}) |",
        f"| {datetime.date.today()} | {commit} | transformers, all held-out text | "
        f"{whole['windows']} x {whole['window_tokens']} | {whole['perplexity']:.3f} |",
        "",
        f"Greedy continuations, {n_tokens} tokens:",
        "",
    ]
    for prompt, theirs_text in manifest["samples_transformers"].items():
        ours_text = llm.generate(prompt, max_tokens=n_tokens, temperature=0).text
        lines += [f"- `{prompt}` | transformers: {json.dumps(theirs_text, ensure_ascii=False)}",
                  f"  | Strata{' (the same)' if ours_text == theirs_text else ''}: "
                  f"{json.dumps(ours_text, ensure_ascii=False)}"]
    lines.append(BENCH_END)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BENCH_BEGIN in text:
        head, rest = text.split(BENCH_BEGIN, 1)
        text = head + "\n".join(lines) + rest.split(BENCH_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
    path.write_text(text)
    print(f"wrote the default model's section of {path}")


def pin_greedy(llm, pins: Path, n_tokens: int = PINNED_TOKENS) -> None:
    """Our engine's greedy continuations of SAMPLE_PROMPTS on the CPU in float32: the outputs the tests pin."""
    pinned = {p: llm.generate(p, max_tokens=n_tokens, temperature=0).text for p in SAMPLE_PROMPTS}
    pins.write_text(json.dumps(pinned, indent=1, ensure_ascii=False) + "\n")
    print(f"pinned greedy outputs in {pins}:\n" + json.dumps(pinned, indent=1, ensure_ascii=False))
