"""On the GPU: where a decode token's time goes (torch.profiler over a few greedy steps), by device and host time.
Usage: python3 tools/device/profile_decode.py MODEL.gguf [STEPS]"""

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402


def main() -> None:
    path, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
    engine = Engine(path, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=1024))
    ids = torch.randint(0, engine.model.config.vocab_size, (512,), generator=torch.Generator().manual_seed(0)).tolist()
    logits = engine.prefill(ids)
    position = len(ids)

    def step():
        nonlocal logits, position
        token = int(logits[-1].argmax())
        logits = engine._forward([token], position, all_logits=False)
        position += 1

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    print(f"decode {steps / (time.perf_counter() - started):.2f} tok/s without the profiler")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(table.table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
    print(table.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))


if __name__ == "__main__":
    main()
