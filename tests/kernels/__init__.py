"""Kernel tests: on a GPU they run the compiled kernels, elsewhere the same kernels under Triton's interpreter."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
