"""The chain-task search of the second CPU design (docs/design.md §7.2; dev/LOG.md, 2026-12-03, written before it ran).

Candidates run in the order listed, on two lanes of one thread each (lane i takes candidates i, i+2, ...);
each trains 2 seeds (one group) `norm`-mode at T = 4 and is scored on the held-out items of k = 1..4 at
n = T. Adopted: the first candidate in list order whose mean over both seeds and k = 1..4 is >= 0.90.
No candidate starts after the budget (90 min wall on the 2 cores) is spent. Only C1-C4 fit the study's
budget and can be adopted; C5 and C6 (2x and 4x the steps) say whether more training opens retrieval.

    cd dev/studies/cpu-second-design
    python chain_search.py --lane 0 & python chain_search.py --lane 1
    python chain_search.py --report
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from engine.core.model import ModelConfig
from engine.core.presets import RunConfig, TrainConfig
from engine.core.tasks import VOCAB_SIZE, TaskConfig
from engine.experiments.search import run_candidate

OUT = Path(__file__).parent / "chain_search"
BUDGET_S = 90 * 60
RULE = 0.90
SEEDS = [0, 1]

CHAIN = TaskConfig(
    "chain", (1, 2, 3, 4), (1, 2, 3, 4, 5, 6, 7), chains=3, variables=24, order="layered",
    holdout=0.5, curriculum=0.3, eval_examples=512,
)  # fmt: skip
MODEL = ModelConfig(VOCAB_SIZE, d_model=64, n_heads=4, d_ff=176, layers_per_block=2, trained_loops=4)
TRAIN = TrainConfig(steps=2000, batch_size=32, lr=1e-3)
ADOPTABLE = ("C1", "C2", "C3", "C4")  # sized so that the 16-seed study fits its 4-hour budget; C5, C6 do not


def cfg(task=CHAIN, model=MODEL, train=TRAIN) -> RunConfig:
    return RunConfig(model, task, train, max_eval_loops=12)


SOURCE_FIRST = replace(CHAIN, source_first=True)
CANDIDATES = {
    "C1 source-first": cfg(SOURCE_FIRST),
    "C2 target-first": cfg(CHAIN),
    "C3 source-first lr 3e-3": cfg(SOURCE_FIRST, train=replace(TRAIN, lr=3e-3)),
    "C4 source-first 8 heads lr 3e-3": cfg(SOURCE_FIRST, replace(MODEL, n_heads=8), replace(TRAIN, lr=3e-3)),
    "C5 source-first lr 3e-3 4000 steps": cfg(SOURCE_FIRST, train=replace(TRAIN, lr=3e-3, steps=4000)),
    "C6 source-first lr 3e-3 8000 steps": cfg(SOURCE_FIRST, train=replace(TRAIN, lr=3e-3, steps=8000)),
}


def slug(name: str) -> str:
    return name.split()[0]


def lane(i: int, start: float) -> None:
    torch.set_num_threads(1)
    OUT.mkdir(exist_ok=True)
    for name, run in list(CANDIDATES.items())[i::2]:
        if time.time() - start > BUDGET_S:
            print(f"budget spent: {name} not started", flush=True)
            break
        path = OUT / f"{slug(name)}.json"
        if path.exists():
            continue
        print(f"{time.strftime('%H:%M:%S')} start {name}", flush=True)
        out = run_candidate(name, run, RULE, SEEDS)
        path.write_text(json.dumps(out, indent=1))
        print(f"{time.strftime('%H:%M:%S')} done {name}: score {out['score']} in {out['wall_s']} s", flush=True)


def report() -> None:
    adopted = None
    for name in CANDIDATES:
        path = OUT / f"{slug(name)}.json"
        if not path.exists():
            print(f"{name}: not run")
            continue
        r = json.loads(path.read_text())
        print(f"{name}: score {r['score']} by k {r['acc_at_T_by_k']} loss {r['final_loss']} {r['wall_s']} s")
        if r["qualifies"] and adopted is None and slug(name) in ADOPTABLE:
            adopted = name
    print(f"adopted: {adopted}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--lane", type=int)
    p.add_argument("--start", type=float, default=time.time(), help="the search's start time (epoch s)")
    p.add_argument("--report", action="store_true")
    a = p.parse_args()
    report() if a.report else lane(a.lane, a.start)
    sys.exit(0)
