"""A copy plan (engine/copy_runs.py) handed to the GPU's copy engines: one cudaMemcpy2DAsync a record, on a stream.

Why not torch: a strided host-to-device `copy_` makes torch stage a contiguous device buffer and launch a kernel to
scatter it (and costs ~11 us of host time a call); cudaMemcpy2DAsync writes the strided rows itself, from pinned
memory, with no SM. Torch exposes no binding for it, so it is called through ctypes on the CUDA runtime the process
already loaded (found in /proc/self/maps: the same library, context and current device as torch's), else through
the driver's cuMemcpy2DAsync (libcuda is always loaded once CUDA runs); where neither is found (or off Linux) the
plan runs through torch's strided copies (`copy_runs.apply_plan`), the same bytes.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import torch

from strata.engine.copy_runs import DST, HEIGHT, PART, SRC, WIDTH, apply_plan
from strata.errors import StrataError

HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice
MEMORY_HOST, MEMORY_DEVICE = 1, 2  # CUmemorytype


class _Memcpy2D(ctypes.Structure):
    """The driver's CUDA_MEMCPY2D."""

    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t),
                ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t), ("dstMemoryType", ctypes.c_int),
                ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
                ("dstPitch", ctypes.c_size_t), ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]


def _loaded(name: str) -> str | None:
    """The path of a shared library this process has loaded whose file name starts with `name`."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                m = re.search(r"(/\S*/" + re.escape(name) + r"[^/\s]*)$", line.strip())
                if m:
                    return m.group(1)
    except OSError:
        return None
    return None


class CopyEngine:
    """`copy(dst_ptr, dst_pitch, src_ptr, src_pitch, width, height, stream_handle)` through the loaded runtime or
    driver; `CopyEngine.find()` is None where neither can be called."""

    def __init__(self, library: str, runtime: bool):
        self.library, self.runtime = library, runtime
        lib = ctypes.CDLL(library)
        if runtime:
            self._fn = lib.cudaMemcpy2DAsync
            self._fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                 ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        else:
            self._fn = lib.cuMemcpy2DAsync_v2
            self._fn.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]
            self._params = _Memcpy2D(srcMemoryType=MEMORY_HOST, dstMemoryType=MEMORY_DEVICE)
        self._fn.restype = ctypes.c_int

    @classmethod
    def find(cls) -> "CopyEngine | None":
        for name, runtime in (("libcudart.so", True), ("libcuda.so", False)):
            path = _loaded(name)
            if path is not None:
                try:
                    return cls(path, runtime)
                except (OSError, AttributeError):
                    continue
        return None

    def name(self) -> str:
        return ("cudaMemcpy2DAsync" if self.runtime else "cuMemcpy2DAsync") + " in " + self.library.rsplit("/", 1)[-1]

    def copy(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, stream: int) -> None:
        if self.runtime:
            code = self._fn(dst, dst_pitch, src, src_pitch, width, height, HOST_TO_DEVICE, stream)
        else:
            p = self._params
            p.srcHost, p.srcPitch, p.dstDevice, p.dstPitch, p.WidthInBytes, p.Height = (src, src_pitch, dst, dst_pitch,
                                                                                        width, height)
            code = self._fn(ctypes.byref(p), stream)
        if code != 0:
            raise StrataError(f"{self.name()}: error {code} copying {height} x {width} bytes to the expert slots")


_ENGINE: list = []  # the process's CopyEngine (or None), looked up once


def copy_engine() -> CopyEngine | None:
    if not _ENGINE:
        _ENGINE.append(CopyEngine.find() if torch.cuda.is_available() else None)
    return _ENGINE[0]


def run_plan(slots: torch.Tensor, sources: tuple, plan: np.ndarray, stream, engine: CopyEngine | None) -> str:
    """Queue the plan's copies on `stream` through `engine` (None: torch's strided copies on the current stream);
    says which form ran. The addresses: the slots' first byte plus the record's offset, each part's likewise."""
    if engine is None:
        apply_plan(slots, sources, plan, non_blocking=slots.is_cuda)
        return "torch"
    base, pitch = slots.data_ptr(), slots.stride(0) * slots.element_size()
    addresses = [p.data_ptr() for p in sources]
    handle = stream.cuda_stream
    for part, d, s, width, height in plan[:, [PART, DST, SRC, WIDTH, HEIGHT]].tolist():
        engine.copy(base + d, pitch, addresses[part] + s, width, width, height, handle)
    return engine.name()
