"""Kernel tests: on a GPU they run the compiled kernels, elsewhere the same kernels under Triton's interpreter."""

import torch

import strata.kernels  # noqa: F401  (switches the interpreter on without a GPU, before any test imports Triton)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
