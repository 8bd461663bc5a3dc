"""The GPU study's recipe probe (README, "The GPU study: predictions and rules"; written before it ran).

On the 19M rung (the `paper` model), `norm`-trained, seeds 0-3 as one group, the second study's parity task:
candidates in order R1 (the `cpu` recipe), R2 (lr 5e-4), R3 (4,000 steps, lr 5e-4). The first whose mean
held-out accuracy at n = T is >= 0.95 is adopted; later candidates are then not run. Nothing the claims
measure (the `none` mode, the surgery, n != T) enters the choice. A candidate does not start once
`--budget` seconds have passed (the GPU machine's command limit).

    python dev/studies/gpu-study/gpu_recipe.py --out DIR [--device cuda]
        [--size smoke (a dry run of the logic on the CPU)]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from engine.core.presets import GPU_RECIPES, PAPER_MODEL, SECOND_STUDY_PARITY, RunConfig  # noqa: E402
from engine.experiments.search import run_candidate  # noqa: E402

RULE = 0.95
SEEDS = (0, 1, 2, 3)


def candidates(size: str) -> dict[str, RunConfig]:
    """R1-R3 as engine.core.presets.GPU_RECIPES defines them (the `gpu` preset reads the same), seeds 0-3 as one
    group; at `smoke` the same logic at a size the CPU runs in seconds."""
    model, task, scale = PAPER_MODEL, SECOND_STUDY_PARITY, {}
    if size == "smoke":
        model = replace(model, d_model=32, n_heads=2, d_ff=96, layers_per_block=1)
        task = replace(task, eval_examples=64)
        scale = dict(warmup_steps=5)
    out = {}
    for name, train in GPU_RECIPES.items():
        steps = train.steps // 100 if size == "smoke" else train.steps  # R3 stays twice R1's length
        train = replace(train, group_size=len(SEEDS), steps=steps, **scale)
        out[name] = RunConfig(model, task, train, max_eval_loops=3 * model.trained_loops)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="paper", choices=["paper", "smoke"])
    ap.add_argument("--budget", type=float, default=330.0, help="seconds after which no candidate starts")
    args = ap.parse_args()
    out, start = Path(args.out), time.time()
    out.mkdir(parents=True, exist_ok=True)
    adopted, scores = None, {}
    for name, run in candidates(args.size).items():
        path = out / f"recipe-{name}.json"
        if time.time() - start > args.budget:
            print(f"budget spent: {name} not started", flush=True)
            break
        print(f"{time.strftime('%H:%M:%S')} start {name} ({run.model.n_params:,} parameters)", flush=True)
        r = run_candidate(name, run, RULE, SEEDS, args.device)
        path.write_text(json.dumps(r, indent=1))
        print(f"{time.strftime('%H:%M:%S')} {name}: held-out accuracy at T {r['score']} by length "
              f"{r['acc_at_T_by_k']}, train {r['train_wall_s']} s, all {r['wall_s']} s", flush=True)  # fmt: skip
        scores[name] = r["score"]
        if r["qualifies"]:
            adopted = name
            break
    best = max(scores, key=scores.get) if scores else None
    print(f"adopted: {adopted}" if adopted else f"adopted: {best} (none reached {RULE}: the best of those run, "
          'labelled "recipe below the bar")' if best else "adopted: none (no candidate ran)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
