"""The instruction mix of a kernel's loops as a Hopper GPU would run them, compiled here without a GPU.

Triton compiles for any target without a driver (its wheel carries ``ptxas`` and ``cuobjdump``), so the machine code
of a kernel for sm_90a can be read on a CPU-only machine: per key-loop iteration, how many tensor-core (HGMMA),
float (FFMA, FADD, FMUL, FMNMX), special-function (MUFU: the exp2) and bookkeeping instructions each thread issues,
and the registers and spill stack of the launch (these match Nsight Compute's on an H200 for the forward:
results/kernels/README.md). What a kernel's source costs per iteration shows here, before any GPU time: the forward
with and without the gate differ by the bias's K step of the MMA (two HGMMA at D = 64; per-score float operations
where the bias goes through the ALU, below ``GATE_MMA_MIN_T`` or in fp16).

Kernels: the Forgetting Attention forward (``forgetting-fwd``) and its two backward kernels (``forgetting-dq``,
``forgetting-dkdv``) at their shipped GPU block configs (:func:`evalsuite.kernels.forgetting.common.block_config` as
on a GPU), bf16, with TMA descriptors where the launchers use them at T = :data:`AT_T`; and Gated Slot Attention's two
largest forward kernels, ``gsa-read`` (the pass-1 logits) and ``gsa-pair`` (each chunk's pair matrix), and its largest
backward kernel, ``gsa-dgate`` (the log-gate gradient), at the shipped
:data:`~evalsuite.kernels.gated_slot.common.GPU_CONFIG` with dk = dv = m = D, bf16 (their gate is their own: one
record each). Every record also counts the whole kernel's instructions (``whole``): the GSA kernels' products are
unrolled, with no loop around them. Not under ``TRITON_INTERPRET=1``: the interpreter replaces the kernels with Python.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

KERNELS = ("forgetting-fwd", "forgetting-dq", "forgetting-dkdv", "gsa-read", "gsa-pair", "gsa-dgate")
JSON_NAME = "sass_loops.json"
_BF16_ARGS = {"Q", "K", "V", "Out", "DO", "DQ", "DK", "DV", "X", "Y", "QA", "KA",
              "KN", "VN", "RS1", "RD1", "RS2", "RD2"}  # fmt: skip
_F32_ARGS = {"C", "LSE", "DELTA", "DC", "G", "HS", "OUT", "Z", "DP", "A", "HSK", "HSV", "DHSK", "DHSV", "DG",
             "CQ", "CK", "LF", "O_PART", "LSE_PART"}  # fmt: skip
_INT_POINTERS = {"KS": "*i32", "KL": "*i64"}  # the decode kernel's key starts and device-side key length
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"\bBRA\s+(0x[0-9a-f]+)")
AT_T = 16384  # the sequence length whose launch settings the compiled kernels take (the benchmarks' headline T)


def _gsa_kernel_and_config(kernel: str, head_dim: int):
    """:func:`_kernel_and_config` of the GSA read, pair or dgate kernel at dk = dv = m = ``head_dim``, bf16 (MODE 1
    of the pair kernel: the forward's p)."""
    import torch

    from evalsuite.kernels.gated_slot import chunk_kernels
    from evalsuite.kernels.gated_slot.common import GPU_CONFIG as cfg
    from evalsuite.kernels.gated_slot.common import dot_flags, read_tiles

    flags = dot_flags(torch.bfloat16, gated=True)
    shape = {"M": head_dim, "C": cfg["CHUNK"], "BC": cfg["SUB"]}
    if kernel == "gsa-read":
        bd, bm = read_tiles(cfg, head_dim, head_dim)
        values = {**shape, **flags, "D": head_dim, "BD": bd, "BM": bm}
        return chunk_kernels._read_kernel, values, (cfg["READ_WARPS"], cfg["STAGES"])
    if kernel == "gsa-dgate":
        bd = min(cfg["DGATE_BD"], head_dim)
        values = {**shape, **flags, "DK": head_dim, "DV": head_dim, "BD": bd, "BM": min(cfg["DGATE_BM"], head_dim)}
        return chunk_kernels._dgate_kernel, values, (cfg["DGATE_WARPS"], cfg["STAGES"])
    gate_flags = {k: v for k, v in flags.items() if k.startswith("G")}
    values = {**shape, **gate_flags, "MODE": 1, "BM": min(cfg["PAIR_BM"], head_dim)}
    return chunk_kernels._pair_kernel, values, (cfg["PAIR_WARPS"], cfg["STAGES"])


def _kernel_and_config(kernel: str, head_dim: int, gate: bool):
    """(jit function, constexpr values, (num_warps, num_stages)) of a kernel at its shipped GPU config, with TMA and
    the gate through the tensor cores as the launchers choose them at T = :data:`AT_T`."""
    if kernel.startswith("gsa-"):
        return _gsa_kernel_and_config(kernel, head_dim)
    import torch

    from evalsuite.kernels.forgetting import backward_dkdv, backward_dq, common, forward

    fn = {"forgetting-fwd": forward._fwd_kernel, "forgetting-dq": backward_dq._bwd_dq_kernel,
          "forgetting-dkdv": backward_dkdv._bwd_dkdv_kernel}[kernel]  # fmt: skip
    table = {"forgetting-fwd": common.FWD_CONFIGS, "forgetting-dq": common.BWD_DQ_CONFIGS,
             "forgetting-dkdv": common.BWD_DKDV_CONFIGS}[kernel]  # fmt: skip
    block_m, block_n, warps, stages = table[head_dim]
    if kernel == "forgetting-fwd":
        gate_mma = gate and common.gate_through_mma(head_dim, AT_T, torch.bfloat16)
        tma = common.FWD_TMA[head_dim]
        c_tma = tma and gate and not gate_mma and common.key_cumsums_through_tma(AT_T)
    else:
        gate_mma = gate and common.backward_gate_through_mma(head_dim, AT_T, torch.bfloat16)
        tma, c_tma = common.backward_tiles_through_tma(head_dim, AT_T, gate, gate_mma), False
    values = {"HAS_C": gate, "HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "UPCAST": False,
              "USE_TMA": tma, "C_TMA": c_tma, "GATE_MMA": gate_mma}  # fmt: skip
    return fn, values, (warps, stages)


def compile_jit(fn, values: dict, num_warps: int, num_stages: int, arch: int = 90, types: dict | None = None):
    """Triton's compiled kernel of the JIT function ``fn`` for compute capability ``arch``, its constexprs ``values``.

    Pointers are bf16 (q, k, v and their gradients, the decode kernel's new and copied rows) or float32 (cumsums,
    LSE, partial outputs; GSA's gates, states, logits and pair matrices), the decode kernel's key starts and length
    integers; scalars 32-bit; head-dim strides fixed to 1 as the launchers see them, the other integers multiples of
    16 (as at T = :data:`AT_T`, H = 16). ``types``: Triton signature types (``"*bf16"``, ``"i32"``) of arguments
    those names would get wrong, by name.
    """
    types = types or {}
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter runs kernels as Python and compiles nothing")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constexprs = {}, {}
    for name in fn.arg_names:
        if name in values:
            signature[name], constexprs[name] = "constexpr", values[name]
        elif name in types:
            signature[name] = types[name]
        elif re.fullmatch(r"stride_\w+d", name):  # the head dim's stride
            signature[name], constexprs[name] = "constexpr", 1
        elif name in _BF16_ARGS:
            signature[name] = "*bf16"
        elif name in _F32_ARGS:
            signature[name] = "*fp32"
        elif name in _INT_POINTERS:
            signature[name] = _INT_POINTERS[name]
        elif name in ("sm_scale", "mult", "scale"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    # what the JIT infers at the benchmarks' shapes: pointers and integers (strides, T) multiples of 16, except the
    # arguments the kernel leaves unspecialised
    loose = {p.name for p in fn.params if p.do_not_specialize}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
               if signature[n].startswith("*") or signature[n] == "i32" and n not in loose}  # fmt: skip
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})  # fmt: skip


