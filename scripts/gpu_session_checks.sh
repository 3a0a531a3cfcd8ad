#!/usr/bin/env bash
# The GPU checks the CPU tests cannot make, for the newer parts (GCA kernel, static decoders and the decode engine,
# DRT chunk memory, torchrun), in one call on a CUDA machine, from the repository root (no install needed):
#
#   OUT=/some/dir [STEPS="gca generate_check generate_bench drt_memory torchrun"] [DATA=DIR] \
#       bash scripts/gpu_session_checks.sh      (DATA: the Gutenberg folder, for longbench_time)
#
# Each step writes $OUT/<step>/ and a DONE marker; a rerun skips finished steps (a machine lost mid-way costs one
# step). Logs: $OUT/log.txt. Copy the folders to results/bench/<device>/ to commit them.
#   gca             scripts/gpu_gca_check.py: GCA kernel parity (fwd + grads vs float64), block sweep, benchmark
#   generate_check  scripts/gpu_generate_check.py: compiled/graph/static/eager greedy parity per family, 760M FoX (Pro)
#   generate_bench  evalsuite bench generate: FoX (Pro) 760M shapes, 1K-16K, batch 1 and 8, eager, graph, compiled
#   drt_memory      scripts/drt_memory.py: DRT chunk memory on the GPU vs in CPU memory, 16K-256K
#   torchrun        scripts/torchrun_overhead.py: torchrun --nproc-per-node 1 vs a plain run (records, overhead)
#   compile_breaks  scripts/gpu_compile_breaks.py: where torch.compile breaks FoX's decoding step (760M, bf16)
#   niah_grid       issue #18's target: the FoX NIAH easy grid (121 cells, 1K-32K, 1,024 new tokens each: random
#                   weights never stop early) on fox-pro-random, batch size from free memory; time in results.json
#   longbench_time  issue #18: LongBench's 14 FoX tasks on a self-made fixture (20 records each, from the books in
#                   $DATA/heldout: scripts/make_longbench_fixture.py) on fox-pro-random; time in results.json
#   profile_step    scripts/profile_decode.py: one decode step of the 760M FoX (Pro) after 4K tokens: compiled (with
#                   the cache rows written in the decode kernel, and without: --separate-append) and graph at batch
#                   1, compiled at batch 8 (ms per step, GPU kernel time, kernels); the variants (--no-pack,
#                   --other-capacity, max-autotune) were measured in results/bench/h100/decode-5
#   generate_grid   issue #18's full grid: bench generate, FoX (Pro) 760M, 1K-64K x batch 1/8/32, graph and compiled
#                   (cells that do not fit in memory are skipped; resumable)
#   tune_decode     scripts/tune_decode.py: the FoX decode kernel's block configs and split counts at 4K/16K keys,
#                   batch 1/8 (24 heads of 64), each checked against the reference
#   drt_generate    issue #18: the paper-sized DRT (128M, random weights) on its eager and graph paths (static
#                   decoder: window rings and retrieved chunks in buffers, chunk-ending steps eager), 4K-64K, batch 1/8
#   generate_families  issue #18 part 5: bench generate for the other families at their paper shapes (random
#                   weights): GSA 1.3B, TNL 385M, FoX (LLaMA) and the Transformer (Pro) 760M, 1K-64K x batch 1/8/32,
#                   graph and compiled (where the family has one)
#   mqar_profile    issue #13 part 5: where the compiled MQAR training step's GPU time goes (d = 128, one cell
#                   each of transformer-llama, fox-pro, gsa; the 25 kernels with most time: scripts/mqar_step_time.py)
#   hf_twin         issue #18 part 4: transformer-llama (760M) natively and as a transformers LLaMA twin
#                   (scripts/make_hf_twin.py), bench generate at 1K/4K/16K x batch 1/8 on every path of each
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session_checks}
STEPS=${STEPS:-gca generate_check generate_bench drt_memory torchrun}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'

