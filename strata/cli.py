"""The `strata` command: run, chat, serve, info, make-model, bench, eval. Errors end in one line, exit code 2."""

from __future__ import annotations

import argparse
import sys

from strata.errors import StrataError


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="GGUF file (any shard of a split model); default: the small trained model Strata ships")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default="auto", help="activation dtype: float32, bfloat16, float16 or auto")
    p.add_argument("--kv-dtype", default="float16", help="KV cache dtype: float16 (default), bfloat16, float32, "
                   "int8 (paged, Strata's int8 format; head_dim a multiple of 64)")
    p.add_argument("-c", "--ctx", "--max-context", dest="ctx", type=int, default=None,
                   help="context size, up to 524288 (default: min(model's, 4096))")
    p.add_argument("--qsa", default="none", choices=("none", "quest"),
                   help="sparse attention for models without an indexer: quest (opt-in; see docs/BENCHMARKS.md)")
    p.add_argument("--qsa-budget", type=int, default=2048 + 3, help="cells each query attends under --qsa quest")
    _kv_resident_arg(p)
    p.add_argument("--prefill", default="auto", help="prompt chunk: tokens, auto or auto:MAX (GPU default up to 8192)")
    p.add_argument("--checkpoints", type=int, default=None, help="caches of recent conversations kept for their "
                   "next turn (0: none; default: the engine's 8, none for `run`, whose one prompt has no next turn)")
    p.add_argument("--checkpoint-gib", type=float, default=4.0, help="most memory the checkpoints take (host RAM)")
    _placement_args(p)
    _speculation_args(p)


def _speculation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", type=_spec_window, default=1, metavar="T",
                   help="speculative decoding: verify windows of the last token + T-1 drafts (MTP block, else prompt "
                        "lookup), T = 1 (off, default) .. 4, or auto (the engine's rule); greedy output is unchanged")
    p.add_argument("--spec-min-p", type=float, default=0.0, metavar="P", help="end an MTP draft below this probability")
    p.add_argument("--suffix-draft", type=int, default=0, metavar="N",
                   help="add up to N prompt-lookup drafts where the MTP draft stops")


