"""The static decode step with STRATA_PDL on the CPU (Triton's interpreter, the grid dependency instructions as
no-ops, CPU tensors taking the launch options through kernels/pdl.py's FORCE_ON_CPU): the step's one-launch kernels
take PDL, and the logits are the default step's byte for byte, in the resident step and behind an expert cache."""

import os

import pytest
import torch

from strata import switches
from strata.engine.engine import Engine, EngineConfig
from strata.kernels import pdl
from strata.models import layers

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="CPU tensors take Triton only interpreted")]
PROMPT = [5, 17, 99, 3]


def _logits(path, **options) -> torch.Tensor:
    engine = Engine(path, EngineConfig(device="cpu", dtype="bfloat16", decode_graphs="eager", **options))
    logits, out = engine.prefill(PROMPT), []
    for step in range(2):
        logits = engine.decode(int(logits[-1].argmax()), len(PROMPT) + step)
        out.append(logits.clone())
    return torch.cat(out)


@pytest.mark.parametrize("options", [dict(), dict(expert_cache=3)], ids=["resident", "cached-experts"])
def test_pdl_step_gives_the_default_bytes(tiny_moe, options, monkeypatch):
    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)
    monkeypatch.setattr(pdl, "FORCE_ON_CPU", True)
    modes = []
    real = pdl.mode_for  # what every launch's options ask (kernels/pdl.py's `launch_options`)
    monkeypatch.setattr(pdl, "mode_for", lambda t: modes.append(real(t)) or modes[-1])
    with switches.override(STRATA_PDL=0):
        default = _logits(tiny_moe, **options)
    assert modes and set(modes) == {0}
    for mode in (1, 3):
        modes.clear()
        with switches.override(STRATA_PDL=mode):
            assert torch.equal(_logits(tiny_moe, **options), default), mode
        assert len(modes) >= 4 * 2 and set(modes) == {mode}  # norms, routing, q/k store, attention: each step
