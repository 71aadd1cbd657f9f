"""Per-position log-probability records (`STRATA_LOGPOS=FILE`): how the engine scored each token it read.

One TSV line per position: `pos  target  lp(target)  top1  lp(top1)` then K `id:logprob` pairs, most likely first,
all from the full-precision logits (log-softmax in float64, before temperature and penalties). Floats are written
with `repr`, so two runs that computed the same logits write the same bytes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from strata import switches
from strata.errors import StrataError

MAX_TOPK = 256


@dataclass(frozen=True)
class Record:
    pos: int
    target: int
    lp_target: float
    top1: int
    lp_top1: float
    top: tuple[tuple[int, float], ...]  # (id, logprob), most likely first

    def line(self) -> str:
        head = f"{self.pos}\t{self.target}\t{self.lp_target!r}\t{self.top1}\t{self.lp_top1!r}"
        return head + "".join(f"\t{i}:{lp!r}" for i, lp in self.top)

    @classmethod
    def parse(cls, line: str) -> Record:
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 5:
            raise ValueError(f"a record has at least 5 fields, got {len(fields)}")
        top = tuple((int(i), float(lp)) for i, lp in (field.split(":") for field in fields[5:]))
        return cls(int(fields[0]), int(fields[1]), float(fields[2]), int(fields[3]), float(fields[4]), top)


def score(logits: torch.Tensor, pos: int, target: int, top_k: int) -> Record:
    """The record of one position from its logits row [vocab]."""
    lp = torch.log_softmax(logits.detach().reshape(-1).to("cpu", torch.float64), dim=-1)
    values, ids = torch.topk(lp, max(1, min(top_k, lp.numel())))
    top = tuple(zip(ids.tolist(), values.tolist()))
    return Record(pos, int(target), float(lp[target]), top[0][0], top[0][1], top[:top_k])


def read_records(path: str | Path) -> dict[int, Record]:
    """Records by position; where a position was written twice (two requests), the last one counts."""
    records = {}
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = Record.parse(line)
            except ValueError as error:
                raise StrataError(f"{path}:{number}: not a logpos record ({error})") from None
            records[record.pos] = record
    return records


class LogposWriter:
    """Appends records to one file, a line at a time (flushed, so a crash leaves whole records)."""

    def __init__(self, path: str | Path, top_k: int):
        if not 0 <= top_k <= MAX_TOPK:
            raise StrataError(f"STRATA_LOGPOS_TOPK={top_k}: must be between 0 and {MAX_TOPK}")
        self.path, self.top_k = Path(path), top_k
        self._file = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, pos: int, target: int, logits: torch.Tensor) -> Record:
        record = score(logits, pos, target, self.top_k)
        with self._lock:
            self._file.write(record.line() + "\n")
            self._file.flush()
        return record


_writer: LogposWriter | None = None


def writer_from_switches() -> LogposWriter | None:
    """The process's writer when STRATA_LOGPOS is set, else None."""
    global _writer
    path = switches.get("STRATA_LOGPOS")
    if not path:
        return None
    if _writer is None or _writer.path != Path(path):
        _writer = LogposWriter(path, switches.get("STRATA_LOGPOS_TOPK"))
    return _writer
