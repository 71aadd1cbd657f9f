"""Train the small default model: a Qwen3-Next MoE (GDN + gated attention + shared expert + MTP head) on the prose
of Python's and PostgreSQL's documentation (tools/train_data.py), with transformers' own model class, then export
it to GGUF with tools/export_hf.py (check and ship: tools/train_report.py).

    # here (CPU): the data, the tokenizer and their manifest, into an ignored folder the device run carries
    python tools/train_small.py prepare --out .train       # apt-get downloads the two .debs into .train-src
    # the GPU machine (tools/device/train_small.sh): train for a fixed time, write checkpoint, log, GGUF
    python tools/train_small.py train --data .train --out $OUT/trained --time-limit 330

The step budget is wall time (the run must end inside one device call); held-out loss is measured every
--eval-every seconds and the best state is the one saved. Everything random is drawn from --seed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script: make `strata` and `tools` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.export_hf import attach_checkpoint_mtp, export_gguf  # noqa: E402
from tools.train_mtp import Qwen3NextMTP  # noqa: E402
from strata.default_model import PINNED_TOKENS, SAMPLE_PROMPTS  # noqa: E402

# The shipped model. Q8_0 rows are 32 wide, so every matrix dimension is a multiple of 32; 8 layers with full
# attention every 4th (Qwen3-Next's 3:1), 32 experts of which 4 are used, and a shared expert.
SMALL = dict(
    hidden_size=256,
    num_hidden_layers=8,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    partial_rotary_factor=0.25,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=32,
    num_experts_per_tok=4,
    moe_intermediate_size=32,  # 20.5M parameters at 64: over the 20 MB Q8_0 budget; 14.3M (+1.4M MTP) at 32
    shared_expert_intermediate_size=256,
    intermediate_size=256,  # unused by an all-MoE model; llama.cpp's feed_forward_length
)
# A few seconds of CPU: the tests' and the dry run's size.
TINY = dict(
    SMALL,
    hidden_size=64,
    num_hidden_layers=4,
    full_attention_interval=2,
    num_attention_heads=2,
    head_dim=32,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=64,
    intermediate_size=64,
)
PRESETS = {"small": SMALL, "tiny": TINY}
GGUF_NAME = "model.gguf"
GGUF_LIMIT_BYTES = 20 * 1024 * 1024


def make_config(preset: dict, vocab_size: int, seq_len: int):
    from transformers import Qwen3NextConfig

    fields = dict(preset)
    interval = fields.pop("full_attention_interval")
    layer_types = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(fields["num_hidden_layers"])
    ]
    return Qwen3NextConfig(
        vocab_size=vocab_size,
        layer_types=layer_types,
        max_position_embeddings=max(4096, seq_len),
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        attention_bias=False,
        router_aux_loss_coef=0.01,
        **fields,
    )


# ---------------------------------------------------------------------------------------------- data


def load_tokens(data: Path, name: str) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(data / name, dtype=np.uint16).astype(np.int64))


def heldout_windows(tokens: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping windows of seq_len tokens from the start of the held-out stream: [n, seq_len]."""
    n = min(max_windows, tokens.numel() // seq_len)
    if n == 0:
        raise ValueError(f"the held-out stream ({tokens.numel()} tokens) is shorter than one window of {seq_len}")
    return tokens[: n * seq_len].view(n, seq_len)


def random_batch(tokens: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, tokens.numel() - seq_len, (batch,), generator=generator)
    return torch.stack([tokens[s : s + seq_len] for s in starts.tolist()])


# ---------------------------------------------------------------------------------------------- losses


class FinalHidden:
    """Captures the output of the model's final norm (the h_t the MTP head reads) on each forward."""

    def __init__(self, causal_lm):
        self.value = None
        causal_lm.model.norm.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output):
        self.value = output


