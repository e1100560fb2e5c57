#!/usr/bin/env bash
# The GPU checks of the training path, in one go, on one CUDA GPU:
#   1. the CUDA graph tests (capture and replay against the eager step);
#   2. the multi30k recipe with every step replayed as a CUDA graph (--cuda-graphs), float32
#      as in results/multi30k-gpu, then scored as §6.1 scores (beam 4, average of the last 5);
#   3. seconds per step of the same recipe without graphs, and with graphs in bf16;
#   4. the benchmark's base model at a training-sized batch (8000 target tokens), with the
#      step as one CUDA graph and with the model compiled beside the eager ones.
# results/multi30k-graphs and benchmarks/results/cuda-base-8k.json come from these commands
# (stages 2 and 4), run on an H100.
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
    local started=$SECONDS
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - started)) s"
    tail -n 4 "$LOGS/$name.log" | cut -c 1-300
    tar -czf "$OUT/logs.tar.gz" -C "$RUNS" logs
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

# addopts cleared: the nbval options of pyproject.toml need a plugin these tests do not use
stage tests 90 $PY -m pytest -q -x -p no:cacheprovider -o addopts="" tests/test_cuda_graphs.py
stage graphed 180 $PY code/train.py --out "$RUNS/graphed" --cuda-graphs --amp off \
    --eval-every 2000 --log-every 100
cp "$RUNS/graphed/train.log" "$LOGS/graphed-train.log" 2>/dev/null
stage evaluate 120 $PY code/evaluate.py --run "$RUNS/graphed" --out "$RUNS/graphed-results" \
    --average 5 --batch-size 500
cp "$RUNS/graphed-results/evaluation.json" "$OUT/graphed-evaluation.json" 2>/dev/null
cp "$RUNS/graphed-results/metrics.json" "$OUT/graphed-metrics.json" 2>/dev/null
stage eager-steps 60 $PY code/train.py --out "$RUNS/eager" --amp off --max-steps 1000 \
    --no-validation --log-every 100
cp "$RUNS/eager/train.log" "$LOGS/eager-train.log" 2>/dev/null
stage graphed-bf16-steps 60 $PY code/train.py --out "$RUNS/graphed-bf16" --cuda-graphs \
    --amp bf16 --max-steps 1000 --no-validation --log-every 100
cp "$RUNS/graphed-bf16/train.log" "$LOGS/graphed-bf16-train.log" 2>/dev/null
stage benchmark 240 $PY code/benchmark.py --device cuda --config base-8k --compile --rounds 5 \
    --warmup 2 --out "$OUT/cuda-base-8k.json"
