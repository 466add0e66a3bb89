"""Device-to-device copy bandwidth of this GPU (2 GiB, mean of 20 copies
after 3 warm-ups, bytes read + written). Prints `d2d_copy_tb_s N`. Staged
to the GPU machine by tools/gpu/stage.sh; batch-1 decode is quoted against
it (weight bytes per step / this bandwidth)."""
import time

import torch

x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
t = time.time()
for _ in range(20):
    y.copy_(x)
torch.cuda.synchronize()
dt = (time.time() - t) / 20
print(f"d2d_copy_tb_s {2 * x.numel() / dt / 1e12:.3f}")
