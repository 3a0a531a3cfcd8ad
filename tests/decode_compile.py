"""Compile the FoX decode kernel for sm_90a at every combination of the flags its launcher passes (run as a script
without ``TRITON_INTERPRET``: the interpreter runs kernels as Python, so a branch it never takes is never compiled).
Prints one line per combination."""

from __future__ import annotations

import itertools

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from evalsuite.kernels.forgetting.common import DECODE_CONFIG
from evalsuite.kernels.forgetting.decode import _decode_kernel

POINTERS = {"KS": "*i32", "KL": "*i64", "CQ": "*fp32", "CK": "*fp32", "LF": "*fp32", "O_PART": "*fp32",
            "LSE_PART": "*fp32"}  # fmt: skip


def main() -> None:
    block_n, warps, stages = DECODE_CONFIG
    for has_c, append, n_rows, has_ks in itertools.product((True, False), (True, False), (0, 2), (True, False)):
        if n_rows and not append:
            continue
        flags = {"HAS_C": has_c, "HAS_KS": has_ks, "HAS_KL": append, "APPEND": append, "HAS_LF": append and has_c,
                 "N_ROWS": n_rows, "HEAD_DIM": 64, "BLOCK_M": 16, "BLOCK_N": block_n, "UPCAST": False}  # fmt: skip
        signature = {}
        for name in _decode_kernel.arg_names:
            if name in flags:
                signature[name] = "constexpr"
            elif name.startswith("stride_") or name in ("Tq", "Tk", "H", "keys_per_split"):
                signature[name] = "i32"
            elif name in ("sm_scale", "mult"):
                signature[name] = "fp32"
            else:
                signature[name] = POINTERS.get(name, "*bf16")
        source = ASTSource(fn=_decode_kernel, signature=signature, constexprs=flags)
        triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
        print("compiled", has_c, append, n_rows, has_ks)


if __name__ == "__main__":
    main()
