"""Open a GGUF model (one file or `-0000K-of-0000N` splits) as metadata plus memory-mapped tensors."""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import gguf

from strata.errors import StrataError
from strata.gguf.ggml_types import register_q2_0

SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: its GGML type, logical shape (row-major, last dim contiguous) and raw bytes (memory-mapped)."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 view of the file's bytes, shape [..., bytes_per_row]
    file: str

    @property
    def type_name(self) -> str:
        return gguf.GGMLQuantizationType(self.ggml_type).name

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


def split_paths(path: Path) -> list[Path]:
    """All shards of a split GGUF given any one of them, in order; [path] for a plain file."""
    match = SPLIT_NAME.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    shards = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [str(p) for p in shards if not p.exists()]
    if missing:
        raise StrataError(f"{path}: split GGUF is missing {len(missing)} of {count} shards, first {missing[0]}")
    return shards


def _field_value(field: gguf.ReaderField) -> Any:
    return field.contents()


class _CheckedReader(gguf.GGUFReader):
    """gguf's reader, with each tensor's type and extent checked before it is mapped, so errors can name it."""

    def __init__(self, path: Path, mode: str = "c"):
        self.source = path
        # Copy-on-write mapping: pages are shared with the page cache, and torch may wrap them without copying.
        super().__init__(path, mode=mode)

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        file_size = len(self.data)
        for field in fields:
            _, name_bytes, _, dims, raw_dtype, offset = field.parts
            name = bytes(name_bytes).decode("utf-8", errors="replace")
            type_id = int(raw_dtype[0])
            if type_id not in gguf.GGMLQuantizationType._value2member_map_:
                raise StrataError(f"{self.source}: tensor {name} has unsupported quant type (ggml type id {type_id})")
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
            end = start_offs + int(offset[0]) + int(np.prod(dims)) * size // block
            if end > file_size:
                raise StrataError(f"{self.source}: truncated: tensor {name} ends at byte {end:,} but the file has {file_size:,}")
        super()._build_tensors(start_offs, fields)


def _open_reader(path: Path) -> gguf.GGUFReader:
    if not path.exists():
        raise StrataError(f"{path}: no such file")
    if path.stat().st_size < 24:
        raise StrataError(f"{path}: not a GGUF file (only {path.stat().st_size} bytes)")
    try:
        try:
            return _CheckedReader(path)
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise StrataError(f"{path}: cannot map the file ({exc.strerror})") from None
            # A private (copy-on-write) mapping larger than memory is refused (the 28.8 GB n-gram table shard on a
            # smaller host); a read-only one is not, and nothing writes to the weights.
            return _CheckedReader(path, mode="r")
    except ValueError as exc:
        text = str(exc)
        if "magic" in text:
            raise StrataError(f"{path}: not a GGUF file (bad magic)") from None
        raise StrataError(f"{path}: corrupt or truncated GGUF ({text})") from None
    except (IndexError, OverflowError, UnicodeDecodeError, KeyError, MemoryError) as exc:
        raise StrataError(f"{path}: corrupt or truncated GGUF header ({type(exc).__name__}: {exc})") from None


def _tensors_of(reader: gguf.GGUFReader, path: Path) -> dict[str, TensorInfo]:
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        raw = t.data.view(np.uint8)
        raw = raw.reshape(*shape[:-1], -1) if len(shape) > 1 else raw.reshape(-1)
        tensors[t.name] = TensorInfo(t.name, int(t.tensor_type), shape, raw, str(path))
    return tensors


class GGUFModelFile:
    """A GGUF model: `metadata` (key -> Python value) and `tensors` (name -> TensorInfo), across split shards."""

    def __init__(self, path: str | os.PathLike):
        register_q2_0()
        self.path = Path(path)
        self.shards = split_paths(self.path)
        readers = [_open_reader(p) for p in self.shards]
        self.metadata: dict[str, Any] = {}
        for name, field in readers[0].fields.items():
            if not name.startswith("GGUF."):
                self.metadata[name] = _field_value(field)
        self.tensors: dict[str, TensorInfo] = {}
        for reader, shard in zip(readers, self.shards):
            for name, info in _tensors_of(reader, shard).items():
                if name in self.tensors:
                    raise StrataError(f"{shard}: tensor {name} appears in more than one shard")
                self.tensors[name] = info
        expected = self.metadata.get("split.tensors.count")
        if expected is not None and expected != len(self.tensors):
            raise StrataError(f"{self.path}: split GGUF lists {expected} tensors but its shards hold {len(self.tensors)}")

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise StrataError(f"{self.path}: metadata field general.architecture is missing")
        return arch

    def tensor(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise StrataError(f"{self.path}: tensor {name} is missing")
        return info

    def field(self, key: str, default: Any = ..., kind: type | tuple[type, ...] | None = None) -> Any:
        """A metadata value; a missing required key or a value of the wrong kind is a one-line StrataError."""
        if key not in self.metadata:
            if default is ...:
                raise StrataError(f"{self.path}: metadata field {key} is missing")
            return default
        value = self.metadata[key]
        if kind is not None and not isinstance(value, kind):
            raise StrataError(f"{self.path}: metadata field {key} has an unexpected value {value!r}")
        return value

    @property
    def n_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.shards)
