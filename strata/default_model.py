"""The model used when none is named: a small trained Qwen3-Next shipped in strata/data/default-model/, or, until that
file is there, the synthetic demo model (random weights), made once and cached, with a one-line notice.

The shipped folder holds the GGUF, manifest.json (its sha256, the held-out perplexity transformers measured on the
training checkpoint, greedy samples, the data manifest) and heldout_eval.bin (the held-out token windows that
perplexity was measured on). tools/train_small.py writes it (`train`, then `ship`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from strata.errors import StrataError

SHIPPED_DIR = Path(str(resources.files("strata").joinpath("data/default-model")))
SHIPPED_GGUF = "strata-default-qwen3next-q8_0.gguf"
MANIFEST = "manifest.json"
HELDOUT_EVAL = "heldout_eval.bin"
SAMPLE_PROMPTS = ("The Python interpreter", "A database index", "To open a file,")
PINNED_TOKENS, PINNED_DEVICE = 12, "cpu"  # the tests pin greedy outputs of this length, float32 on this device
# The synthetic stand-in, as `make demo` made it before the trained model: small, qwen3moe, Q4_K.
SYNTHETIC = dict(arch="qwen3moe", preset="small", quant="Q4_K", seed=0)


def shipped_path(folder: Path | None = None) -> Path:
    return (folder or SHIPPED_DIR) / SHIPPED_GGUF


def read_manifest(folder: Path | None = None) -> dict:
    path = (folder or SHIPPED_DIR) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise StrataError(f"{path}: the default model's manifest is missing") from None
    except json.JSONDecodeError as error:
        raise StrataError(f"{path}: not valid JSON ({error})") from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "strata"


def synthetic_path() -> Path:
    """The synthetic demo model, made on first use (a few seconds) into the user's cache folder."""
    from strata.models.synthetic import make_model

    spec = SYNTHETIC
    path = _cache_dir() / f"demo-{spec['arch']}-{spec['preset']}-{spec['quant'].lower()}-seed{spec['seed']}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        make_model(partial, **spec)
        partial.replace(path)  # a run killed half-way leaves no half-written model behind
    return path


def resolve_model(model: str | os.PathLike | None, notice=None) -> str:
    """`model` when one is named; else the shipped trained model; else the synthetic one, with a one-line notice."""
    if model is not None:
        return str(model)
    shipped = shipped_path()
    if shipped.exists():
        return str(shipped)
    path = synthetic_path()
    message = (f"strata: no model named and the trained default ({shipped.name}) is not installed; "
               f"using the synthetic demo model {path} (random weights: its words are noise)")
    (notice or (lambda text: print(text, file=sys.stderr)))(message)
    return str(path)


# ---------------------------------------------------------------------------------------------- checks


def read_windows(path: Path, window_tokens: int) -> torch.Tensor:
    """The held-out windows [n, window_tokens] stored as uint16 token ids."""
    ids = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    if ids.size == 0 or ids.size % window_tokens:
        raise StrataError(f"{path}: {ids.size} tokens is not a whole number of {window_tokens}-token windows")
    return torch.from_numpy(ids).view(-1, window_tokens)


def heldout_nll(llm, windows: torch.Tensor) -> float:
    """Mean next-token negative log-likelihood (nats) of our engine over the windows, each scored on its own from
    its first token: the same definition tools/train_small.py measured with transformers."""
    total, count = 0.0, 0
    for window in windows:
        logits = llm.logits(window.tolist()).double()
        total += F.cross_entropy(logits[:-1], window[1:], reduction="sum").item()
        count += window.numel() - 1
    return total / count


def heldout_perplexity(llm, folder: Path | None = None) -> tuple[float, float]:
    """(our engine's perplexity, transformers' recorded one) on the shipped held-out windows."""
    folder = folder or SHIPPED_DIR
    record = read_manifest(folder)["heldout_transformers"]
    windows = read_windows(folder / HELDOUT_EVAL, record["window_tokens"])
    return math.exp(heldout_nll(llm, windows)), record["perplexity"]
