"""Teacher-forced quality: two engine configurations read the same text; their predictions are compared position by
position.

The first P tokens go through the prompt path; the next N are scored, the first from the prompt path's last logits
and the rest through the decode path, one token at a time, with the text's own tokens fed in (teacher forcing); with
`spec` > 1 (an engine option) the decode path reads them a verify window of `spec` tokens at a time.
Each configuration runs in its own process with its own environment (A, B, then A again for the noise floor) and
writes STRATA_LOGPOS records; this process compares them (`strata.eval.metrics`).

A configuration is a string of `NAME=VALUE` words: upper-case names are environment variables (`STRATA_PF_FUSED=1`),
lower-case names are engine options (`kv_dtype=bfloat16`, see EngineConfig), so a change that is an option rather
than a switch can be measured the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from strata import switches
from strata.errors import StrataError

_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_OPTION_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class Arm:
    env: dict[str, str]
    options: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Arm:
        from strata.engine.engine import EngineConfig

        env, options = {}, {}
        for word in shlex.split(text or ""):
            name, eq, value = word.partition("=")
            if not eq:
                raise StrataError(f"configuration word {word!r} is not NAME=VALUE")
            if _ENV_NAME.fullmatch(name):
                if name.startswith("STRATA_"):
                    switches.check(name, value)
                env[name] = value
            elif _OPTION_NAME.fullmatch(name) and name in EngineConfig.__dataclass_fields__:
                options[name] = value
            else:
                raise StrataError(f"configuration word {word!r}: {name} is neither an environment variable (upper "
                                  "case) nor an engine option")
        return cls(env, options)


def _engine_options(pairs: dict[str, str]) -> dict:
    from strata.engine.engine import EngineConfig

    options = {}
    for name, value in pairs.items():
        kind = str(EngineConfig.__dataclass_fields__[name].type)
        if isinstance(value, str) and "bool" in kind:
            value = value.lower() in ("1", "true", "yes", "on")
        elif isinstance(value, str) and "int" in kind and value.lstrip("-").isdigit():
            value = int(value)
        elif isinstance(value, str) and "float" in kind:
            try:
                value = float(value)
            except ValueError:
                raise StrataError(f"engine option {name}={value!r} is not a number") from None
        options[name] = value
    return options


def run_worker(model: str, text_file: str, prefix: int, n: int, greedy: int, out: str, options: dict) -> None:
    """One configuration's pass (in its own process): logpos records for N positions, then `greedy` tokens."""
    from strata.api import LLM
    from strata.engine.generation import decode_step
    from strata.engine.sampling import SamplingParams
    from strata.eval.logpos import writer_from_switches

    writer = writer_from_switches()
    if writer is None:
        raise StrataError("teacher-forced worker: STRATA_LOGPOS is not set")
    llm = LLM(model, **options)
    ids = llm.tokenize(Path(text_file).read_text(encoding="utf-8"))
    if prefix < 1 or n < 1 or len(ids) < prefix + n:
        raise StrataError(f"{text_file}: {len(ids)} tokens, need prefix ({prefix}) + continue ({n}), both >= 1")
    if prefix + n > llm.engine.n_ctx:
        raise StrataError(f"prefix + continue = {prefix + n} tokens exceed the context of {llm.engine.n_ctx}")
    engine = llm.engine
    logits = engine.prefill(ids[:prefix])[-1]  # the prompt path
    writer.write(prefix, ids[prefix], logits)
    if engine.spec is not None:  # the decode path as speculation runs it: verify windows of the text's tokens
        for pos, row in engine.spec.teacher_forced(ids, prefix, n):
            writer.write(pos, ids[pos], row)
    else:
        for pos in range(prefix + 1, prefix + n):
            writer.write(pos, ids[pos], decode_step(engine, ids[:pos]))  # the decode path, fed the text's token
    tokens = list(engine.generate(ids[:prefix], SamplingParams(temperature=0), greedy)) if greedy else []
    Path(out).write_text(json.dumps({"greedy": tokens, "text_tokens": len(ids)}))


