#!/usr/bin/env bash
# GSA and Lightning kernels on a GPU machine, from the repository root:
#
#   OUT=/some/dir bash scripts/gpu_linear_check.sh [parity|bench|all] [extra args for python -m evalsuite.bench.linear]
#
# parity: scripts/gpu_linear_parity.py (kernels vs the chunked reference at real shapes, decode, gsa/tnl models).
# bench:  python -m evalsuite.bench.linear (ops vs fla at T = 1K..64K, decode latency, decode-state memory).
# The GPU machine has no network: wheels the run needs (fla-core, einops, typer, ...) are carried in .whl/ and
# installed into /tmp/site. Everything lands in $OUT (log.txt, linear_parity.json, linear_bench.{json,png,md}).
set -euo pipefail
STAGE=${1:-all}
shift || true
OUT=${OUT:-/tmp/linear_bench}
mkdir -p "$OUT"
if [ -d .whl ]; then pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || true; fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
python3 -c 'import fla; print("fla", fla.__version__)' || echo "fla not importable: peers skipped"

if [ "$STAGE" = parity ] || [ "$STAGE" = all ]; then
    python3 scripts/gpu_linear_parity.py --out "$OUT"
fi
if [ "$STAGE" = bench ] || [ "$STAGE" = all ]; then
    python3 -m evalsuite.bench.linear --out "$OUT" "$@"
fi
