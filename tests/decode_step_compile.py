"""Compile the decode step's Triton kernels for sm_90a (run as a script without ``TRITON_INTERPRET``: the
interpreter runs kernels as Python, so a branch it never takes, such as programmatic dependent launch's wait, is
never compiled there): the FoX decode kernel at every combination of the flags its launcher passes, its merge kernel
and the few-row GEMV, all as a Hopper GPU launches them (``PDL``). Prints one line per kernel compiled."""

from __future__ import annotations

import itertools

import torch

from evalsuite.bench.sass import compile_jit
from evalsuite.kernels.forgetting.common import DECODE_CONFIG
from evalsuite.kernels.forgetting.decode import _decode_kernel, _merge_kernel
from evalsuite.kernels.gemv.kernel import GPU_CONFIGS, _few_row_linear_kernel


def main() -> None:
    block_n, warps, stages = DECODE_CONFIG
    for has_c, append, n_rows, has_ks in itertools.product((True, False), (True, False), (0, 2), (True, False)):
        if n_rows and not append:
            continue
        flags = {"HAS_C": has_c, "HAS_KS": has_ks, "HAS_KL": append, "APPEND": append, "HAS_LF": append and has_c,
                 "N_ROWS": n_rows, "HEAD_DIM": 64, "BLOCK_M": 16, "BLOCK_N": block_n, "UPCAST": False,
                 "PDL": True}  # fmt: skip
        compile_jit(_decode_kernel, flags, warps, stages)
        print("compiled decode", has_c, append, n_rows, has_ks)
    compile_jit(_merge_kernel, {"HEAD_DIM": 64, "BLOCK_S": 16, "PDL": True}, 1, 1)
    print("compiled merge")
    cfg = GPU_CONFIGS[torch.bfloat16]
    for has_bias in (True, False):
        flags = {"HAS_BIAS": has_bias, "ROWS": 16, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "UPCAST": False,
                 "PREC": "tf32", "PDL": True}  # fmt: skip
        types = {"X": "*bf16", "W": "*bf16", "Bias": "*bf16", "Y": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
        compile_jit(_few_row_linear_kernel, flags, cfg.num_warps, cfg.num_stages, types=types)
        print("compiled gemv", has_bias)


if __name__ == "__main__":
    main()
