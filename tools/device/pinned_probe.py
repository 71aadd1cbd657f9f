"""On the GPU: what copying a conversation checkpoint into pinned host memory costs the host, by the way it allocates.

Session 12's probe of a 4K prompt on the full-size qwen4exp spent ~150 ms more at the prompt's end when its ids were
new than when the same prompt came again: a hybrid model's cache is checkpointed at each prompt's end
(engine/checkpoints.py), ~150 tensors into fresh pinned memory, unless the same tokens are already saved. This times,
for snapshots of ~150 tensors of 190 MB (a 4K prompt's) and 900 MB (32K), from an emptied pinned cache:
  per-tensor  a pinned allocation each, the copy queued (the store before session 12);
  slabs       checkpoints.HostCopies (a few doubling slabs, views into them);
  again       the same once more without emptying torch's pinned cache (what recycling gives);
then the same two ways with torch's `pinned_use_cuda_host_register` (pages registered from 8 threads), and whether a
pinned allocation on a second thread stalls the main thread's kernel launches.

Usage: python3 tools/device/pinned_probe.py
"""

import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine import pinned_memory  # noqa: E402
from strata.engine.checkpoints import HostCopies  # noqa: E402

N_TENSORS = 150


def empty_pinned_cache() -> None:
    for name in ("_accelerator_emptyHostCache", "_host_emptyCache"):
        if hasattr(torch._C, name):
            getattr(torch._C, name)()
            return


def tensor_sizes(total: int, seed: int) -> list[int]:
    """~N_TENSORS sizes, log-uniform from 64 KB to 8 MB, scaled to `total` bytes (multiples of 256)."""
    raw = np.exp(np.random.default_rng(seed).uniform(np.log(64e3), np.log(8e6), N_TENSORS))
    return [int(s) // 256 * 256 for s in raw / raw.sum() * total]


def per_tensor(sources):
    out = []
    for t in sources:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        out.append(host)
    return out


def slabs(sources):
    copies = HostCopies()
    return [copies.copy(t) for t in sources]


def timed(fn, sources, empty: bool = True) -> tuple[float, list]:
    if empty:
        empty_pinned_cache()
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = fn(sources)
    host = time.perf_counter() - started
    torch.cuda.synchronize()
    return host, out


def launches(n: int = 3000) -> float:
    """Host ms to queue n tiny kernels."""
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(n):
        x.add_(1.0)
    queued = time.perf_counter() - started
    torch.cuda.synchronize()
    return queued * 1e3


def stall_check(total: int) -> None:
    alone = launches()
    done = []
    worker = threading.Thread(target=lambda: done.append(timed(slabs, sources_of(total, 99), empty=True)[0]))
    worker.start()
    beside = launches()
    worker.join()
    print(f"  3,000 launches: {alone:.1f} ms alone, {beside:.1f} ms while a second thread allocated and copied "
          f"{total / 1e6:.0f} MB in slabs ({done[0] * 1e3:.1f} ms there)")


def sources_of(total: int, seed: int) -> list[torch.Tensor]:
    return [torch.randint(0, 255, (s,), dtype=torch.uint8, device="cuda") for s in tensor_sizes(total, seed)]


def table(label: str) -> None:
    print(f"\n{label}:")
    for total in (190_000_000, 900_000_000):
        sources = sources_of(total, total % 97)
        cells = []
        for name, fn in (("per-tensor", per_tensor), ("slabs", slabs)):
            first, out = timed(fn, sources)
            del out
            again, out = timed(fn, sources, empty=False)
            ok = all(torch.equal(h.cuda(), s) for h, s in zip(out, sources))
            del out
            same = "equal" if ok else "DIFFER"
            cells.append(f"{name} {first * 1e3:7.1f} ms (again {again * 1e3:6.1f}, bytes {same})")
        print(f"  {total / 1e6:4.0f} MB in {len(sources)} tensors: " + "; ".join(cells))


def main() -> None:
    torch.cuda.init()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    table("default pinned allocator")
    stall_check(190_000_000)
    try:
        applied = pinned_memory.apply(pinned_memory.settings(8))
    except Exception as e:  # noqa: BLE001 - a probe: say why and stop
        applied, why = False, f"{type(e).__name__}: {e}"
    else:
        why = "no run-time setter in this torch"
    if not applied:
        print(f"\npinned_use_cuda_host_register not settable here: {why}")
        return
    table("pinned_use_cuda_host_register, 8 threads")


if __name__ == "__main__":
    main()
