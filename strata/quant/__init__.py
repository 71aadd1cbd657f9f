"""GGML block quant formats: a registry, vectorized torch dequantization, and the few quantizers Strata needs."""

from strata.quant.random_blocks import random_blocks
from strata.quant.registry import FORMATS, QuantFormat, dequantize, get_format, quantize

__all__ = ["FORMATS", "QuantFormat", "dequantize", "get_format", "quantize", "random_blocks"]
