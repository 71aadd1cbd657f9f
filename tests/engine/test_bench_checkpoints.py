"""`strata bench checkpoints` on tiny models: it runs, restores, and checks the restored path (no timings asserted)."""

from __future__ import annotations

import pytest

from strata.cli import main
from strata.models.synthetic import make_model


@pytest.mark.parametrize("arch, kv", [("qwen3next", "float16")])  # hybrid: KV cells and GDN states
def test_bench_checkpoints_checks_the_restored_path(model_dir, capsys, arch, kv):
    path = model_dir / f"bench-ckpt-{arch}.gguf"
    if not path.exists():
        make_model(path, arch=arch, preset="tiny", quant="Q8_0")
    code = main(["bench", "checkpoints", str(path), "--device", "cpu", "--kv-dtype", kv, "--prompt-tokens", "40",
                 "--follow-tokens", "5", "--reps", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "restored == live bit for bit: yes" in out and "for 40 tokens" in out
    assert "ms (its host memory allocated afresh)" in out
