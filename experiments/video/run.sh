#!/usr/bin/env bash
# The committed comparison: both models, one after the other, one thread each, with the load logged.
# Run from the repository root: bash experiments/video/run.sh   (runs go to runs/video/, not committed)
set -euo pipefail
export OMP_NUM_THREADS=1 TQDM_DISABLE=1
OUT=experiments/video/results
mkdir -p runs/video
( while true; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 30; done ) > "$OUT/load.log" &
LOAD_PID=$!
trap 'kill $LOAD_PID' EXIT
for model in timesformer_tiny timesformer_tiny_fibottention; do
  vitmix train --config configs/video-moving-fashion-mnist.yaml --model "$model" --out "runs/video/$model" \
    2>&1 | tee "$OUT/$model.log"
done
python experiments/video/summarize.py runs/video "$OUT"
