"""The int8 and fp16 matrix rates behind `bench moe-prefill`'s floor, at several shapes and both B layouts: is the
floor's one shape (16384 x 2560 x 2560, torch._int_mm) near the best rate this GPU reaches?"""

import torch

from strata.bench.ceilings import Timer


def rate(fn, ops: float, timer: Timer) -> float:
    fn()  # warm: cuBLAS picks its kernel
    return ops / (min(timer(fn, 10) for _ in range(3)) * 1e-3) / 1e12


def main() -> None:
    timer = Timer(torch.device("cuda"))
    print(f"{'m x k x n':>22} {'int8 row-major B':>17} {'int8 col-major B':>17} {'fp16':>8}  (TOPS / TFLOP/s)")
    for m, k, n in [(16384, 2560, 2560), (16384, 2560, 1280), (8192, 8192, 8192), (16384, 16384, 8192),
                    (4096, 2560, 640), (32768, 2560, 640)]:
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
        b = torch.randint(-127, 128, (k, n), dtype=torch.int8, device="cuda")
        cols = b.t().contiguous().t()
        a16, b16 = a.half(), b.half()
        ops = 2.0 * m * k * n
        print(f"{m:>8} x {k:>5} x {n:>5} {rate(lambda: torch._int_mm(a, b), ops, timer):17.1f} "
              f"{rate(lambda: torch._int_mm(a, cols), ops, timer):17.1f} {rate(lambda: a16 @ b16, ops, timer):8.1f}")


if __name__ == "__main__":
    main()
