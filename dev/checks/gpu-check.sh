#!/usr/bin/env bash
# The GPU engine's checks in one bounded run (as dev/checks/image-check.sh is for the image), on a bare GPU machine:
# torch, pandas, scipy, pyarrow, safetensors, huggingface_hub and tqdm there, nothing installed, the repository
# run in place (python -m engine). Results: $OUT/gpu-check.json (each stage as it ends) and $OUT/gpu-check.log.
#
#   bash dev/checks/gpu-check.sh              # on the GPU machine (at most 8 minutes)
#   bash dev/checks/gpu-check.sh --dry-run    # the same logic on the CPU at smoke size (about 4 minutes on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
device=cuda size=paper seeds=16 limit=${GPU_CHECK_LIMIT:-470}
if [ "${1:-}" = "--dry-run" ]; then device=cpu size=smoke seeds=2 limit=600; fi
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/loopscope/inductor}
nvidia-smi 2>/dev/null | head -15 > "$OUT/gpu-check.log"
timeout "$limit" python3 -u dev/checks/gpu_check.py --device "$device" --size "$size" --seeds "$seeds" --out "$OUT" \
  2>&1 | grep --line-buffered -v "it/s\]$" >> "$OUT/gpu-check.log"
status=${PIPESTATUS[0]}
tail -n 60 "$OUT/gpu-check.log"
exit "$status"
