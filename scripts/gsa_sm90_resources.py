"""Compile the GSA chunk kernels for an H100 (sm_90) on any machine, GPU or not, and print each kernel's registers,
spill stack, shared memory and compile seconds: what a GPU would build, checked before a GPU session.

Triton's wheel carries ptxas and cuobjdump, so ``triton.compile`` reaches a cubin without a driver. Usage:
    python scripts/gsa_sm90_resources.py [--md 64] [--warps 8] [--dgate-warps 8] [--kernels PATH/chunk_kernels.py]
``--kernels`` loads another version of the module (e.g. ``git show REV:evalsuite/kernels/gated_slot/chunk_kernels.py``)
to compare; for a version whose helpers in common.py differ, run this script with PYTHONPATH at that tree instead
(``git archive REV evalsuite | tar -x -C DIR``). Triton's code generation differs between versions: to see what the
GPU machine builds, put its triton (3.6.0 in 2026-11) first on PYTHONPATH (``pip install --no-deps --target DIR
triton==3.6.0``). Written when the first exact-gate kernels (unrolled lag loops) took ~10 minutes to compile.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import tempfile
import time

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from evalsuite.kernels.gated_slot import chunk_kernels, common

ap = argparse.ArgumentParser()
ap.add_argument("--md", type=int, default=128, help="head dims dk = dv and slots m")
ap.add_argument("--warps", type=int, help="READ_WARPS and WRITE_WARPS (default: common.GPU_CONFIG)")
ap.add_argument("--dgate-warps", type=int, help="DGATE_WARPS (default: common.GPU_CONFIG)")
ap.add_argument("--kernels", help="path of another chunk_kernels.py to compile instead")
args = ap.parse_args()

ck = chunk_kernels
if args.kernels:
    spec = importlib.util.spec_from_file_location("other_chunk_kernels", args.kernels)
    ck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ck)
cfg = dict(common.GPU_CONFIG)
if args.warps:
    cfg["READ_WARPS"] = cfg["WRITE_WARPS"] = args.warps
if args.dgate_warps:
    cfg["DGATE_WARPS"] = args.dgate_warps
# bf16 inputs as on a GPU (dot_flags would emulate under TRITON_INTERPRET)
flags = dict(DT=tl.bfloat16, MT=tl.bfloat16, PREC="tf32", GT=tl.bfloat16, GMT=tl.bfloat16, GPREC="tf32")
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def build(name: str, constexprs: dict, pointers: dict, warps: int) -> dict:
    fn = getattr(ck, name)
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    signature = {
        a: "constexpr" if a in constexprs else pointers.get(a, "fp32" if a == "scale" else "i32") for a in fn.arg_names
    }
    # What the JIT specialises at launch: 16-byte aligned pointers and T (512 at the MQAR shape) a multiple of 16.
    # Without these hints the layouts differ and a build can pass here and fail on the GPU (2026-11-27: faa71fc's
    # write kernel hit an assertion in TritonGPUOptimizeThreadLocality there, not here).
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
               if signature[a].startswith("*") or a == "T"}  # fmt: skip
    start = time.time()
    kernel = triton.compile(
        ASTSource(fn, signature, constexprs, aligned),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps, "num_stages": cfg["STAGES"]},
    )
    seconds = time.time() - start
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [os.path.join(bindir, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True
        )
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", usage.stdout, re.S)
    return {
        "kernel": name,
        "mode": constexprs.get("MODE"),
        "warps": warps,
        "compile_s": round(seconds, 1),
        "regs": int(found.group(1)) if found else None,
        "spill_stack_bytes": int(found.group(2)) if found else None,
        "shared_bytes": kernel.metadata.shared,
    }


base = dict(M=args.md, C=cfg["CHUNK"], BC=cfg["SUB"], **flags)
bf16, f32 = "*bf16", "*fp32"
rows = [build("_read_kernel", dict(base, D=args.md, BD=cfg["READ_BD"], BM=min(cfg["READ_BM"], args.md)),
              {"X": bf16, "Y": bf16, "G": f32, "HS": f32, "OUT": f32}, cfg["READ_WARPS"])]  # fmt: skip
written = {"Z": f32, "DP": f32, "G": f32, "A": f32}
write = dict(base, D=args.md, BD=cfg["WRITE_BD"], BM=min(cfg["WRITE_BM"], args.md))
for mode in (1, 2):
    rows.append(build("_pair_kernel", dict(base, BM=min(cfg["PAIR_BM"], args.md), MODE=mode), written,
                      cfg["PAIR_WARPS"]))  # fmt: skip
    rows.append(build("_write_kernel", dict(write, MODE=mode), {**written, "Y": bf16, "HS": f32, "OUT": bf16},
                      cfg["WRITE_WARPS"]))  # fmt: skip
rows.append(build("_write_rev_kernel", write, {**written, "X": bf16, "DHS": f32, "OUT": bf16}, cfg["WRITE_WARPS"]))
pointers = {n: bf16 if n in ("Q", "K", "V", "DO") else f32 for n in "Q K V DO Z DP G HSK HSV DHSK DHSV DG".split()}
rows.append(
    build(
        "_dgate_kernel",
        dict(base, DK=args.md, DV=args.md, BD=cfg["DGATE_BD"], BM=min(cfg["DGATE_BM"], args.md)),
        pointers,
        cfg["DGATE_WARPS"],
    )
)
for row in rows:
    print(json.dumps(row))
