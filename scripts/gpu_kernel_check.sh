#!/usr/bin/env bash
# One-shot check of the Forgetting Attention Triton kernels on a GPU machine, from the repository root:
#
#   OUT=/some/dir bash scripts/gpu_kernel_check.sh [explore|final]
#
# explore: parity at ragged and long T (all head dims, decode too), a block-config sweep at T=16384
#          (tune.json), and a short benchmark (T = 4096, 16384).
# final:   the full benchmark with the kernel's shipped configs (T = 1024 .. 65536, D = 64 and 128, fwd and
#          fwdbwd), with the parity checks in its JSON (and D = 32 parity in parity_d32.json).
# Everything lands in $OUT (log.txt, tune.json, attention_bench.json, attention_bench.png).
set -euo pipefail
STAGE=${1:-final}
OUT=${OUT:-/tmp/attention_bench}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'

if [ "$STAGE" = explore ]; then
    python3 - <<'EOF'
import json, os
from evalsuite.bench.attention import check_decode_parity_gpu, check_parity_gpu

recs = []
for D in (32, 64, 128):
    recs += check_parity_gpu((1, 17, 255, 1000, 4097), head_dim=D)
recs += check_parity_gpu((16384,), head_dim=64)
recs += check_decode_parity_gpu(cache_lens=(1000, 33000), n_queries=(1, 16))
json.dump(recs, open(os.path.join(os.environ["OUT"], "parity.json"), "w"), indent=1)
bad = [r for r in recs if max(v for k, v in r.items() if k.startswith("rel_err")) > 2e-2]
print("PARITY", "FAIL" if bad else "OK", len(recs), "checks;", len(bad), "above 2e-2")
EOF
    python3 -m evalsuite.bench.attention --out "$OUT" --tune-only
    python3 -m evalsuite.bench.attention --out "$OUT" --seq-lens 4096 16384 \
        --providers fox_triton triton_causal sdpa_causal fla_forgetting --parity-seq-lens
else
    python3 - <<'EOF'
import json, os
from evalsuite.bench.attention import check_parity_gpu

recs = check_parity_gpu((1, 17, 1000, 4097), head_dim=32)  # D=32 is not in the benchmark grid
json.dump(recs, open(os.path.join(os.environ["OUT"], "parity_d32.json"), "w"), indent=1)
EOF
    python3 -m evalsuite.bench.attention --out "$OUT" \
        --providers fox_triton triton_causal sdpa_causal fla_forgetting
fi
