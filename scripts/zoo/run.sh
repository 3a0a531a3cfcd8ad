#!/usr/bin/env bash
# Train the zoo (tasks/train-lm.yaml preset `zoo`: every seed family at ~2.2M parameters on UTF-8 bytes, two seeds
# each) on one GPU, then evaluate every run beyond its 512-byte training context: the per-token loss over the
# held-out books in windows of 16,384 bytes (32x), the records of results/claims/loss/. From the repository root:
#
#   OUT=/some/dir DATA=../shared/data/gutenberg WORKERS=14 bash scripts/zoo/run.sh
#
# Writes $OUT/zoo/<card>-seed<s>/{checkpoint,train.json}, $OUT/zoo/zoo.json, $OUT/eval/loss/<run>/ and
# $OUT/log.txt. Reruns skip what is done (trained members, finished evaluation cells). Ship the seed-0 models with
# scripts/drt_claim/ship.py (results/zoo/README.md); results/claims/README.md reads the evaluations.
set -euo pipefail
OUT=${OUT:-/tmp/zoo}
DATA=${DATA:-../shared/data/gutenberg}
WORKERS=${WORKERS:-14}
EVAL_WORKERS=${EVAL_WORKERS:-7}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
es() { python3 -m evalsuite "$@"; }
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")'

es train-lm --preset zoo --corpus "$DATA/train" --out "$OUT/zoo" --workers "$WORKERS" --device "$DEVICE"

evaluate() {  # <card>-seed<s>
  local run=$1 card=${1%-seed*}
  es loss --model "$card" --checkpoint "$OUT/zoo/$run/checkpoint" --data "$DATA/heldout" --length 16384 \
    --device "$DEVICE" --no-plot --out "$OUT/eval/loss/$run" > "$OUT/eval/$run.loss.txt" 2>&1
  echo "evaluated $run"
}
export -f evaluate es
export OUT DATA DEVICE
mkdir -p "$OUT/eval"
ls "$OUT/zoo" | grep -- '-seed[0-9]*$' | xargs -P "$EVAL_WORKERS" -I{} bash -c 'evaluate {}'
echo "zoo done"