def _whole(low: int, high: int | None = None):
    """An argparse type: a whole number in low..high (no upper end where high is None), else argparse's one-line
    error naming the option (a count of 0 reached the benchmarks' arithmetic as a bare traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number, not {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"at least {low}, not {value}" if high is None else
                                             f"between {low} and {high}, not {value}")
        return value
    return parse


def _spec_window(text: str) -> int | str:
    if text == "auto" or text.lstrip("-").isdigit():
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"a window of 1..4 tokens or auto, not {text!r}")


def _speculation(args) -> dict:
    return dict(spec=args.spec, spec_min_p=args.spec_min_p, suffix_draft=args.suffix_draft)


def _kv_resident_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-resident", type=int, default=None, metavar="N",
                   help="int8 KV pages in host RAM, N cells per layer on the GPU (CLOCK eviction)")


def _placement_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vram-budget", type=float, default=None, metavar="GIB",
                   help="behave as if the GPU (with --gpus: each card) had this much memory (default: what is free)")
    p.add_argument("--gpus", default=None, metavar="LIST",
                   help="split the layers over these cards, e.g. 0,1 (each caches its own layers' experts)")
    p.add_argument("--layer-split", default="auto", metavar="auto|K1,K2",
                   help="with --gpus: layers per card, or auto (by each card's memory after its dense weights)")
    p.add_argument("--expert-cache", default="auto", help="GPU expert slots when experts do not all fit: auto or N")
    p.add_argument("--pcie-frac", type=float, default=0.0, help="share of cache misses run on the GPU over PCIe")
    p.add_argument("--misses", default="auto", choices=("auto", "cpu", "direct"),
                   help="decode: compute the experts the cache lacks on the CPU pool, or (direct) let the GPU read "
                        "them from pinned host RAM over PCIe, with no host round trip per layer (auto: direct on a "
                        "GPU with pinned experts)")
    p.add_argument("--cpu-threads", type=int, default=0, metavar="N",
                   help="threads of the CPU pool that computes missed experts (default 0: every core but one)")
    p.add_argument("--cpu-spin-us", type=float, default=1000.0, metavar="US",
                   help="the CPU pool's threads stay awake this long after a call (default 1000; 0: sleep at once)")
    p.add_argument("--no-pin-experts", dest="pin_experts", action="store_false",
                   help="keep host experts memory-mapped instead of pinned (less RAM, slower copies)")
    p.add_argument("--expert-profile", default=None, help="routing profile from `strata profile`, to fill the cache")
    p.add_argument("--prefill-stream", default="auto", choices=("auto", "on", "off"),
                   help="offloaded prompts: stream the experts the cache lacks to the GPU (auto: GPU chunks of >= 32)")
    p.add_argument("--prefill-borrow", default="auto", choices=("auto", "on", "off"),
                   help="streamed prompt chunks keep their expert work buffers in borrowed cache slots (auto: where "
                        "that makes chunks larger; refilled after the prompt)")
    p.add_argument("--no-graphs", dest="graphs", action="store_false",
                   help="decode step by step instead of through captured CUDA graphs (for comparison)")


def _placement(args) -> dict:
    cache = args.expert_cache if args.expert_cache == "auto" else _count(args.expert_cache, "--expert-cache")
    options = dict(vram_budget=args.vram_budget, expert_cache=cache, pcie_frac=args.pcie_frac, misses=args.misses,
                   cpu_threads=args.cpu_threads, cpu_spin_us=args.cpu_spin_us, pin_experts=args.pin_experts,
                   expert_profile=args.expert_profile,
                   prefill_stream=args.prefill_stream, prefill_borrow=args.prefill_borrow,
                   decode_graphs="auto" if args.graphs else "off", gpus=args.gpus,
                   layer_split=args.layer_split)
    if hasattr(args, "qsa"):  # the engine commands' attention options travel with the placement
        options.update(qsa=args.qsa, qsa_budget=args.qsa_budget, kv_resident=args.kv_resident)
    return options


def _count(text: str, flag: str) -> int:
    if not text.isdigit():
        raise StrataError(f"{flag} must be 'auto' or a number of experts, got {text!r}")
    return int(text)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=128)
    p.add_argument("--temp", type=float, default=0.7, help="temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--top-p", type=float, default=0.8)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def _load(args):
    from strata.api import LLM

    llm = LLM(args.model, device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype, n_ctx=args.ctx, progress=True,
              prefill_chunk=_prefill(args.prefill), checkpoints=_checkpoints(args),
              checkpoint_gib=args.checkpoint_gib, **_placement(args), **_speculation(args))
    if args.command in ("run", "chat"):
        llm.engine.on_prefill_progress = _show_prefill_progress
    return llm


def _checkpoints(args) -> int:
    """Conversation checkpoints to keep: `run` reads one prompt and exits, so by default it copies none out (a
    hybrid model's cache is otherwise saved at the prompt's end, before the first token: 42 ms at 4K tokens on the
    full-size qwen4exp, 161 ms at 32K)."""
    from strata.engine.engine import EngineConfig

    if args.checkpoints is not None:
        return args.checkpoints
    return 0 if args.command == "run" else EngineConfig.checkpoints


def _prefill(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _show_prefill_progress(p) -> None:
    """A prompt read in several chunks shows how far it got; one chunk says nothing."""
    if p.done < p.total or p.seconds > 1.0:
        end = "\n" if p.done == p.total else ""
        print(f"\rread {p.done}/{p.total} prompt tokens ({p.tokens_per_second:.0f} tok/s)", end=end, file=sys.stderr,
              flush=True)


def _sampling(args) -> dict:
    """Sampling options, checked before the model loads so a typo fails at once."""
    from strata.engine.sampling import SamplingParams

    options = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repeat_penalty, seed=args.seed)
    SamplingParams(**options)
    return options


def _print_stream(chunks) -> None:
    for chunk in chunks:
        print(chunk.text, end="", flush=True)
        if chunk.finish_reason:
            s = chunk.stats
            print(f"\n[{s.prompt_tokens} prompt tokens at {s.prompt_tokens_per_second:.1f} tok/s, "
                  f"{s.completion_tokens} generated at {s.decode_tokens_per_second:.1f} tok/s, "
                  f"finish: {chunk.finish_reason}]", file=sys.stderr)


def cmd_run(args) -> None:
    sampling = _sampling(args)
    llm = _load(args)
    if args.chat:
        chunks = llm.chat([{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens, stop=args.stop,
                          stream=True, **sampling)
    else:
        chunks = llm.generate(args.prompt, max_tokens=args.max_tokens, stop=args.stop, stream=True, **sampling)
    _print_stream(chunks)
    if llm.engine.spec is not None:
        stats = llm.engine.spec.stats
        acceptance = " ".join("-" if a != a else f"{a:.2f}" for a in stats.acceptance())
        print(f"[spec {stats.window}: {stats.tokens_per_window:.2f} tokens per verify window, acceptance by draft "
              f"position {acceptance}]", file=sys.stderr)


def cmd_chat(args) -> None:
    sampling = _sampling(args)
    llm = _load(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    usage = "Type a message; /reset starts over, /quit leaves (// sends a message that starts with /)."
    print(usage, file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        command = line.strip()
        if command == "/quit":
            return
        if command == "/reset":
            messages = messages[:1] if args.system else []
            print("(conversation cleared)", file=sys.stderr)
            continue
        if not command:
            continue
        if command.startswith("/") and not command.startswith("//"):  # a mistyped command is not sent as a message
            print(f"(unknown command {command.split()[0]}) {usage}", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line.lstrip()[1:] if command.startswith("//") else line})
        reply = []
        try:
            for chunk in llm.chat(messages, max_tokens=args.max_tokens, stop=args.stop, stream=True, **sampling):
                reply.append(chunk.text)
                print(chunk.text, end="", flush=True)
        except StrataError as exc:  # the conversation outgrew the context: say so and keep it, less this message
            messages.pop()
            print(f"\n({exc}; /reset starts over)", file=sys.stderr)
            continue
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})


def cmd_info(args) -> None:
    from strata.models.info import describe, describe_plan

    print(describe(args.model, args.ctx, args.kv_dtype))
    if args.plan:
        print(describe_plan(args.model, args.ctx, args.device, args.vram_budget, _placement(args)["expert_cache"],
                            args.kv_dtype, args.kv_resident, args.gpus, args.layer_split, args.prefill_borrow))


def cmd_profile(args) -> None:
    from pathlib import Path

    from strata.engine.engine import Engine, EngineConfig
    from strata.engine.profile import profile_routing

    text = Path(args.text).read_text() if Path(args.text).is_file() else args.text
    try:  # before the run: a folder that cannot be made would lose its counts at the end
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StrataError(f"{args.output}: cannot write there ({error.strerror})") from None
    engine = Engine(args.model, EngineConfig(device=args.device, n_ctx=args.ctx, progress=True, **_placement(args)))
    result = profile_routing(engine, text, args.output)
    print(f"wrote {args.output}: routing counts of {result['tokens']} tokens over {len(result['counts'])} layers")


def cmd_make_model(args) -> None:
    from strata.models.synthetic import make_model

    overrides = {**(_mtp_override(args.arch) if args.mtp else {}), **({"n_layers": args.layers} if args.layers else {})}
    path = make_model(args.output, arch=args.arch, preset=args.preset, quant=args.quant, seed=args.seed, progress=True,
                      **overrides)
    print(f"wrote {path}")


def _mtp_override(arch: str) -> dict:
    """--mtp as the synthetic makers spell it: qwen4exp's one MTP block, else trailing nextn blocks."""
    return {"mtp": True} if arch == "qwen4exp" else {"nextn_layers": 1}


