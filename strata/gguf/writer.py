"""Write a GGUF model tensor by tensor, so a file larger than RAM never has to be held whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import gguf
import numpy as np

from strata.gguf.ggml_types import register_q2_0


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: logical shape (row-major) and GGML type; `make()` returns its bytes when they are due."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    make: Callable[[], np.ndarray] | None  # None: all-zero bytes, skipped over (a hole in the file, no disk used)

    @property
    def n_bytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.ggml_type)]
        return int(np.prod(self.shape)) // block * size


def add_metadata(writer: gguf.GGUFWriter, metadata: dict[str, Any]) -> None:
    """Python values to GGUF types: bool, int (uint32, or int64 when it does not fit), float32, str, lists."""
    for key, value in metadata.items():
        if key == "general.architecture":
            continue  # the writer's constructor sets it
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value) if 0 <= value < 2**32 else writer.add_int64(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value) \
                and max(value) >= 2**31:
            # gguf's writer would guess INT32 for ints; hash constants need 64 bits.
            writer.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT64)
        elif isinstance(value, (list, tuple)):
            writer.add_array(key, list(value))
        else:
            raise TypeError(f"metadata {key}: cannot write {type(value).__name__}")


def write_gguf(path: str | Path, arch: str, metadata: dict[str, Any], tensors: Iterable[TensorSpec],
               extra: Callable[[gguf.GGUFWriter], None] | None = None, progress: bool = False) -> None:
    register_q2_0()
    tensors = list(tensors)
    writer = gguf.GGUFWriter(str(path), arch)
    add_metadata(writer, metadata)
    if extra is not None:
        extra(writer)
    for t in tensors:
        qtype = gguf.GGMLQuantizationType(t.ggml_type)
        writer.add_tensor_info(t.name, _byte_shape(t), np.dtype(np.uint8), t.n_bytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    bar = _progress_bar(tensors, progress)
    for t in tensors:
        if t.make is None:
            _skip_zero_tensor(writer, t)
            bar.update(t.n_bytes)
            continue
        data = np.ascontiguousarray(t.make()).view(np.uint8)
        if data.nbytes != t.n_bytes:
            raise ValueError(f"tensor {t.name}: made {data.nbytes} bytes, its shape and type need {t.n_bytes}")
        writer.write_tensor_data(data.reshape(_byte_shape(t)))
        bar.update(data.nbytes)
    bar.close()
    writer.close()


def _skip_zero_tensor(writer: gguf.GGUFWriter, t: TensorSpec) -> None:
    """Leave `t`'s bytes as a hole: seek past them and extend the file, as write_tensor_data would have written."""
    fout = writer.fout[0]
    writer.tensors[0].pop(t.name)
    writer.write_padding(fout, fout.tell())
    end = fout.tell() + t.n_bytes
    end += writer.ggml_pad(t.n_bytes, writer.data_alignment) - t.n_bytes
    fout.truncate(end)
    fout.seek(end)


def _byte_shape(t: TensorSpec) -> tuple[int, ...]:
    # GGUFWriter converts byte shapes back to logical ones for block types; floats are given by element.
    qtype = gguf.GGMLQuantizationType(t.ggml_type)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return (*t.shape[:-1], t.shape[-1] // block * size)


def _progress_bar(tensors: list[TensorSpec], enabled: bool):
    from tqdm import tqdm

    return tqdm(total=sum(t.n_bytes for t in tensors), unit="B", unit_scale=True, desc="writing", disable=None if enabled else True)
