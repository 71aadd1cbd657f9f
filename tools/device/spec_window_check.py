"""On the GPU: is a verify window row-for-row what plain decoding computes? (issue 10: greedy speculation must give
plain greedy's tokens, byte for byte, which needs every kernel of the window to treat a row as it treats a lone one.)

For each small model and activation dtype: plain decoding (captured graphs, and step by step) feeds 4 tokens one at a
time; a fresh engine reads the same 4 tokens as one verify window (`SpecDecoder.verify`). Prints, per row, the max
difference of the window's logits against each plain run, relative to the largest logit, and whether the argmax
agrees.

    python3 tools/device/spec_window_check.py MODEL_DIR [DEVICE] [PRESET]   (cuda, small)
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

models = Path(sys.argv[1])
device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
preset = sys.argv[3] if len(sys.argv) > 3 else "small"
prompt = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(0)).tolist()
window = [11, 423, 77, 199]
print("| model | dtype | plain | rows max rel diff | argmax agree |")
print("|---|---|---|---|---|")
for arch, mtp in (("qwen3moe", {}), ("qwen3next", {"nextn_layers": 1})):
    path = models / f"window-{arch}-{preset}-Q4_K.gguf"
    if not path.exists():
        make_model(path, arch=arch, preset=preset, quant="Q4_K" if preset != "tiny" else "Q8_0", **mtp)
    for dtype in ("bfloat16", "float32"):
        verifier = Engine(path, EngineConfig(device=device, dtype=dtype, n_ctx=512, spec=4, decode_graphs="off"))
        verifier.prefill(prompt)
        rows = verifier.spec.verify(window, len(prompt)).float()
        for graphs in (("on" if device == "cuda" else "eager"), "off"):
            plain = Engine(path, EngineConfig(device=device, dtype=dtype, n_ctx=512, decode_graphs=graphs))
            plain.prefill(prompt)
            # decode() returns a view of a static buffer, valid until the next step: keep a copy of each.
            singles = torch.cat([plain.decode(t, len(prompt) + i).float().reshape(1, -1).clone()
                                 for i, t in enumerate(window)])
            diff = ((rows - singles).abs().amax(-1) / singles.abs().amax(-1)).tolist()
            agree = (rows.argmax(-1) == singles.argmax(-1)).sum().item()
            print(f"| {arch} | {dtype} | graphs {graphs} | {' '.join(f'{d:.1e}' for d in diff)} | {agree}/4 |")
