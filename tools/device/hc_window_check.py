"""On the GPU: is a qwen4exp verify window's row the one-token step at that position, bit for bit, with the
hyper-connection kernels (kernels/hc) in both? The tiny model in bfloat16: after the same prompt, one engine reads
WINDOW tokens as a verify window (keep_row_states, rows_as_steps, as engine/spec.py's `verify`), another as WINDOW
eager one-token steps; each row's logits are compared. Run it again with STRATA_HC_TORCH=1 for the torch reads.
Exit 1 when a row differs.

    python3 tools/device/hc_window_check.py DIR      (on the CPU: torch; with TRITON_INTERPRET=1, the kernels)
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine.context import ForwardContext  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.models import layers  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402
from strata.models.weights import rows_as_steps  # noqa: E402

WINDOW = 4


def main(out: Path) -> int:
    path = make_model(out / "tiny-window.gguf", arch="qwen4exp", preset="tiny", quant="Q8_0")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        layers.FUSED_ON_CPU = True  # the kernels interpreted, as the GPU runs them
    config = EngineConfig(device=device, dtype="bfloat16", decode_graphs="off")
    prompt = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    window = [7, 99, 250, 3][:WINDOW]
    steps = Engine(path, config)
    steps.prefill(prompt)
    rows = torch.cat([steps.decode(t, len(prompt) + j)[-1:] for j, t in enumerate(window)])
    windowed = Engine(path, config)
    windowed.prefill(prompt)
    ctx = ForwardContext(windowed.kv, len(prompt), WINDOW, want_all_logits=True, keep_row_states=True)
    with rows_as_steps():
        got = windowed.model.forward(torch.tensor(window, device=windowed.device), ctx)
    equal = sum(torch.equal(got[r], rows[r]) for r in range(WINDOW))
    worst = ((got.double() - rows.double()).abs().max() / rows.double().abs().max()).item()
    on_kernels = (device == "cuda" or layers.FUSED_ON_CPU) and not switches.get("STRATA_HC_TORCH")
    reads = "kernels/hc" if on_kernels else "torch"
    print(f"qwen4exp tiny bf16 on {device}, hyper-connection reads {reads}: {equal}/{WINDOW} window rows bit-equal to "
          f"one-token steps, worst relative error {worst:.1e}")
    return 0 if equal == WINDOW else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
