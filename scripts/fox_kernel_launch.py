"""One launch of the Forgetting Attention kernels on a GPU, for Nsight Compute (results/kernels/fox-profile/).

    ncu -c 1 -k regex:_fwd_kernel --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy python3 scripts/fox_kernel_launch.py fwd 64 gated

Arguments: ``fwd`` (the forward) or ``bwd`` (forward then backward: profile ``_bwd_dkdv_kernel`` or
``_bwd_dq_kernel``), the head dim, and ``gated`` or ``plain``. Shape: B = 4, T = 16384, H = 16, bf16.
"""

import sys

import torch
import torch.nn.functional as F

from evalsuite.kernels.forgetting import cumsum_over_time
from evalsuite.kernels.forgetting.forward import forgetting_attention_triton


def main(mode: str, head_dim: int, gated: bool, B: int = 4, T: int = 16384, H: int = 16) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, head_dim, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))  # fmt: skip
    log_f = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=g) + 4.0).requires_grad_()
    o = forgetting_attention_triton(q, k, v, cumsum_over_time(log_f) if gated else None)
    if mode == "bwd":
        o.backward(torch.randn_like(o))
    torch.cuda.synchronize()


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("fwd", "bwd") or sys.argv[3] not in ("gated", "plain"):
        sys.exit("usage: fox_kernel_launch.py fwd|bwd HEAD_DIM gated|plain")
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "gated")
