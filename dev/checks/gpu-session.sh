#!/usr/bin/env bash
# One device session of the GPU study, one command (docs/gpu-study.md, "A device session"): CUDA asserted first, a
# calibration on the `gpu` preset (an untimed warm-up of every graph a piece runs, its compile seconds apart, then at
# most 60 s of timed passes), the piece that fits what is left of the 9-minute command, packed into at most 8 files
# in $OUT (logs written there as it goes), this GPU's Inductor cache tarred for the next session, and the next
# session's plan (`plan: N s of device time`, each part's prediction before it). dev/checks/gpu_session.py does it.
#
#   LOOPSCOPE_COMMIT=<commit> bash dev/checks/gpu-session.sh   # on the GPU machine: the device tool's timeout_s 600
#   bash dev/checks/gpu-session.sh --dry-run                   # the same on the CPU at gpu-smoke size, into /tmp
#   bash dev/checks/gpu-session.sh --calibrate-only            # the calibration alone (dev/checks/gpu-check.sh)
#
# A real session refuses to start (exit 2) in a tree without .git unless LOOPSCOPE_COMMIT names the clean commit it
# was sent from (LOOPSCOPE_DIRTY=1 if it was not clean): every manifest records it. A carried Inductor cache (the last
# session's $OUT/inductor-cache.tar.gz, put at the tree's root untracked) gives this GPU its entries. If the compile
# fails, the session goes on eager (LOOPSCOPE_COMPILE=0); LOOPSCOPE_COMPILE_FAIL=1 simulates that failure.
# GPU_SESSION_LIMIT (seconds, default 540) bounds the command; a hard kill follows 20 s after it.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
limit=${GPU_SESSION_LIMIT:-540}
real=1
for arg in "$@"; do
  case "$arg" in
    --dry-run) real=0; export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; rm -rf /tmp/gpu-session-dry-run-results ;;
    --calibrate-only) real=0 ;;  # stores nothing: no manifest to record a commit in
  esac
done
{ date -u +%FT%TZ; git rev-parse HEAD 2>/dev/null || echo "commit ${LOOPSCOPE_COMMIT:-unknown} (no .git here)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; } > "$OUT/gpu-session.log"
if [ "$real" = 1 ] && [ ! -e .git ] && ! [[ "${LOOPSCOPE_COMMIT:-}" =~ ^[0-9a-f]{40}$ ]]; then
  echo "[gpu-session] not started: this tree has no .git and LOOPSCOPE_COMMIT does not name the commit it was sent" \
    "from; send a clean commit's tree and run LOOPSCOPE_COMMIT=<its 40-hex id> bash dev/checks/gpu-session.sh." \
    | tee -a "$OUT/gpu-session.log" >&2
  exit 2
fi
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}  # deterministic cuBLAS: set before any process starts it
timeout --kill-after=20 "$limit" "${PYTHON:-python3}" -u dev/checks/gpu_session.py --out "$OUT" --limit "$((limit - 20))" "$@"
status=$?
[ "$status" = 124 ] && echo "[gpu-session] the command reached its limit of $limit s" >> "$OUT/gpu-session.log"
exit "$status"