def cmd_bench(args) -> None:
    from strata.bench.generate import bench_generate

    args.prefill = _prefill(args.prefill)
    bench_generate(args)


def cmd_serve(args) -> None:
    from strata.serve.app import check_exposure, serve

    check_exposure(args.host, args.api_key, args.max_queue)  # before the model loads: a refused start is instant
    serve(args, _load(args))


def cmd_eval_teacher_forced(args) -> None:
    import json

    from strata.eval.teacher_forced import evaluate, report

    options = dict(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype, n_ctx=args.ctx, **_placement(args),
                   **_speculation(args))
    result = evaluate(args, options)
    print(json.dumps(result, indent=2) if args.json else report(result))


def cmd_kernel_bench(args) -> None:
    import importlib

    code = importlib.import_module(f"strata.bench.{args.module}").main(args.tool_options)
    if code:
        raise SystemExit(code)


def cmd_bench_decode(args) -> None:
    from strata.bench.decode import bench_decode

    args.prefill = _prefill(args.prefill)
    bench_decode(args, _placement(args))


def cmd_bench_prompt(args) -> None:
    from strata.bench.prompt import bench_prompt

    args.prefill = _prefill(args.prefill)
    bench_prompt(args, _placement(args))


def cmd_bench_spec(args) -> None:
    from strata.bench.spec import bench_spec

    args.prefill = _prefill(args.prefill)
    bench_spec(args, _placement(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description="Mixture-of-experts GGUF inference.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="continue a prompt (or answer it as chat with --chat), streaming tokens")
    _engine_args(p)
    _sampling_args(p)
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("chat", help="interactive chat; /reset, /quit")
    _engine_args(p)
    _sampling_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("info", help="architecture, parameters, quant types and a memory estimate")
    p.add_argument("model")
    p.add_argument("-c", "--ctx", "--max-context", dest="ctx", type=int, default=4096,
                   help="context size for the memory estimate")
    p.add_argument("--kv-dtype", default="float16", help="KV cache dtype of the estimate: float16, bfloat16, float32, int8")
    _kv_resident_arg(p)
    p.add_argument("--plan", action="store_true", help="also print where each part would live")
    p.add_argument("--device", default="auto", help="device the plan is for")
    _placement_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("profile", help="count expert routings on a text, for filling the expert cache at start")
    p.add_argument("model")
    p.add_argument("text", help="a text file, or the text itself")
    p.add_argument("-o", "--output", required=True, help="profile file to write (JSON)")
    p.add_argument("--device", default="auto")
    p.add_argument("-c", "--ctx", type=int, default=None)
    _placement_args(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("make-model", help="write a GGUF with synthetic weights and a small real tokenizer")
    p.add_argument("--arch", default="qwen3moe", help="qwen2, qwen3, qwen3moe, qwen3next or qwen4exp")
    p.add_argument("--preset", default="tiny",
                   help="tiny, small, qwen3-30b-a3b, qwen4exp-experts; full: the real shapes of qwen3next or qwen4exp "
                        "(qwen4exp: 2 shards, the second the n-gram table)")
    p.add_argument("--quant", default="Q8_0", help="weight type, e.g. F32, Q8_0, Q4_K, Q4_0, Q2_0, IQ2_XS")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mtp", action="store_true", help="qwen3next, qwen4exp: add an MTP block (blk.N.nextn.*) for --spec")
    p.add_argument("--layers", type=_whole(1), default=None,
                   help="layers instead of the preset's (e.g. a few full-size layers to profile one layer's cost)")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_make_model)

    p = sub.add_parser("serve", help="HTTP server: OpenAI and Anthropic APIs, a chat and monitor page at /")
    _engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_whole(0, 65535), default=8080)
    p.add_argument("--api-key", default=None, help="required from clients; mandatory when the host is not loopback")
    p.add_argument("--model-name", default=None, help="the model's name in the API (default: the file's stem)")
    p.add_argument("--max-queue", type=_whole(0), default=16, help="requests that may wait while one runs (then 429)")
    p.add_argument("--max-body-mib", type=float, default=8.0, help="largest request body accepted")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("eval", help="quality measurements")
    evals = p.add_subparsers(dest="eval", required=True)
    e = evals.add_parser("teacher-forced", help="compare two configurations on a text, position by position")
    _engine_args(e)
    e.add_argument("--text", required=True, help="UTF-8 text file to read")
    e.add_argument("--prefix", type=int, required=True, help="P: tokens read through the prompt path")
    e.add_argument("--continue", dest="n", type=int, required=True, help="N: positions scored after the prefix")
    e.add_argument("--a", default="", help='configuration A: "ENV=VALUE option=value ..." (the reference)')
    e.add_argument("--b", default="", help="configuration B, the same way")
    e.add_argument("--topk", type=int, default=20, help="K of each position's record (2 to 256)")
    e.add_argument("--greedy", type=int, default=32, help="greedy tokens after the prefix to compare (0: skip)")
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    e.set_defaults(func=cmd_eval_teacher_forced)

    p = sub.add_parser("bench", help="speed measurements")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("generate", help="prompt and decode tokens/s")
    _engine_args(b)
    b.add_argument("--prompt-tokens", type=_whole(1), default=128)
    b.add_argument("--gen-tokens", type=_whole(1), default=32)
    b.add_argument("--reps", type=_whole(1), default=3)
    b.set_defaults(func=cmd_bench)
    b = bench.add_parser("decode", help="decode tokens/s with experts offloaded, beside its floor")
    _engine_args(b)
    b.add_argument("--tokens", type=_whole(1), default=64, help="decode steps to time")
    b.add_argument("--prompt-tokens", type=_whole(1), default=64)
    b.add_argument("--gpu-floor", default="resident", metavar="resident|bytes|MS",
                   help="offloaded runs: the floor's GPU time a token: the device time of the same model's "
                        "all-resident step, timed after the run where it fits (resident), estimated from the bytes "
                        "the GPU reads (bytes), or given in ms (what an all-resident run prints as its GPU step)")
    b.add_argument("--adapt-sweep", default="", metavar="EVERYxSWAPS,...",
                   help="offloaded runs: decode again with the expert cache adapting every N steps by up to M swaps "
                        "(e.g. 2x96,8x96,4x48), one row each beside the default")
    b.add_argument("--pdl-sweep", default="", metavar="MODE,...",
                   help="decode again with STRATA_PDL at each mode (e.g. 0,1,3,2: the step's kernels with "
                        "programmatic dependent launch, sm_90+), graphs captured afresh, one row each beside the "
                        "first run: tok/s, median step and (all resident) the GPU step")
    b.set_defaults(func=cmd_bench_decode)
    b = bench.add_parser("prompt", help="prompt tokens/s per context, beside the PCIe or matrix floor")
    b.add_argument("model", help="GGUF file")
    b.add_argument("--device", default="auto")
    b.add_argument("--dtype", default="auto")
    b.add_argument("--kv-dtype", default="float16")
    b.add_argument("--prefill", default="auto", help="prompt chunk: tokens, auto or auto:MAX")
    b.add_argument("--ctx", default="4096,32768", help="comma-separated prompt lengths (default 4096,32768)")
    b.add_argument("--reps", type=_whole(1), default=1, help="prompts timed per length (median)")
    b.add_argument("--routing", default="model", choices=("model", "balanced"),
                   help="balanced: a load test, every chunk's tokens spread over all experts (outputs not the model's)")
    _placement_args(b)
    b.set_defaults(func=cmd_bench_prompt)
    b = bench.add_parser("spec", help="decode tokens/s with and without --spec, acceptance by draft position")
    _engine_args(b)
    b.add_argument("--windows", default="1,2,3,4", help="the --spec values to compare (1 always runs)")
    b.add_argument("--text", default=None, help="text whose first tokens are the prompt (default: a built-in one)")
    b.add_argument("--prompt-tokens", type=_whole(1), default=256)
    b.add_argument("--gen-tokens", type=_whole(1), default=64)
    b.add_argument("--reps", type=_whole(1), default=2)
    b.set_defaults(func=cmd_bench_spec)
    for name, module, help_text in [
        ("prompt-attn", "prompt_attn", "parity and speed of the prompt-attention kernels against float64"),
        ("qsa-attn", "qsa_attn", "a prompt chunk's selected attention over the fp16 KV cache: dense-mask SDPA vs "
         "the selected-cells kernel (--sweep) beside the floor, against float64"),
        ("moe-prefill", "moe_prefill", "parity and speed of the prompt expert paths against float64"),
        ("expert-gather", "expert_gather", "GB/s of streaming a layer's missing experts (one gather launch vs "
         "three copies an expert) beside the pinned copy rate (--sweep)"),
        ("moe-decode", "moe_decode", "parity and speed of the decode expert GEMV kernels against float64"),
        ("moe-chain", "moe_chain", "an MoE layer's routing and experts chained in one launch (STRATA_DECODE_CHAIN) "
         "against the three launches, beside the floor (--sweep)"),
        ("miss-bw", "miss_bw", "GB/s of decode misses read from pinned host RAM (in place, gathered, memcpy) beside the link"),
        ("matvec", "matvec", "GB/s of the dense quantized decode matvec beside the HBM floor, against float64"),
        ("decode-attn", "decode_attn", "decode attention per span (split-K vs one launch, --sweep) beside its byte floor"),
        ("gdn-step", "gdn_step", "the GatedDeltaNet decode step's conv and gate kernels against torch (--sweep)"),
        ("hc-read", "hc_read", "qwen4exp's hyper-connection read kernels (few rows) against torch (--sweep)"),
        ("cpu-experts", "cpu_experts", "GB/s of the CPU expert kernels beside host memory bandwidth"),
        ("long-context", "long_context", "a long prompt through int8 KV: dense vs --qsa quest vs --kv-resident"),
        ("checkpoints", "checkpoints", "what a conversation checkpoint costs (copy out and back) and saves"),
    ]:
        # The tool parses its own options (`strata bench prompt-attn --help` lists them).
        b = bench.add_parser(name, help=help_text, add_help=False)
        b.set_defaults(func=cmd_kernel_bench, module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "module", None):
        args.tool_options = extra  # a kernel bench: the rest is the tool's
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from strata import switches

    for name in switches.unknown_in_environment():
        print(f"strata: warning: {name} is not a Strata switch and changes nothing (strata/switches.py declares "
              "them)", file=sys.stderr)
    try:
        if "model" in vars(args) and args.model is None:  # the commands whose model is optional
            from strata.default_model import resolve_model

            args.model = resolve_model(None)
        args.func(args)
    except StrataError as exc:
        print(f"strata: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
