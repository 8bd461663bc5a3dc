#!/usr/bin/env bash
# One device session of the GPU study, one command (docs/gpu-study.md, "A device session"): CUDA asserted first, a
# calibration of at most 60 s on the `gpu` preset, then the next unfinished piece that fits what is left of the
# 9-minute command, packed into at most 8 files in $OUT (logs written there as it goes), the Inductor cache tarred
# for the next session, and the next session's plan (`plan: N s of device time`). dev/checks/gpu_session.py does it.
#
#   bash dev/checks/gpu-session.sh                   # on the GPU machine: the device tool's timeout_s 600
#   bash dev/checks/gpu-session.sh --dry-run         # the same on the CPU at gpu-smoke size, into /tmp (< 5 minutes)
#   bash dev/checks/gpu-session.sh --calibrate-only  # the calibration alone (dev/checks/gpu-check.sh)
#
# A carried Inductor cache (the last session's $OUT/inductor-cache.tar.gz, put at the tree's root untracked) is
# unpacked first. GPU_SESSION_LIMIT (seconds, default 540) bounds the command; a hard kill follows 20 s after it.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
limit=${GPU_SESSION_LIMIT:-540}
for arg in "$@"; do
  if [ "$arg" = --dry-run ]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # tiny models: one thread (two on a shared 2-core machine: 40x slower)
    rm -rf /tmp/gpu-session-dry-run-results
  fi
done
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${HOME:-/tmp}/.cache/loopscope/inductor}
mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
{ date -u +%FT%TZ; git rev-parse HEAD 2>/dev/null || echo "commit ${LOOPSCOPE_COMMIT:-unknown} (no .git here)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; } > "$OUT/gpu-session.log"
if [ -f inductor-cache.tar.gz ]; then
  tar xzf inductor-cache.tar.gz -C "$TORCHINDUCTOR_CACHE_DIR" --strip-components=1 \
    && echo "inductor cache: unpacked the carried one" >> "$OUT/gpu-session.log"
fi
timeout --kill-after=20 "$limit" "${PYTHON:-python3}" -u dev/checks/gpu_session.py --out "$OUT" --limit "$((limit - 20))" "$@"
status=$?
[ "$status" = 124 ] && echo "[gpu-session] the command reached its limit of $limit s" >> "$OUT/gpu-session.log"
exit "$status"
