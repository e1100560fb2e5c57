#!/usr/bin/env bash
# The GPU checks of the training path, in one go, on one CUDA GPU:
#   1. the default command on a GPU (python code/train.py --device cuda: the multi30k recipe,
#      float32 with TF32 products, every step replayed as a CUDA graph), timed from start to
#      end, then scored as §6.1 scores (beam 4, average of the last 5);
#   2. the first 500 steps of the same recipe in each path, with and without the buckets
#      that bound the batch shapes: eager float32, eager bf16, graphs bf16, compiled bf16;
#   3. the decoding benchmark of the base and small models (greedy and beam, with and
#      without the key/value cache).
# results/multi30k-graphs, results/gpu-first-steps and benchmarks/results/cuda.json come
# from these commands, run on an H100.
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
    grep -a -o "step [0-9]*: loss[^,]*, nll[^,]*, lr[^,]*, [0-9.]* s" "$LOGS/$name.log" | tail -n 5
    tail -n 2 "$LOGS/$name.log" | cut -c 1-300
    tar -czf "$OUT/logs.tar.gz" -C "$RUNS" logs
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

stage default 150 $PY code/train.py --out "$RUNS/default" --device cuda --eval-every 2000 \
    --log-every 100
cp "$RUNS/default/train.log" "$LOGS/default-train.log" 2>/dev/null
stage evaluate 100 $PY code/evaluate.py --run "$RUNS/default" --out "$RUNS/default-results" \
    --average 5 --batch-size 500
cp "$RUNS/default-results/evaluation.json" "$OUT/default-evaluation.json" 2>/dev/null
cp "$RUNS/default-results/metrics.json" "$OUT/default-metrics.json" 2>/dev/null
FIRST="--device cuda --max-steps 500 --no-validation --log-every 100 --checkpoint-every 100"
for path in "off --no-cuda-graphs" "bf16 --no-cuda-graphs" "bf16 --cuda-graphs"; do
    for buckets in --buckets --no-buckets; do
        [ "$path" = "bf16 --cuda-graphs" ] && [ $buckets = --no-buckets ] && continue
        name=$(echo "first $path $buckets" | tr -d '-' | tr ' ' '_')
        stage "$name" 75 $PY code/train.py --out "$RUNS/$name" $FIRST --amp $path $buckets
    done
done
stage first_bf16_compile_buckets 100 $PY code/train.py --out "$RUNS/compiled" $FIRST \
    --amp bf16 --compile inductor --no-cuda-graphs
stage benchmark 120 $PY code/benchmark.py --device cuda --config base small --rounds 3 \
    --min-seconds 0.2 --out "$OUT/cuda.json"
