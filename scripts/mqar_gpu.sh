#!/usr/bin/env bash
# An MQAR sweep preset (default gsa-paper) on one CUDA GPU, from the repository root (no install needed):
#
#   OUT=/some/dir [PRESET=recipe-ablation] bash scripts/mqar_gpu.sh [extra `evalsuite mqar` options]
#
# Writes $OUT/$PRESET/{records.jsonl,results.json} (no plots: draw them anywhere with
# `evalsuite plot mqar $OUT/$PRESET --out results/mqar/...`) and $OUT/log.txt. Resumable: rerun with the same
# $OUT, or with RESUME=dir holding an earlier records.jsonl, and only the missing cells train (cells cut short
# resume from their snapshots in $OUT/$PRESET/partial/: keep that folder with the records). Back home, fold a
# session's sweeps into the committed directory: python scripts/merge_mqar_records.py results/mqar/DIR $OUT/$PRESET
# ... Training steps run as CUDA graphs of torch.compile'd forwards (the defaults on CUDA;
# results/mqar/step_time/h100-graphs-compile).
# Knobs: WORKERS (processes training cells at once on the GPU, default 4), TIME_LIMIT (seconds after which no new
# cell starts, default 300, so that a 10-minute call ends with every finished cell written), NPROC (GPUs: one
# torchrun rank per visible GPU, each training its share of the cells with WORKERS processes, default 1).
set -euo pipefail
OUT=${OUT:-/tmp/mqar_gpu}
PRESET=${PRESET:-gsa-paper}
RUN="$OUT/$PRESET"
mkdir -p "$RUN"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1

if [ -n "${RESUME:-}" ] && [ -f "$RESUME/records.jsonl" ] && [ ! -f "$RUN/records.jsonl" ]; then
    cp "$RESUME/records.jsonl" "$RUN/records.jsonl"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'

# The Triton attention kernel trains the models when it is present and agrees with the PyTorch reference
# (forward and gradients, with and without a forget gate, at the sweep's head dim): backend "auto", which takes it
# for bf16/fp16 cells and the reference for fp32 ones (the kernel takes half precision only: the recipe-ablation's
# fp32 variant failed with "triton" forced, 2026-11-26); otherwise the reference runs every cell.
ATTENTION=$(python3 - <<'EOF' 2>>"$OUT/log.txt" || echo reference
import torch
from evalsuite.kernels.forgetting import attention

gen = torch.Generator(device="cuda").manual_seed(0)
worst = 0.0
for gated in (False, True):
    q, k, v = (torch.randn(2, 512, 2, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    cum = -torch.rand(2, 512, 2, device="cuda", generator=gen).mul(0.1).cumsum(1) if gated else None
    outs = []
    for backend in ("triton", "reference"):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o = attention(qq, kk, vv, cum, cum, backend=backend)
        o.float().square().sum().backward()
        outs.append([o.float(), qq.grad.float(), kk.grad.float(), vv.grad.float()])
    for a, b in zip(*outs):
        worst = max(worst, ((a - b).norm() / b.norm()).item())
print("auto" if worst < 5e-2 else "reference")
import sys
print(f"triton vs reference: worst relative error {worst:.2e}", file=sys.stderr)
EOF
)
echo "attention backend: $ATTENTION"

LAUNCH=(python3 -m evalsuite.cli)
[ "${NPROC:-1}" -gt 1 ] && LAUNCH=(torchrun --standalone --nproc-per-node "$NPROC" -m evalsuite.cli)
"${LAUNCH[@]}" mqar --preset "$PRESET" --device cuda --attention "$ATTENTION" \
    --workers "${WORKERS:-4}" --time-limit "${TIME_LIMIT:-300}" --out "$RUN" --no-progress --no-report "$@"
