#!/usr/bin/env bash
# The GPU engine's checks in one bounded run, folded into the session (issues 45, 59): the session's calibration on the
# `gpu` preset the study runs (batch 64; an untimed warm-up of every graph a piece runs with its compile seconds apart,
# then a step at 4 and 16 seeds, the evaluation passes, a refit as E3 runs it, the host's batches, peak memory against
# the estimate; a compile that fails is retried eager; dev/checks/gpu_session.py), then the placement checks of
# dev/checks/gpu_check.py (smoke E2 twice and bit-identical, eval, E3, verify, the E1 probe on the device). Results in
# $OUT: gpu-session.{log,json}, rates.json, gpu-check.{json,log}. Exit status: non-zero when a stage failed.
#
#   bash dev/checks/gpu-check.sh              # on the GPU machine (at most 8 minutes)
#   bash dev/checks/gpu-check.sh --dry-run    # the same on the CPU at smoke size (one thread)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-check}
export OUT
mkdir -p "$OUT"
device=cuda
if [ "${1:-}" = "--dry-run" ]; then device=cpu; export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi
GPU_SESSION_LIMIT=${GPU_SESSION_LIMIT:-180} bash dev/checks/gpu-session.sh --calibrate-only "$@"
calibrated=$?
nvidia-smi 2>/dev/null | head -15 > "$OUT/gpu-check.log"
timeout "${GPU_CHECK_LIMIT:-290}" "${PYTHON:-python3}" -u dev/checks/gpu_check.py --device "$device" --out "$OUT" \
  2>&1 | grep --line-buffered -v "it/s\]$" >> "$OUT/gpu-check.log"
status=${PIPESTATUS[0]}
tail -n 40 "$OUT/gpu-check.log"
[ "$status" = 0 ] && status=$calibrated
exit "$status"
