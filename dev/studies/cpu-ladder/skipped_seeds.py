"""The 19M recipe probe's skipped seeds, on the commit the probe's other seeds ran from (docs/gpu-study.md, note of
2026-12-06): every candidate was rejected before all four seeds ran, and the rule's best of them needs their means
over seeds 0-3. Each NAME:SEED is trained and evaluated by that commit's own `engine.runtime.cpu_ladder.piece`
(checkpointed every 100 steps, resumed by running the same command again), one after another, and cached; the probe
of a later commit (`cpu_ladder probe`, whose `below_bar` stage stops once the best is certain) then reads them back
without computing. Run it with that commit's worktree first on the path:

    cd /work/ladder-wt && PYTHONPATH=/work/ladder-wt OMP_NUM_THREADS=2 nohup python -u \
        /work/main/dev/studies/cpu-ladder/skipped_seeds.py R1:2 R1:3 R2:2 R2:3 R3:1 R3:2 R3:3 > skipped.log 2>&1 &
"""

import sys
import time

from engine.core.presets import study_root
from engine.core.store import Store
from engine.experiments.ladder import recipe_score
from engine.runtime.cpu_ladder import PRESET, candidate, piece, say

RESULTS = "/work/ladder-results"

if __name__ == "__main__":
    store = Store(study_root(RESULTS, PRESET))
    for spec in sys.argv[1:]:
        name, seed = spec.split(":")
        cfg = candidate(name)
        key = cfg.run_key(int(seed))
        state = "cached" if store.status(key) == "ok" else "training"
        say(f"{name} seed {seed} ({cfg.model.n_params:,} parameters, run {key}): {state}")
        t0 = time.monotonic()
        piece(cfg, int(seed), store)
        score = recipe_score(store.load_rows(key))
        say(f"{name} seed {seed}: held-out accuracy at T {score:.4f} ({time.monotonic() - t0:.0f} s)")
