"""What the decode-step kernel tests share: the device, how far the interpreter's rounding may sit, random inputs."""

import torch

from tests.kernels import DEVICE

# Triton's interpreter rounds float32 to bf16/fp16 by truncation (compiled kernels round to nearest even): on the
# CPU a result may sit one more step of the output dtype away from torch's.
STEPS = 1 if DEVICE == "cuda" else 2


def ulp(dtype):
    return 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10


def rand(shape, seed, dtype, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(DEVICE)