def losses(causal_lm, mtp, final_hidden: FinalHidden, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(main loss incl. the router balance term, MTP loss) for a batch of windows [B, T]."""
    out = causal_lm(input_ids=ids, labels=ids, output_router_logits=True)
    mtp_logits = mtp(causal_lm, final_hidden.value[:, :-2], ids[:, 1:-1])
    mtp_loss = F.cross_entropy(mtp_logits.flatten(0, 1).float(), ids[:, 2:].flatten())
    return out.loss, mtp_loss


@torch.no_grad()
def heldout_nll(causal_lm, windows: torch.Tensor, device: str, autocast: bool, batch: int = 16) -> float:
    """Mean next-token negative log-likelihood (nats) over the windows, each scored on its own."""
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch):
        ids = windows[start : start + batch].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = causal_lm(input_ids=ids).logits
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum")
        total, count = total + nll.item(), count + ids[:, 1:].numel()
    return total / count


# ---------------------------------------------------------------------------------------------- training


def train(args) -> dict:
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    autocast = device == "cuda"
    data_manifest = json.loads((args.data / "manifest.json").read_text())
    tokenizer_metadata = json.loads((args.data / "tokenizer_gguf.json").read_text())
    train_tokens = load_tokens(args.data, "train.bin").to(device)
    held = heldout_windows(load_tokens(args.data, "heldout.bin"), args.seq_len, args.eval_windows)

    config = make_config(PRESETS[args.preset], len(tokenizer_metadata["tokenizer.ggml.tokens"]), args.seq_len)
    causal_lm = Qwen3NextForCausalLM(config).to(device)
    mtp = Qwen3NextMTP.for_model(causal_lm).to(device)
    final_hidden = FinalHidden(causal_lm)
    params = [*causal_lm.parameters(), *mtp.parameters()]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), fused=device == "cuda",
    )
    generator = torch.Generator().manual_seed(args.seed)
    n_params = sum(p.numel() for p in causal_lm.parameters())
    log_path = args.out / "train_log.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("w")

    def log(record: dict) -> None:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()
        print(json.dumps(record), flush=True)

    log({"event": "start", "device": device, "params": n_params, "mtp_params": sum(p.numel() for p in mtp.parameters()),
         "train_tokens": train_tokens.numel(), "heldout_eval_tokens": held.numel(), "config": config.to_dict()})

    start = time.monotonic()
    best = (math.inf, None, 0)
    last_eval = start
    step, tokens_seen = 0, 0
    while True:
        elapsed = time.monotonic() - start
        done = elapsed >= args.time_limit or (args.max_steps and step >= args.max_steps)
        if done or time.monotonic() - last_eval >= args.eval_every:
            causal_lm.eval()
            nll = heldout_nll(causal_lm, held, device, autocast)
            causal_lm.train()
            last_eval = time.monotonic()
            log({"event": "eval", "step": step, "tokens": tokens_seen, "seconds": round(elapsed, 1),
                 "heldout_loss": round(nll, 4)})
            if nll < best[0]:  # the data is small: keep the state of the best held-out loss, not the last
                state = {k: v.detach().clone() for k, v in (*causal_lm.state_dict().items(),
                                                              *mtp.checkpoint_tensors().items())}
                best = (nll, state, step)
        if done:
            break
        progress = min(1.0, elapsed / args.time_limit) if not args.max_steps else step / args.max_steps
        warm = min(1.0, (step + 1) / args.warmup)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        ids = random_batch(train_tokens, args.batch, args.seq_len, generator)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            main_loss, mtp_loss = losses(causal_lm, mtp, final_hidden, ids)
            loss = main_loss + args.mtp_weight * mtp_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step, tokens_seen = step + 1, tokens_seen + ids.numel()
        if step % args.log_every == 0 or step == 1:
            log({"event": "step", "step": step, "tokens": tokens_seen, "seconds": round(time.monotonic() - start, 1),
                 "lr": round(lr, 6), "train_loss": round(main_loss.item(), 4), "mtp_loss": round(mtp_loss.item(), 4)})
    log_file.close()

    best_nll, state, best_step = best
    causal_lm.load_state_dict({k: v for k, v in state.items() if not k.startswith("mtp.")})
    mtp.load_checkpoint_tensors({k: v for k, v in state.items() if k.startswith("mtp.")})
    # float32 from here on, on the training device: where fla is installed its kernels take CUDA tensors only
    return finish(args, causal_lm.float().eval(), mtp.float().eval(), tokenizer_metadata, data_manifest,
                  {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "steps": step, "tokens": tokens_seen, "seconds": round(time.monotonic() - start, 1),
                   "best_step": best_step, "best_heldout_loss_during_training": round(best_nll, 4)})


# ---------------------------------------------------------------------------------------------- outputs


def save_checkpoint(causal_lm, mtp, tokenizer_dir: Path, out: Path) -> None:
    """save_pretrained, then the MTP tensors added to the same safetensors state dict (as Qwen3-Next ships)."""
    from safetensors.torch import load_file, save_file

    causal_lm.save_pretrained(out)
    weights = out / "model.safetensors"
    tensors = {**load_file(weights), **mtp.checkpoint_tensors()}
    save_file(tensors, weights, metadata={"format": "pt"})
    (out / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())


def perplexity_record(causal_lm, windows: torch.Tensor, seq_len: int) -> dict:
    """The held-out perplexity by transformers in float32: the figure our engine must reproduce."""
    nll = heldout_nll(causal_lm, windows, str(causal_lm.device), autocast=False)
    return {"windows": int(windows.shape[0]), "window_tokens": seq_len, "nll": nll, "perplexity": math.exp(nll)}


@torch.no_grad()
def greedy_samples(causal_lm, tokenizer_metadata: dict, n_tokens: int) -> dict[str, str]:
    from strata.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf_metadata(tokenizer_metadata, "trained BPE")
    samples = {}
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)], device=causal_lm.device)
        out = causal_lm.generate(ids, max_new_tokens=n_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        samples[prompt] = tokenizer.decode(out[0, ids.shape[1] :].tolist())
    return samples


def finish(args, causal_lm, mtp, tokenizer_metadata: dict, data_manifest: dict, training: dict) -> dict:
    out = args.out
    # The reported perplexity: on the first eval windows of the held-out documents (these ids ship beside the GGUF).
    held_all = load_tokens(args.data, "heldout.bin")
    report_windows = heldout_windows(held_all, args.seq_len, args.report_windows)
    report_windows.numpy().astype(np.uint16).tofile(out / "heldout_eval.bin")
    result = {
        "training": training,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "func"},
        "data_manifest": data_manifest,
        "heldout_transformers": perplexity_record(causal_lm, report_windows, args.seq_len),
        "heldout_transformers_all": perplexity_record(causal_lm, heldout_windows(held_all, args.seq_len, 10**9),
                                                      args.seq_len),
        "samples_transformers": greedy_samples(causal_lm, tokenizer_metadata, args.sample_tokens),
    }
    causal_lm, mtp = causal_lm.cpu(), mtp.cpu()
    save_checkpoint(causal_lm, mtp, args.data, out / "checkpoint")
    gguf_path = out / GGUF_NAME
    attach_checkpoint_mtp(causal_lm, mtp.checkpoint_tensors())  # the GGUF carries the MTP head (nextn) for --spec
    export_gguf(causal_lm, gguf_path, args.qtype, tokenizer_metadata=tokenizer_metadata)
    size = gguf_path.stat().st_size
    result["gguf"] = {"file": GGUF_NAME, "qtype": args.qtype, "bytes": size, "mtp_block": True,
                      "sha256": hashlib.sha256(gguf_path.read_bytes()).hexdigest(),
                      "heldout_eval_sha256": hashlib.sha256((out / "heldout_eval.bin").read_bytes()).hexdigest()}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("training", "heldout_transformers", "samples_transformers", "gguf")},
                     indent=1), flush=True)
    if size > GGUF_LIMIT_BYTES:
        raise SystemExit(f"{gguf_path}: {size} bytes, over the {GGUF_LIMIT_BYTES}-byte limit")
    return result


# ---------------------------------------------------------------------------------------------- CLI


def prepare_command(args) -> None:
    from tools.train_data import corpus_from_debs, corpus_from_folder, prepare

    corpus = corpus_from_folder(args.text) if args.text else corpus_from_debs(args.debs)
    manifest = prepare(corpus, args.out, args.vocab)
    print(json.dumps({k: manifest[k] for k in ("train_documents", "train_tokens", "heldout_tokens")}))


def _report():
    from tools import train_report

    return train_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(required=True)
    p = sub.add_parser("prepare", help="corpus -> tokenizer + token files + manifest")
    p.add_argument("--out", type=Path, default=Path(".train"))
    p.add_argument("--debs", type=Path, default=Path(".train-src"), help="folder of the source .debs (apt-get "
                   "fetches missing ones); not carried to the GPU machine")
    p.add_argument("--text", type=Path, help="a folder of .txt/.rst files instead of the .deb (tests)")
    p.add_argument("--vocab", type=int, default=8192)
    p.set_defaults(func=prepare_command)

    t = sub.add_parser("train", help="train, save checkpoint + log + GGUF into --out")
    t.add_argument("--data", type=Path, default=Path(".train"))
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--preset", choices=sorted(PRESETS), default="small")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--time-limit", type=float, default=330.0, help="seconds of training (start-up not counted)")
    t.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time only)")
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--seq-len", type=int, default=512)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=int, default=200)
    t.add_argument("--mtp-weight", type=float, default=0.3)
    t.add_argument("--eval-every", type=float, default=30.0, help="seconds between held-out evaluations")
    t.add_argument("--eval-windows", type=int, default=64)
    t.add_argument("--report-windows", type=int, default=4, help="held-out windows shipped for the parity test")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--sample-tokens", type=int, default=32)
    t.add_argument("--qtype", default="Q8_0")
    t.set_defaults(func=train)

    c = sub.add_parser("check", help="our engine on a run's GGUF: held-out perplexity vs transformers, samples")
    c.add_argument("--run", type=Path, required=True, help="a train --out folder")
    c.add_argument("--device", default="cpu")
    c.add_argument("--sample-tokens", type=int, default=0, help="tokens per sample (default: as trained)")
    c.set_defaults(func=lambda args: _report().check_command(args))

    s = sub.add_parser("ship", help="copy a run's GGUF + manifest into strata/data/default-model")
    s.add_argument("--run", type=Path, required=True)
    s.add_argument("--dest", type=Path, default=Path(__file__).resolve().parents[1] / "strata/data/default-model")
    s.add_argument("--pins", type=Path, default=Path(__file__).resolve().parents[1] / "tests/default_model_greedy.json",
                   help="where the pinned greedy outputs go")
    s.add_argument("--pin-tokens", type=int, default=PINNED_TOKENS, help="tokens per pinned output (tests: fewer)")
    s.add_argument("--benchmarks", type=Path, default=Path(__file__).resolve().parents[1] / "docs/BENCHMARKS.md",
                   help="the docs file whose default-model section is (re)written")
    s.set_defaults(func=lambda args: _report().ship_command(args))
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
