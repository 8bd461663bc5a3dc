"""The second CPU design's recipe (docs/design.md §7.4), chosen only on `norm`-trained held-out accuracy at n = T.

Rule (dev/LOG.md, written before it ran): per task, the first candidate in order whose mean accuracy at
n = T = 4 over its held-out training difficulties (2 seeds) is >= 0.95 sets the task's recipe. Nothing
the claims measure (the `none` mode, the surgery, n != T) enters the choice.

    cd dev/studies/cpu-second-design
    python recipe_probe.py --lane 0 & python recipe_probe.py --lane 1
    python recipe_probe.py --report
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch
from chain_search import MODEL, OUT, TRAIN, cfg, run_candidate, slug

from engine.core.presets import SECOND_STUDY_PARITY as PARITY
from engine.core.tasks import TaskConfig

RULE = 0.95
ORDERED = TaskConfig(
    "chain", (1, 2, 3, 4), tuple(range(1, 9)), chains=1, variables=12, order="ordered", holdout=0.5, eval_examples=512
)
TRAIN64 = replace(TRAIN, batch_size=64)
CANDIDATES = {
    "P1 parity 2000 steps": cfg(PARITY, MODEL, TRAIN64),
    "Q1 ordered-chain 2000 steps": cfg(ORDERED, MODEL, TRAIN64),
    "P2 parity 3000 steps": cfg(PARITY, MODEL, replace(TRAIN64, steps=3000)),
    "Q2 ordered-chain 3000 steps": cfg(ORDERED, MODEL, replace(TRAIN64, steps=3000)),
}


def lane(i: int) -> None:
    torch.set_num_threads(1)
    OUT.mkdir(exist_ok=True)
    for name, run in list(CANDIDATES.items())[i::2]:
        path = OUT / f"{slug(name)}.json"
        if not path.exists():
            print(f"{time.strftime('%H:%M:%S')} start {name}", flush=True)
            path.write_text(json.dumps(run_candidate(name, run, RULE), indent=1))
        if json.loads(path.read_text())["qualifies"]:
            return  # this task has its recipe: the next candidate of the lane is the same task's fallback


def report() -> None:
    for name in CANDIDATES:
        path = OUT / f"{slug(name)}.json"
        r = json.loads(path.read_text()) if path.exists() else None
        print(f"{name}: " + (f"score {r['score']} by difficulty {r['acc_at_T_by_k']}" if r else "not run"))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--lane", type=int)
    p.add_argument("--report", action="store_true")
    a = p.parse_args()
    report() if a.report else lane(a.lane)
