"""One projection of a layer's routed experts as the kernels read it: GGUF blocks [E, rows, row_bytes] in one tensor."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from strata.errors import StrataError
from strata.kernels.moe.decode import DecodeSpec, decode_spec
from strata.quant import dequantize, get_format


@dataclass(frozen=True)
class ExpertMatrix:
    raw: torch.Tensor  # uint8 [E, rows, row_bytes], contiguous
    qtype: int
    rows: int  # outputs per expert
    cols: int  # inputs per expert (the dot length)

    @classmethod
    def of(cls, weight) -> "ExpertMatrix":
        """From anything with .raw (uint8 bytes), .ggml_type and .shape (E, rows, cols): a QuantWeight of a stack."""
        n_experts, rows, cols = weight.shape
        row_bytes = get_format(weight.ggml_type).row_bytes(cols)
        raw = weight.raw
        if raw.dtype != torch.uint8 or raw.numel() != n_experts * rows * row_bytes:
            raise StrataError(f"expert tensor of shape {tuple(weight.shape)} needs {n_experts * rows * row_bytes} "
                              f"uint8 bytes, got {raw.numel()} of {raw.dtype}")
        return cls(raw.reshape(n_experts, rows, row_bytes).contiguous(), int(weight.ggml_type), rows, cols)

    @property
    def spec(self) -> DecodeSpec:
        return decode_spec(self.qtype)

    @property
    def n_experts(self) -> int:
        return self.raw.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.raw.shape[2]

    @property
    def expert_bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def expert_stride(self) -> int:
        """Bytes from one expert's first row to the next: expert_bytes when stacked, a slot's size over cache slots."""
        return self.raw.stride(0)

    def expert(self, e: int) -> torch.Tensor:
        """Expert e's weights, float32 [rows, cols] (the references)."""
        return dequantize(self.raw[e], self.qtype, (self.rows, self.cols))

    def check_dot_length(self, k: int) -> None:
        spec = self.spec
        if self.cols != k or not dot_length_fits(spec, k):
            raise StrataError(f"{spec.name} experts of {self.cols} inputs cannot take rows of {k} values (the kernels "
                              f"step 64 values at a time, whole {spec.block_size}-weight blocks)")
        if spec.scale_per_64 and (self.raw.data_ptr() % 2 or self.raw.stride(0) % 2):
            raise StrataError(f"{spec.name} experts must start at even addresses: the kernels read them as 16-bit words")


def dot_length_fits(spec: DecodeSpec, k: int) -> bool:
    """Whether the kernels can take dot products of length k: they step 64 values at a time over whole blocks."""
    return k % 64 == 0 and k % spec.block_size == 0


def gemv_length_fits(spec: DecodeSpec, k: int) -> bool:
    """Whether the decode GEMV kernels (gemv.py, wide_gemv.py) can take dot products of length k: they step whole
    32-weight units over whole blocks, so an expert of 32 hidden units (the default model's) is one unit."""
    return k % 32 == 0 and k % spec.block_size == 0


VARIANTS = "smhwro"  # the letters a shape may end with (Tiles)


@dataclass(frozen=True)
class Tiles:
    """The launch shape of the expert kernels: outputs per program (BN; features for the fused gate/up kernel),
    warps, Triton's pipeline stages, and the grouped rows per tile (BM; the grouping pads each expert's rows to a
    multiple of it). `down`: another shape for the fused path's down projection (same rows), else it takes this one.
    The fused Q2_0 kernels' variants, as letters after a shape (`VARIANTS`): `split` ("s"), two dots of 32 values a
    step instead of one of 64; `magic` ("m"), the int32 dots turned into floats by their MMA starting from a float's
    bits instead of a conversion per value (the same bytes); `fp16` ("h"), fp16 MMAs of the rounded activations
    against exactly decoded weights (no scaling per step; within the float64 bounds, not the same bytes); `wide`
    ("w", with "h"), two weight blocks (128 values) a step where the dot length is a multiple of 128; `half` ("r"),
    a tile whose rows past BM / 2 are padding (an expert's last) computes BM / 2 rows: at 16,384 tokens of the
    parity tool's skewed layer, 128-row tiles hold 17 % padding rows, 10.5 % with it (the same bytes a row); on
    the H200 its two kernels took 0.3-3.6 % less time, inside the path's run-to-run spread, so no default has it;
    `fp16_out` ("o", on the down shape), the down kernel's rows stored as fp16 instead of float32 for the combine
    (at 16,384 tokens 0.84 GB written and read back instead of 1.68; one more rounding, 2^-11, before the weighted
    sum: within the float64 bounds, not the same bytes; bf16's 2^-8 broke the tool's 2e-3 bound at 3.4e-3)."""

    bn: int
    warps: int
    stages: int
    rows: int = 64
    down: "Tiles | None" = None
    split: bool = False
    magic: bool = False
    fp16: bool = False
    wide: bool = False
    half: bool = False
    fp16_out: bool = False

    @classmethod
    def parse(cls, text: str) -> "Tiles":
        """"BNxWARPSxSTAGES" (64 rows per tile) or "BMxBNxWARPSxSTAGES", e.g. "128x8x2", "128x64x8x2"; then
        optionally "/BNxWARPSxSTAGES" for the fused down projection, e.g. "128x64x8x2/128x8x2"; letters after a
        shape: its variants ("s", "m", "h"; e.g. "32x4x2sm")."""
        first, _, down = text.partition("/")
        tiles = cls._parse_one(first, text)
        if down:
            d = cls._parse_one(down, text)
            if len(down.split("x")) == 4 and d.rows != tiles.rows:
                raise StrataError(f"tile config {text!r}: the down shape's rows must be the gate/up shape's")
            tiles = replace(tiles, down=replace(d, rows=tiles.rows))
        return tiles

    @classmethod
    def _parse_one(cls, part: str, text: str) -> "Tiles":
        part = part.strip().lower()
        letters = part[len(part.rstrip(VARIANTS)):]
        try:
            values = [int(v) for v in part.removesuffix(letters).split("x")]
            rows, (bn, warps, stages) = (64, values) if len(values) == 3 else (values[0], values[1:])
        except ValueError:
            raise StrataError(f"tile config {text!r}: expected [BMx]BNxWARPSxSTAGES[/BNxWARPSxSTAGES], "
                              "e.g. 128x8x2") from None
        if bn < 16 or bn & (bn - 1) or rows not in (64, 128) or warps not in (4, 8, 16) or not 1 <= stages <= 5:
            raise StrataError(f"tile config {text!r}: BM 64 or 128, BN a power of two >= 16, warps 4, 8 or 16, "
                              "stages 1 to 5")
        if "h" in letters and ("s" in letters or "m" in letters):
            raise StrataError(f"tile config {text!r}: the fp16 variant (h) has no int32 dots to split (s) or convert (m)")
        if "w" in letters and "h" not in letters:
            raise StrataError(f"tile config {text!r}: two blocks a step (w) is a form of the fp16 variant (h)")
        return cls(bn, warps, stages, rows, split="s" in letters, magic="m" in letters, fp16="h" in letters,
                   wide="w" in letters, half="r" in letters, fp16_out="o" in letters)

    @property
    def letters(self) -> str:
        return ("s" * self.split + "m" * self.magic + "h" * self.fp16 + "w" * self.wide + "r" * self.half
                + "o" * self.fp16_out)

    @property
    def same_bytes(self) -> bool:
        """Whether the fused kernels give the default's bytes under this shape: fp16 MMAs and fp16 rows round
        differently."""
        return not any(t.fp16 or t.fp16_out for t in (self, self.down) if t is not None)

    def __str__(self) -> str:
        own = f"{self.bn}x{self.warps}x{self.stages}" if self.rows == 64 else \
            f"{self.rows}x{self.bn}x{self.warps}x{self.stages}"
        own += self.letters
        if self.down is None:
            return own
        return f"{own}/{self.down.bn}x{self.down.warps}x{self.down.stages}{self.down.letters}"


