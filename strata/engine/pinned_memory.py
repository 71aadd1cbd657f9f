"""How this process pins host memory: torch's pinned allocations mapped and touched from several threads, then
registered with CUDA (torch's `pinned_use_cuda_host_register`), instead of one cudaHostAlloc that maps and locks
every page on the calling thread.

Pinned memory is allocated while a user waits: a hybrid model's cache is checkpointed at each prompt's end into fresh
pinned memory (engine/checkpoints.py), and the expert store is pinned at load. H200 host, session 12
(`tools/device/pinned_probe.py`, 150 tensors copied into slabs): 190 MB 89 -> 33 ms, 900 MB 623 -> 172 ms; the
full-size qwen4exp's checkpoint at the end of a 4K prompt 128 -> 42 ms, of a 32K one 688 -> 161 ms.
A user's own PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) that says anything about pinned memory is left as set.
"""

from __future__ import annotations

import os

import torch

REGISTER_THREADS = 8


def settings(cpu_count: int | None) -> str:
    threads = max(1, min(REGISTER_THREADS, cpu_count or 1))
    return f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}"


def apply(text: str) -> bool:
    """Set torch's allocator settings `text` for this process; False where this torch cannot at run time."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or \
        getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if setter is None:
        return False
    setter(text)
    return True


def pin_from_threads() -> bool:
    """Apply the settings for this process (before its first pinned allocation); False where the user's
    configuration already chooses, or where this torch has no way to set them at run time."""
    users = [os.environ.get(name, "") for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")]
    if any("pinned" in conf for conf in users):
        return False
    # The user's other settings given again with ours, should this torch's parser start from its defaults; one it
    # will not take at run time costs only the faster pinning, never the engine.
    try:
        return apply(",".join([conf for conf in users if conf] + [settings(os.cpu_count())]))
    except (RuntimeError, ValueError, TypeError):
        return False
