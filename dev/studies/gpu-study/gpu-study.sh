#!/usr/bin/env bash
# The GPU study's pieces (docs/gpu-study.md, "How to run it"), one bounded command each on a bare GPU machine:
# torch, pandas, scipy, pyarrow, safetensors and tqdm there, nothing installed, the repository run in place. A piece
# computes into cached_results/gpu/ (what earlier pieces brought back travels with the tree and is skipped), then
# packs what may come back into $OUT: gpu-study-PIECE.tar.gz (for `loopscope merge`), gpu-study-PIECE.json (the
# summary: each group's memory estimate, FLOPs, wall and rate; the tables' reports and verdicts) and the log.
#
#   LOOPSCOPE_COMMIT=<commit> bash dev/studies/gpu-study/gpu-study.sh recipe|ladder|norm|none|e3|chain-c1|chain-c2
#                                                                  # on the GPU machine (at most 8 minutes; refused
#                                                                  # without .git or LOOPSCOPE_COMMIT)
#   GPU_STUDY_SIZE=smoke bash dev/studies/gpu-study/gpu-study.sh PIECE                    # a dry run on the CPU at gpu-smoke size
#
# GPU_STUDY_LIMIT (seconds, default 450) bounds the computation; the pack takes seconds after it. GPU_STUDY_BUDGET
# (default 300): no group starts after it. GPU_STUDY_RESULTS: the results folder (default cached_results; a dry run's
# default is /tmp/gpu-study-smoke-results, so nothing of it lands in cached_results).
set -uo pipefail
cd "$(dirname "$0")/../../.."
piece=${1:-}
case "$piece" in
  recipe|ladder|norm|none|e3|chain-c1|chain-c2) ;;
  *) echo "name a piece: recipe, ladder, norm, none, e3, chain-c1 or chain-c2" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/gpu-study}
mkdir -p "$OUT"
preset=gpu device=cuda size=paper results=${GPU_STUDY_RESULTS:-cached_results}
if [ "${GPU_STUDY_SIZE:-}" = smoke ]; then
  preset=gpu-smoke device=cpu size=smoke results=${GPU_STUDY_RESULTS:-/tmp/gpu-study-smoke-results}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # tiny models: one thread (two on a shared 2-core machine: 40x slower)
fi
limit=${GPU_STUDY_LIMIT:-450} budget=${GPU_STUDY_BUDGET:-300}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/loopscope/inductor}
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}  # deterministic cuBLAS (engine.core.train.gpu_determinism)
log="$OUT/gpu-study-$piece.log"
{ date -u +%FT%TZ; git rev-parse HEAD 2>/dev/null || echo "commit ${LOOPSCOPE_COMMIT:-unknown: no .git here and LOOPSCOPE_COMMIT unset} (no .git here)"
  nvidia-smi 2>/dev/null | head -15; } > "$log"
if [ "$device" = cuda ] && [ ! -e .git ] && ! [[ "${LOOPSCOPE_COMMIT:-}" =~ ^[0-9a-f]{40}$ ]]; then
  echo "[gpu-study] not started: this tree has no .git and LOOPSCOPE_COMMIT does not name the commit it was sent" \
    "from; send a clean commit's tree and run LOOPSCOPE_COMMIT=<its 40-hex id> bash dev/studies/gpu-study/gpu-study.sh $piece." \
    | tee -a "$log" >&2
  exit 2
fi
if [ "$piece" = recipe ]; then  # the recipe probe: R1-R3 on the 19M model (engine.core.presets.GPU_RECIPES)
  timeout "$limit" python3 -u dev/studies/gpu-study/gpu_recipe.py --out "$OUT" --device "$device" --size "$size" --budget "$budget" \
    >> "$log" 2>&1
  status=$?
else
  timeout "$limit" python3 -u -m engine.runtime.gpu_study run "$piece" --preset "$preset" --results "$results" \
    --device "$device" --budget "$budget" --limit "$limit" --out "$OUT" >> "$log" 2>&1
  status=$?
  [ "$status" = 124 ] && echo "[gpu-study] the computation reached its limit of $limit s; packing what finished" >> "$log"
  python3 -m engine.runtime.gpu_pack "$piece" --preset "$preset" --results "$results" --out "$OUT" >> "$log" 2>&1
  packed=$?
  [ "$status" = 0 ] && status=$packed
fi
tail -n 40 "$log"
exit "$status"