run_step() {  # name, command...
    local name=$1; shift
    if [ -f "$OUT/$name/DONE" ]; then echo "== $name: done before, skipped"; return; fi
    mkdir -p "$OUT/$name"
    echo "== $name: $* ($(date -u +%H:%M:%S))"
    local t0=$SECONDS
    if "$@"; then touch "$OUT/$name/DONE"; echo "== $name: ok in $((SECONDS - t0)) s"
    else echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; fi
}

for step in $STEPS; do
    case $step in
        gca) run_step gca python3 scripts/gpu_gca_check.py --out "$OUT/gca" ;;
        generate_check) run_step generate_check python3 scripts/gpu_generate_check.py --out "$OUT/generate_check" ;;
        generate_bench) run_step generate_bench python3 -m evalsuite.cli bench generate --out "$OUT/generate_bench" \
            --lengths 1024,4096,16384 --batches 1,8 --paths eager,graph,compiled --new-tokens 128 ;;
        drt_memory) run_step drt_memory python3 scripts/drt_memory.py --out "$OUT/drt_memory" ;;
        torchrun) run_step torchrun python3 scripts/torchrun_overhead.py --out "$OUT/torchrun" --model fox-pro-random \
            --device cuda --dtype bfloat16 --length 16384 --repeats 3 ;;
        compile_breaks) run_step compile_breaks python3 scripts/gpu_compile_breaks.py --out "$OUT/compile_breaks" ;;
        niah_grid) run_step niah_grid python3 -m evalsuite.cli niah --model fox-pro-random --mode easy --device cuda \
            --dtype bfloat16 --batch-size auto --out "$OUT/niah_grid/run" ;;
        longbench_time) run_step longbench_time bash -c "python3 scripts/make_longbench_fixture.py \
            --books '${DATA:-../shared/data/gutenberg}/heldout' --out '$OUT/longbench_time/fixture' --per-task 20 && \
            python3 -m evalsuite.cli longbench --model fox-pro-random --data '$OUT/longbench_time/fixture' \
            --device cuda --dtype bfloat16 --batch-size 4 --out '$OUT/longbench_time/run'" ;;
        profile_step) run_step profile_step bash -c "for k in '--path compiled' '--path compiled --separate-append' \
            '--path graph' '--path compiled --batch 8'; do python3 scripts/profile_decode.py --card fox-pro \
            --length 4096 --batch 1 \$k --out '$OUT/profile_step' || echo profile \$k failed; done" ;;
        generate_grid) run_step generate_grid python3 -m evalsuite.cli bench generate --out "$OUT/generate_grid" \
            --lengths 1024,2048,4096,8192,16384,32768,65536 --batches 1,8,32 --paths graph,compiled --new-tokens 128 ;;
        tune_decode) run_step tune_decode python3 scripts/tune_decode.py --out "$OUT/tune_decode" ;;
        drt_generate) run_step drt_generate python3 -m evalsuite.cli bench generate --out "$OUT/drt_generate" \
            --model drt --lengths 4096,16384,65536 --batches 1,8 --paths eager,graph --new-tokens 128 ;;
        generate_families) run_step generate_families python3 -m evalsuite.cli bench generate \
            --out "$OUT/generate_families" --model gsa --model tnl --model fox-llama --model transformer-pro \
            --lengths 1024,4096,16384,65536 --batches 1,8,32 --paths graph,compiled --new-tokens 128 ;;
        mqar_profile) run_step mqar_profile python3 scripts/mqar_step_time.py --out "$OUT/mqar_profile/step_time.json" \
            --models transformer-llama,fox-pro,gsa --amp auto --graph compile --cells 1 --profile 25 ;;
        hf_twin) run_step hf_twin bash -c "python3 scripts/make_hf_twin.py --card transformer-llama \
            --out /tmp/hf-twin && python3 -m evalsuite.cli bench generate --out '$OUT/hf_twin' --model transformer-llama \
            --model hf:/tmp/hf-twin --lengths 1024,4096,16384 --batches 1,8 --paths eager,graph,compiled --new-tokens 64" ;;
        *) echo "unknown step $step" ;;
    esac
done
