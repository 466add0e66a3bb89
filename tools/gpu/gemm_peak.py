"""The bf16 GEMM peak of this GPU: torch.matmul of 8192^3, best of 20 after
3 warm-ups. Prints `gemm_bf16_tflops N`. Staged to the GPU machine by
tools/gpu/stage.sh; the prefill benchmarks report TFLOP/s against it."""
import time

import torch

a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
b = torch.randn_like(a)
for _ in range(3):
    a @ b
best = 1e9
for _ in range(20):
    torch.cuda.synchronize()
    t = time.time()
    a @ b
    torch.cuda.synchronize()
    best = min(best, time.time() - t)
print(f"gemm_bf16_tflops {2 * 8192**3 / best / 1e12:.1f}")
