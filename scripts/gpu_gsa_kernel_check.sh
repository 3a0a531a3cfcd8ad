#!/usr/bin/env bash
# The GSA chunk kernels of this tree on one GPU, against an earlier tree's, at the MQAR d = 512 shape, in one call:
#
#   (here, once)  git archive <base-rev> evalsuite > .whl/base_src.tar     # .whl/ is git-ignored and carried
#   (GPU)         OUT=/some/dir [LABEL=<rev>] [CONFIGS='[{"CHUNK": 32}]'] bash scripts/gpu_gsa_kernel_check.sh
#                 (CONFIGS defaults to the candidates below; CONFIGS=none skips them)
#
# 1. scripts/gpu_gsa_gate_check.py (this tree, then the base tree): output and gradients against a float64
#    recurrence under mild to extreme gates -> $OUT/gate_check.jsonl.
# 2. scripts/tune_gsa.py --no-sweep at the MQAR shape (128,512,4,128) for both trees: parity, per-kernel CUDA
#    times, fwd and fwd+bwd -> $OUT/{new,base}/tune_gsa.json; with CONFIGS, this tree's fwd+bwd at each config
#    -> $OUT/configs/tune_gsa.json.
# 3. scripts/mqar_step_time.py: one GSA d = 512 MQAR training step (CUDA graph, bf16) -> $OUT/step_time.json, and
#    the 25 kernels with most GPU time in it -> $OUT/step_time.log (where the step goes beyond the GSA kernels).
# Prints the timing lines last. Wheels in .whl/ (fla-core, for tune_gsa's peer timings) are installed if present.
set -u
OUT=${OUT:-/tmp/gsa_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SITE=/tmp/site
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE .whl/*.whl
fi
TREES=("new:$PWD")
if [ -f .whl/base_src.tar ]; then
    mkdir -p /tmp/gsa_base && tar -xf .whl/base_src.tar -C /tmp/gsa_base && TREES+=("base:/tmp/gsa_base")
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
quiet() { grep -v "Warning\|warn_once\|return Variable"; }
for entry in "${TREES[@]}"; do
    name=${entry%%:*} path=${entry#*:}
    label=$name; [ "$name" = new ] && label=${LABEL:-new}
    PYTHONPATH=$path:$SITE timeout 150 python3 scripts/gpu_gsa_gate_check.py --out "$OUT/gate_check.jsonl" \
        --label "$label" 2>&1 | quiet
    PYTHONPATH=$path:$SITE timeout 240 python3 scripts/tune_gsa.py --no-sweep --no-fla --shape 128,512,4,128 \
        --out "$OUT/$name" 2>&1 | quiet > "$OUT/$name.log"
done
# Candidates around the default (2026-11-27, the pair kernel: none timed yet): smaller chunks, wider slot and d tiles,
# more warps. READ_BM 32 faults on the H100 (illegal memory access, triton 3.6): never list it here.
CONFIGS=${CONFIGS:-'[{}, {"CHUNK": 32}, {"READ_BM": 128}, {"PAIR_BM": 64}, {"PAIR_WARPS": 4}, {"WRITE_BD": 128},
  {"WRITE_WARPS": 8}]'}
if [ "$CONFIGS" != none ]; then
    PYTHONPATH=$PWD:$SITE timeout 480 python3 scripts/tune_gsa.py --shape 128,512,4,128 --configs "$CONFIGS" \
        --out "$OUT/configs" 2>&1 | quiet > "$OUT/configs.log"
fi
PYTHONPATH=$PWD:$SITE timeout 200 python3 scripts/mqar_step_time.py --models gsa --d-model 512 --amp auto \
    --graph graph --cells 1 --steps 30 --profile 25 --out "$OUT/step_time.json" 2>&1 | quiet > "$OUT/step_time.log"
tail -2 "$OUT/step_time.log"
grep -h "do_bench\|^config\|_kernel " "$OUT"/*.log