# Q2_0's launch shapes from `bench moe-prefill --sweep` on the H200 (16,384 tokens, one layer): the int8 matmul at
# 64 outputs x 4 warps x 2 stages (the quantized path 19.3 -> 16.6 ms), the dense fp16 path at 128 x 8 x 3
# (37.7 -> 24.0 ms). The fused kernels of `fused_q2_0` (gate/up: 32 features = 64 weight rows a program; down: 64
# outputs) from session 5's sweep: 4 warps, 2 stages, two dots of 32 values a step ("32x4x2s/64x4x2s"): 14.56 ->
# 12.65 ms at 16K tokens, the same bytes. A fused shape here may be an fp16 one ("h") or of 128 rows: the grouping
# takes the gate/up shape's rows (prefill._group_rows) and prompt_work_bytes covers its buffers.
# Session 6's sweep: fp16 MMAs ("h") at 128 rows a tile, "128x32x4x3h/64x4x3h": 13.03 -> 6.66 ms at 16K tokens
# (2.31x mmq's 15.38; 3.46 -> 3.08 ms at 2K), within the float64 bounds (not the same bytes; the path is opt-in).
# Session 14: half tiles ("r") and the down rows stored as fp16 for the combine ("o"), "128x32x4x3hr/64x4x3hro":
# 6.58-6.69 -> 5.93-6.09 ms at 16K tokens (each twice in one process); then 8 warps over 64 features (gate/up) and
# 128 outputs (down), "128x64x8x3hr/128x8x3hro": 5.93-6.23 -> 5.69-5.72 ms at 16K, 3.56-3.72 -> 3.45-3.49 ms at 8K;
# within the bounds.
MEASURED_Q2_0 = {"mm": Tiles(64, 4, 2), "dense": Tiles(128, 8, 3),
                 "gate_up": Tiles(64, 8, 3, rows=128, fp16=True, half=True),
                 "down": Tiles(128, 8, 3, rows=128, fp16=True, half=True, fp16_out=True)}


def tile_config(kind: str, spec: DecodeSpec, n_out: int, on_gpu: bool, tiles: Tiles | None = None) -> Tiles:
    """The launch shape of the expert kernels ("mm", "gate_up", "down", "dense"); `tiles` overrides it (sweeps,
    tests). "gate_up" and "down" are the fused path's (its down is "mm" for the formats other than Q2_0).

    On a GPU, Q2_0 (decoded from code words, weights of the next step loaded ahead): the shapes the H200 sweep
    measured fastest (MEASURED_Q2_0; at 4 warps the fused gate/up kernel's two accumulators spill at 128 outputs).
    The other formats keep their first shape: 64 columns (32 for the fused gate/up kernel, whose two accumulators
    would otherwise spill), 8 warps, Triton's default 3 stages (checked by tests/kernels/moe/test_sm90_build.py).
    Under the interpreter: wide programs, since its cost is per operation.
    """
    if tiles is not None:
        return tiles
    if not on_gpu:
        return Tiles(min(256, max(32, 1 << (n_out - 1).bit_length())), 4, 1)
    if spec.scale_per_64:  # Q2_0: the H200 sweep at 16,384 tokens (BENCHMARKS, session 4's middle call)
        return MEASURED_Q2_0[kind]
    return Tiles(32 if kind == "gate_up" else 64, 8, 3)  # "down" of those formats runs the "mm" kernel
