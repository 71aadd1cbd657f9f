"""Host data onto the device without a host wait: a static step's tokens and positions through one pinned buffer
(`TokenUpload`), and small tables made on the host (`upload`)."""

from __future__ import annotations

import torch


def upload(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device`, the copy queued behind the stream's work: pinned first, since a pageable
    copy would synchronize the stream (draining the queued steps). Off CUDA the tensor itself."""
    return table.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else table


class TokenUpload:
    """Tokens and their positions copied from a pinned host buffer into device tensors without a host wait: no
    tensor made per step (the buffer is written through numpy), and one CUDA event, recorded again each upload, that
    the next upload waits on before it rewrites the buffer."""

    def __init__(self, rows: int, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.host = torch.zeros(2, rows, dtype=torch.long, pin_memory=self.cuda)
        self.numpy = self.host.numpy()
        self.uploaded: torch.cuda.Event | None = None

    def wait(self) -> None:
        """Until the last upload (and what was queued before its event) has left the host buffers."""
        if self.uploaded is not None:
            self.uploaded.synchronize()

    def __call__(self, tokens: list[int], start: int, ids: torch.Tensor, positions: torch.Tensor) -> None:
        """tokens into ids[:n], positions start.. into positions[:n] (n = len(tokens)), queued on the stream."""
        n = len(tokens)
        self.wait()
        self.numpy[0, :n] = tokens
        self.numpy[1, :n] = range(start, start + n)
        ids[:n].copy_(self.host[0, :n], non_blocking=True)
        positions[:n].copy_(self.host[1, :n], non_blocking=True)
        if self.cuda:
            self.uploaded = self.uploaded or torch.cuda.Event()
            self.uploaded.record()