def _run_arm(label: str, arm: Arm, args, workdir: Path, engine_options: dict) -> tuple[Path, Path]:
    logpos, side = workdir / f"{label}.logpos", workdir / f"{label}.json"
    env = {**os.environ, **arm.env, "STRATA_LOGPOS": str(logpos), "STRATA_LOGPOS_TOPK": str(args.topk)}
    options = {k: v for k, v in engine_options.items() if v is not None} | arm.options
    command = [sys.executable, "-m", "strata.eval.teacher_forced", str(args.model), "--text", str(args.text),
               "--prefix", str(args.prefix), "--continue", str(args.n), "--greedy", str(args.greedy),
               "--out", str(side), "--options", json.dumps(options)]
    print(f"[{label}] {' '.join(f'{k}={v}' for k, v in {**arm.env, **arm.options}.items()) or '(defaults)'}",
          file=sys.stderr, flush=True)
    result = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StrataError(f"teacher-forced run {label} failed (exit {result.returncode}): {last}")
    return logpos, side


def evaluate(args, engine_options: dict) -> dict:
    """Run A, B and A again, each with `engine_options` (its own options over them); returns {"a_vs_b": ...,
    "a_vs_a": ...} as dicts of Comparison fields."""
    from strata.eval.logpos import MAX_TOPK, read_records
    from strata.eval.metrics import compare

    if not 2 <= args.topk <= MAX_TOPK:
        raise StrataError(f"--topk must be between 2 and {MAX_TOPK}")
    if not Path(args.text).is_file():
        raise StrataError(f"--text {args.text}: no such file")
    arm_a, arm_b = Arm.parse(args.a), Arm.parse(args.b)
    with tempfile.TemporaryDirectory(prefix="strata-tf-") as tmp:
        runs = {label: _run_arm(label, arm, args, Path(tmp), engine_options) for label, arm in
                (("A", arm_a), ("B", arm_b), ("A2", arm_a))}
        records = {label: read_records(logpos) for label, (logpos, _) in runs.items()}
        greedy = {label: json.loads(side.read_text())["greedy"] for label, (_, side) in runs.items()}
    result = {}
    for key, other in (("a_vs_b", "B"), ("a_vs_a", "A2")):
        comparison = compare(records["A"], records[other])
        comparison.greedy_match = greedy["A"] == greedy[other] if args.greedy else None
        result[key] = comparison.as_dict()
    result["config"] = {"a": args.a, "b": args.b, "prefix": args.prefix, "continue": args.n, "topk": args.topk}
    return result


def report(result: dict) -> str:
    from strata.eval.metrics import Comparison, table

    rows = [("A vs B", Comparison(**result["a_vs_b"])), ("A vs A (noise)", Comparison(**result["a_vs_a"]))]
    ab, aa = rows[0][1], rows[1][1]
    excess = ab.delta_nll - aa.delta_nll
    verdict = "worse" if excess > 2 * ab.delta_nll_se and ab.delta_nll_se > 0 else "within 2 SE of the noise floor"
    if excess < -2 * ab.delta_nll_se and ab.delta_nll_se > 0:
        verdict = "better"
    cfg = result["config"]
    return (f"A: {cfg['a'] or '(defaults)'}\nB: {cfg['b'] or '(defaults)'}\n"
            f"first {cfg['prefix']} tokens through the prompt path, {cfg['continue']} scored (top-{cfg['topk']})\n\n"
            f"{table(rows)}\n\nΔNLL of B over A's noise floor: {excess:+.2e} nats per token: B is {verdict}")


def main(argv: list[str] | None = None) -> int:
    """The worker's entry point (`python -m strata.eval.teacher_forced`); `strata eval teacher-forced` drives it."""
    p = argparse.ArgumentParser(prog="strata.eval.teacher_forced")
    p.add_argument("model")
    p.add_argument("--text", required=True)
    p.add_argument("--prefix", type=int, required=True)
    p.add_argument("--continue", dest="n", type=int, required=True)
    p.add_argument("--greedy", type=int, default=32)
    p.add_argument("--out", required=True)
    p.add_argument("--options", default="{}")
    args = p.parse_args(argv)
    try:
        run_worker(args.model, args.text, args.prefix, args.n, args.greedy, args.out,
                   _engine_options(json.loads(args.options)))
    except StrataError as error:
        print(f"strata: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
