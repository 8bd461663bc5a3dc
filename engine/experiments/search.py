"""A candidate recipe or task scored by a rule fixed before it runs: its norm-trained models' mean accuracy at n = T
over held-out items, and nothing the claims measure (the `none` mode, the surgery, n != T). The CPU's chain search
and recipe probe (dev/studies/cpu-second-design/), the GPU study's recipe probe
(dev/studies/gpu-study/gpu_recipe.py) and its chain search (engine.runtime.gpu_study) score their candidates
with run_candidate."""

from __future__ import annotations

import time

from engine.core.evaluate import evaluate
from engine.core.presets import RunConfig
from engine.core.tasks import split_of
from engine.core.train import train_group


def run_candidate(name: str, run: RunConfig, rule: float, seeds=(0, 1), device: str = "cpu", scored=None) -> dict:
    """Train `seeds` as one group in `run`'s mode and score the mean accuracy at n = T over the held-out items of
    the `scored` difficulties (default: every held-out training difficulty); `qualifies` is score >= rule."""
    t0 = time.time()
    result = train_group(run, list(seeds), device, progress=False)
    rows = evaluate(result.model, run.task, run.max_eval_loops, run.model.boundary, progress=False)
    acc = rows[rows.metric == "accuracy"]
    at_t = acc[acc.eval_loops == run.model.trained_loops]
    per_k = at_t.groupby("difficulty")["value"].mean()
    held = [d for d in run.task.train_difficulties if split_of(run.task, d) == "heldout"]
    scored = [d for d in (scored or held) if d in held]
    score = float(per_k.loc[scored].mean())
    return {
        "name": name,
        "config": run.to_dict(),
        "params": run.model.n_params,
        "seeds": list(seeds),
        "wall_s": round(time.time() - t0, 1),
        "train_wall_s": round(result.wall_s, 1),
        "device": result.device,
        "dtype_policy": result.policy,
        "final_loss": [round(float(v), 4) for v in result.losses[-1]],
        "scored_difficulties": scored,
        "acc_at_T_by_k": {int(k): round(float(v), 4) for k, v in per_k.items()},
        "acc_at_T_by_seed_k": {
            f"{m}:{k}": round(float(v), 4) for (m, k), v in at_t.set_index(["member", "difficulty"])["value"].items()
        },
        "acc_by_n_hardest": {
            int(n): round(float(v), 4)
            for n, v in acc[acc.difficulty == max(scored)].groupby("eval_loops").value.mean().items()
        },
        "score": round(score, 4),
        "rule": rule,
        "qualifies": score >= rule,
    }
