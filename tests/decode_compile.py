"""Compile the FoX decode kernel for sm_90a at every combination of the flags its launcher passes (run as a script
without ``TRITON_INTERPRET``: the interpreter runs kernels as Python, so a branch it never takes is never compiled).
Prints one line per combination."""

from __future__ import annotations

import itertools

from evalsuite.bench.sass import compile_jit
from evalsuite.kernels.forgetting.common import DECODE_CONFIG
from evalsuite.kernels.forgetting.decode import _decode_kernel


def main() -> None:
    block_n, warps, stages = DECODE_CONFIG
    for has_c, append, n_rows, has_ks in itertools.product((True, False), (True, False), (0, 2), (True, False)):
        if n_rows and not append:
            continue
        flags = {"HAS_C": has_c, "HAS_KS": has_ks, "HAS_KL": append, "APPEND": append, "HAS_LF": append and has_c,
                 "N_ROWS": n_rows, "HEAD_DIM": 64, "BLOCK_M": 16, "BLOCK_N": block_n, "UPCAST": False}  # fmt: skip
        compile_jit(_decode_kernel, flags, warps, stages)
        print("compiled", has_c, append, n_rows, has_ks)


if __name__ == "__main__":
    main()
