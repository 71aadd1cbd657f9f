"""A greedy bf16 decode on the CPU with the fused kernels on or off (models/layers.py FUSED_ON_CPU: Triton's
interpreter takes them as a GPU would), shared by the tests that compare the two paths."""

import torch

from strata.engine.engine import Engine, EngineConfig
from strata.models import layers


def greedy_bf16(path, fused: bool, prompt: list[int], steps: int, **options):
    """(engine, tokens, logits of every decode step) of `steps` greedy tokens after `prompt`."""
    layers.FUSED_ON_CPU = fused
    try:
        engine = Engine(path, EngineConfig(device="cpu", dtype="bfloat16", **options))
        logits, tokens, out = engine.prefill(prompt), [], []
        for step in range(steps):
            tokens.append(int(logits[-1].argmax()))
            logits = engine.decode(tokens[-1], len(prompt) + step)
            out.append(logits.clone())
        return engine, tokens, torch.cat(out)
    finally:
        layers.FUSED_ON_CPU = False
