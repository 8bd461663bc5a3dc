"""The GPU study's recipe probe (README, "The GPU study: predictions and rules"; written before it ran).

On the 19M rung (the `paper` model), `norm`-trained, seeds 0-3 as one group, the second study's parity task:
candidates in order R1 (the `cpu` recipe), R2 (lr 5e-4), R3 (4,000 steps, lr 5e-4). The first whose mean
held-out accuracy at n = T is >= 0.95 is adopted; later candidates are then not run. Nothing the claims
measure (the `none` mode, the surgery, n != T) enters the choice. A candidate does not start once
`--budget` seconds have passed (the GPU machine's command limit).

    python dev/gpu_recipe.py --out DIR [--device cuda] [--size smoke (a dry run of the logic on the CPU)]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chain_search import run_candidate, slug  # noqa: E402
from recipe_probe import PARITY  # noqa: E402

from engine.core.model import ModelConfig  # noqa: E402
from engine.core.presets import RunConfig, TrainConfig  # noqa: E402
from engine.core.tasks import VOCAB_SIZE  # noqa: E402

RULE = 0.95
SEEDS = (0, 1, 2, 3)
PAPER_MODEL = ModelConfig(VOCAB_SIZE, d_model=512, n_heads=8, d_ff=1376, layers_per_block=6, trained_loops=4)
R1 = TrainConfig(steps=2000, batch_size=64, lr=1e-3, group_size=4)  # the `cpu` recipe, in groups of 4 seeds


def candidates(size: str) -> dict[str, RunConfig]:
    model, task, train = PAPER_MODEL, PARITY, R1
    if size == "smoke":  # the same logic at a size the CPU runs in seconds
        model = replace(model, d_model=32, n_heads=2, d_ff=96, layers_per_block=1)
        task = replace(task, eval_examples=64)
        train = replace(train, steps=20, warmup_steps=5)
    out = {
        "R1 cpu recipe": replace(train),
        "R2 lr 5e-4": replace(train, lr=5e-4),
        "R3 4000 steps lr 5e-4": replace(train, lr=5e-4, steps=2 * train.steps),
    }
    return {name: RunConfig(model, task, t, max_eval_loops=3 * model.trained_loops) for name, t in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="paper", choices=["paper", "smoke"])
    ap.add_argument("--budget", type=float, default=330.0, help="seconds after which no candidate starts")
    args = ap.parse_args()
    out, start = Path(args.out), time.time()
    out.mkdir(parents=True, exist_ok=True)
    adopted = None
    for name, run in candidates(args.size).items():
        path = out / f"recipe-{slug(name)}.json"
        if time.time() - start > args.budget:
            print(f"budget spent: {name} not started", flush=True)
            break
        print(f"{time.strftime('%H:%M:%S')} start {name} ({run.model.n_params:,} parameters)", flush=True)
        r = run_candidate(name, run, RULE, SEEDS, args.device)
        path.write_text(json.dumps(r, indent=1))
        print(f"{time.strftime('%H:%M:%S')} {name}: held-out accuracy at T {r['score']} by length "
              f"{r['acc_at_T_by_k']}, train {r['train_wall_s']} s, all {r['wall_s']} s", flush=True)  # fmt: skip
        if r["qualifies"]:
            adopted = name
            break
    print(f"adopted: {adopted or 'none (the best of the run candidates is adopted, labelled below the bar)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