def compile_kernel(kernel: str, head_dim: int, gate: bool, arch: int = 90) -> dict:
    """Compile ``kernel`` for compute capability ``arch`` (:func:`compile_jit`) -> ``{"sass": text, "registers": int,
    "stack": int}``; ``gate`` sets the FoX kernels' ``HAS_C``."""
    import triton

    fn, values, (warps, stages) = _kernel_and_config(kernel, head_dim, gate)
    compiled = compile_jit(fn, values, warps, stages, arch)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True)
    registers = re.search(r"REG:(\d+)", usage.stdout)
    stack = re.search(r"STACK:(\d+)", usage.stdout)
    return {"sass": sass, "registers": int(registers.group(1)), "stack": int(stack.group(1))}


def _opcodes(lines) -> list[str]:
    """The opcodes of SASS instruction texts, predicates and modifiers dropped."""
    return [re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0] for text in lines]


def whole_kernel(sass: str) -> dict:
    """Every instruction of a SASS listing: ``{"instructions": n, "opcodes": {opcode: count}}``."""
    body = _opcodes(m.group(2).strip() for m in _INSTRUCTION.finditer(sass))
    return {"instructions": len(body), "opcodes": dict(Counter(body).most_common())}


def innermost_loops(sass: str) -> list[dict]:
    """The loops of a SASS listing that contain a tensor-core instruction and no other loop, in code order:
    ``[{"instructions": n, "opcodes": {opcode: count}}]`` for one iteration (predicates and modifiers dropped)."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in _INSTRUCTION.finditer(sass)]
    index = {address: i for i, (address, _) in enumerate(code)}
    spans = []
    for i, (address, text) in enumerate(code):
        branch = _BRANCH.search(text)
        target = int(branch.group(1), 16) if branch else None
        if target is not None and target < address and target in index:
            spans.append((index[target], i))
    loops = []
    for start, end in sorted(spans):
        if any(start <= s and e <= end for s, e in spans if (s, e) != (start, end)):
            continue  # holds another loop
        body = _opcodes(text for _, text in code[start : end + 1])
        if "HGMMA" in body:
            loops.append({"instructions": len(body), "opcodes": dict(Counter(body).most_common())})
    return loops


def sass_loops(out_dir, kernels=KERNELS, head_dims=(64, 128), gates=(True, False), arch: int = 90) -> list[dict]:
    """:func:`compile_kernel`, :func:`innermost_loops` and :func:`whole_kernel` for each kernel x head dim x gate (the
    GSA kernels: one record, gate None); writes ``sass_loops.json`` (one record each: registers, spill stack, the
    loops, the whole kernel) and returns the records."""
    import triton

    records = []
    for kernel in kernels:
        for head_dim in head_dims:
            for gate in gates if kernel.startswith("forgetting") else (None,):
                result = compile_kernel(kernel, head_dim, bool(gate), arch)
                records.append({"kernel": kernel, "head_dim": head_dim, "gate": gate, "arch": f"sm_{arch}a",
                                "triton": triton.__version__, "registers": result["registers"],
                                "stack_bytes": result["stack"], "loops": innermost_loops(result["sass"]),
                                "whole": whole_kernel(result["sass"])})  # fmt: skip
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / JSON_NAME).write_text(json.dumps(records, indent=1))
    return records


def format_loops(records) -> str:
    """One line per loop (kernel, D, gate, instructions per iteration, the leading opcodes), or for a kernel without
    loops one line of the whole kernel."""
    lines = []
    for rec in records:
        gate = {True: "gate", False: "no gate", None: ""}[rec["gate"]]
        parts = [(f"loop {n}", loop) for n, loop in enumerate(rec["loops"])] or [("kernel", rec["whole"])]
        for what, counted in parts:
            top = ", ".join(f"{op} {count}" for op, count in list(counted["opcodes"].items())[:8])
            lines.append(f"{rec['kernel']:16s} D={rec['head_dim']:<4d} {gate:8s} {what}: "
                         f"{counted['instructions']:4d} instructions ({top}); {rec['registers']} registers, "
                         f"{rec['stack_bytes']} B stack")  # fmt: skip
    return "\n".join(lines)
