#!/usr/bin/env bash
# The GPU checks of the training path, in one go, on one CUDA GPU:
#   1. the default command on a GPU (python code/train.py --device cuda: the multi30k recipe,
#      float32 with TF32 products, every step replayed as a CUDA graph), timed from start to
#      end, then scored as §6.1 scores (beam 4, average of the last 5);
#   2. the first 500 steps of the same recipe in each path, each command timed from start to
#      end: eager float32 and bf16 with and without the buckets that bound the batch shapes,
#      graphs in float32 and bf16, and bf16 compiled with dynamic shapes;
#   3. the base model's training step at the paper's batch (about 25000 target tokens),
#      eager, graphed, compiled and both, with the benchmark's FLOP count and MFU.
# results/multi30k-graphs and results/gpu-first-steps come from these commands; train logs
# seconds of the GPU's time (it waits for the GPU before it reads its clock).
#
#   MULTI30K_DIR=/path/to/multi30k OUT=/tmp/gpu bash benchmarks/gpu_checks.sh
#
# Every stage has its own time limit, so that one that fails or hangs leaves the others'
# results. $OUT gets the logs (logs.tar.gz, refreshed after each stage) and the results.
set -u
OUT=${OUT:?set OUT to a folder for the logs and results}
PY=${PYTHON:-python3}
RUNS=${RUNS:-/tmp/gpu-runs}
export PYTHONUNBUFFERED=1
LOGS=$RUNS/logs
mkdir -p "$OUT" "$LOGS"

stage() {  # stage NAME SECONDS COMMAND...: run it, log it, print how it ended
    local name=$1 limit=$2
    shift 2
    local started
    started=$(date +%s%N)
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    echo "== $name: exit $? after $((($(date +%s%N) - started) / 1000000)) ms (limit $limit s)"
    grep -a -o "step [0-9]*: loss[^,]*, nll[^,]*, lr[^,]*, [0-9.]* s" "$LOGS/$name.log" | tail -n 5
    tail -n 2 "$LOGS/$name.log" | cut -c 1-300
    tar -czf "$OUT/logs.tar.gz" -C "$RUNS" logs
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

stage default 100 $PY code/train.py --out "$RUNS/default" --device cuda
cp "$RUNS/default/train.log" "$LOGS/default-train.log" 2>/dev/null
stage evaluate 70 $PY code/evaluate.py --run "$RUNS/default" --out "$RUNS/default-results" \
    --average 5 --batch-size 500
cp "$RUNS/default-results/evaluation.json" "$OUT/default-evaluation.json" 2>/dev/null
cp "$RUNS/default-results/metrics.json" "$OUT/default-metrics.json" 2>/dev/null
FIRST="--device cuda --max-steps 500 --no-validation --log-every 100 --checkpoint-every 100"
stage first_off_eager_buckets 45 $PY code/train.py --out "$RUNS/f1" $FIRST --amp off --no-cuda-graphs --buckets
stage first_off_eager_nobuckets 45 $PY code/train.py --out "$RUNS/f2" $FIRST --amp off --no-cuda-graphs --no-buckets
stage first_bf16_eager_buckets 50 $PY code/train.py --out "$RUNS/f3" $FIRST --amp bf16 --no-cuda-graphs --buckets
stage first_bf16_eager_nobuckets 50 $PY code/train.py --out "$RUNS/f4" $FIRST --amp bf16 --no-cuda-graphs --no-buckets
stage first_bf16_graphs_buckets 45 $PY code/train.py --out "$RUNS/f5" $FIRST --amp bf16 --cuda-graphs --buckets
stage first_off_graphs_buckets 45 $PY code/train.py --out "$RUNS/f6" $FIRST --amp off --cuda-graphs --buckets
stage first_bf16_compile_buckets 110 $PY code/train.py --out "$RUNS/f7" $FIRST --amp bf16 \
    --compile inductor --no-cuda-graphs --buckets
stage benchmark 300 $PY code/benchmark.py --device cuda --config base-25k --compile \
    --compile-mode max-autotune-no-cudagraphs --no-decoding --rounds 3 --warmup 2 \
    --out "$OUT/cuda-base-25k.json"
