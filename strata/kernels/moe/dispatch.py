"""Where the expert kernels run: Triton for CUDA tensors, the torch references elsewhere.

Every op has three names: `op` (this dispatcher), `op_triton` (the kernel launch, which the CPU tests call under
TRITON_INTERPRET=1) and `op_ref` (the torch reference).
"""

import torch


def use_triton(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda
