"""E3: readout refit. Norm-trained E2 models run without the norm; the loop is frozen and the readout
refit (engine.experiments.refit) over a schedule of steps; recovery = (refit - removed) / (original - removed).

Table `e3-<preset>`: RESULT_COLUMNS + `refit_target`, `refit_steps`, `split`; metrics `accuracy` and `recovery`.
  accuracy  per difficulty, n = 1..3T: the original model in norm mode (boundary `norm`, refit_target
            `original`, refit_steps 0) and every refit checkpoint in none mode (boundary `norm->none`;
            refit_steps 0 is the model with the norm removed, the same for every target)
  recovery  n = T..3T, per difficulty, and at difficulty 0 (= IN_RANGE) from the seed's accuracies
            averaged over the in-range difficulties first; NaN where original - removed < 0.05
Targets that name the same parameters (a 1-layer block: first = middle = last) are computed and stored
once, under the first requested name; summaries list the others in `same_as`.

Cache: <root>/refits/<refit_key>/{refit-<sha>.safetensors, rows-<sha>.parquet, manifest.json}, one folder
per seed, keyed on (run_key, RefitConfig), written and verified like a run (engine.core.store); a corrupt or
missing folder is redone. Refits run in whole training groups (RunConfig.group), like training.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save as save_safetensors

from engine.core import stats, tasks
from engine.core.presets import RunConfig, preset, train_ranges
from engine.core.store import ROWS, Store, parquet_bytes, provenance
from engine.core.tasks import TASK_NAMES
from engine.experiments import refit as rf
from engine.experiments import verdicts
from engine.experiments.runs import (
    REFIT_COLUMNS,
    check_study_precision,
    ensure_runs,
    group_id,
    load_models,
    refit_store,
)
from engine.experiments.verdicts import IN_RANGE, Claim, plateaued

TITLE = "readout refit"
TASKS = TASK_NAMES
COLUMNS = list(REFIT_COLUMNS)
ORIGINAL, STATE = "original", "refit.safetensors"
REFIT = {
    "smoke": rf.RefitConfig(schedule=(0, 25, 50, 100, 200, 400), lr=3e-3),
    "cpu": rf.RefitConfig(targets=("head", "head+last", "head+first"), schedule=(0, 50, 100, 200, 400, 800)),
    "cpu-1layer": rf.RefitConfig(schedule=(0, 50, 100, 200, 400, 800, 1600)),
    "paper": rf.RefitConfig(schedule=(0, 100, 200, 400, 800, 1600, 3200, 6400), lr=5e-4),
    # the GPU study: the second CPU study's refit, its head and head + last layer (docs/gpu-study.md)
    "gpu": rf.RefitConfig(targets=("head", "head+last"), schedule=(0, 50, 100, 200, 400, 800)),
    "gpu-smoke": rf.RefitConfig(targets=("head", "head+last"), schedule=(0, 5, 10, 20), lr=3e-3),
}


def refit_key(run_key: str, cfg: rf.RefitConfig) -> str:
    blob = json.dumps({"run_key": run_key, "refit": asdict(cfg)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def grid_rows(grid: torch.Tensor, metric: str, target: str, steps: int, loops, difficulties):
    """(difficulties, loops, S) values -> rows with member, difficulty, eval_loops, metric, value, ..."""
    d, n, m = np.meshgrid(difficulties, loops, np.arange(grid.shape[-1]), indexing="ij")
    boundary = "norm" if target == ORIGINAL else "norm->none"
    return pd.DataFrame(
        dict(member=m.ravel(), difficulty=d.ravel(), eval_loops=n.ravel(), metric=metric)
        | dict(value=np.asarray(grid, dtype=float).ravel(), boundary=boundary, refit_target=target, refit_steps=steps)
    )


def refit_group(model, run: RunConfig, keys: list[str], seeds: list[int], cfg: rf.RefitConfig, device, progress,
                results: dict[str, rf.RefitResult] | None = None):  # fmt: skip
    """Evaluate original and removed, refit each distinct target (unless `results` has it already: a
    refit depends only on the group, its target and cfg); rows and refit weights per seed."""
    n_max, T, diffs = run.max_eval_loops, run.model.trained_loops, run.task.eval_difficulties
    inside = [i for i, d in enumerate(diffs) if d in run.task.train_difficulties]
    original = rf.accuracy_grid(model.to(device), run, n_max, "norm")
    removed = rf.accuracy_grid(model, run, n_max, "none")
    frames, loops = [grid_rows(original, "accuracy", ORIGINAL, 0, range(1, n_max + 1), diffs)], range(T, n_max + 1)
    aliases = rf.distinct_targets(cfg.targets, run.model.layers_per_block)
    given = results or {}
    results = {t: given[t] if t in given else rf.refit(model, run, seeds, t, cfg, n_max, device, progress)
               for t in aliases}  # fmt: skip
    for target, res in results.items():
        for steps, grid in {0: removed, **res.grids}.items():
            frames.append(grid_rows(grid, "accuracy", target, steps, range(1, n_max + 1), diffs))
            g, r, o = (x[:, T - 1 :] for x in (grid, removed, original))
            frames.append(grid_rows(rf.recovery(g, r, o), "recovery", target, steps, loops, diffs))
            means = [x[inside].mean(0, keepdim=True) for x in (g, r, o)]
            frames.append(grid_rows(rf.recovery(*means), "recovery", target, steps, loops, [IN_RANGE]))
    raw = pd.concat(frames, ignore_index=True)
    splits = {d: tasks.split_of(run.task, d) for d in diffs}
    splits[IN_RANGE] = "heldout" if all(splits[d] == "heldout" for d in run.task.train_difficulties) else "seen"
    rows = raw.assign(
        split=raw["difficulty"].map(splits),
        experiment="e3",
        run_key=np.asarray(keys)[raw["member"]],
        seed=np.asarray(seeds)[raw["member"]],
        task=run.task.name,
        arch=run.model.arch,
        trained_loops=T,
    )
    states = [{f"{t}/{n}": res.state[n][i].clone() for t, res in results.items() for n in res.names}
              for i in range(len(seeds))]  # fmt: skip
    return rows[COLUMNS], states, results, aliases


def refit_and_store(store: Store, keys: list[str], cfg: rf.RefitConfig, device="cpu", progress=True,
                    results: dict[str, rf.RefitResult] | None = None) -> None:  # fmt: skip
    """Refit one training group of stored runs (E2 norm models of one config) and cache the refits that are
    missing (the others equal them: a refit depends only on its group, target and config). The caller
    holds the group's refit lock."""
    model, loaded, seeds = load_models(store, keys)
    rows, states, results, aliases = refit_group(model, loaded, keys, seeds, cfg, device, progress, results)
    cache, prov, todo = refit_store(store), provenance(device), set(missing_refits(keys, cfg, store))
    for i, (key, seed) in enumerate(zip(keys, seeds, strict=True)):
        if key not in todo:
            continue
        manifest = dict(experiment="e3", run_key=key, seed=seed, refit=asdict(cfg), computed_targets=aliases)
        manifest |= {"group": seeds, "task": loaded.task.name, **prov}
        manifest["wall_time_s"] = {t: round(r.wall_s, 2) for t, r in results.items()}
        manifest["final_loss"] = {t: float(r.losses[-1, i]) for t, r in results.items()}
        manifest["loss_curve"] = {t: [round(float(v), 5) for v in r.losses[::50, i]] for t, r in results.items()}
        blobs = {STATE: save_safetensors(states[i]), ROWS: parquet_bytes(rows[rows["run_key"] == key][COLUMNS])}
        cache.commit(refit_key(key, cfg), {**manifest, "refit_key": refit_key(key, cfg)}, blobs)


def refit_lock(run: RunConfig, group: list[int], cfg: rf.RefitConfig) -> str:
    return "refit-" + refit_key(group_id(run, group), cfg)


def refit_runs(run: RunConfig, seeds, store: Store, cfg: rf.RefitConfig, device="cpu", progress=True):
    """Train the norm runs if missing (as E2's), refit what is not cached, always in whole training groups;
    return the seeds' rows."""
    seeds = list(seeds)
    for group in run.groups(seeds):
        wanted = [run.run_key(s) for s in group if s in seeds]
        if not missing_refits(wanted, cfg, store):
            continue
        keys = ensure_runs(run, group, store, "e2", device, progress=progress)
        with store.lock(refit_lock(run, group, cfg), f"refitting seeds {group[0]}-{group[-1]} of {run.task.name}"):
            if missing_refits(wanted, cfg, store, report=True):
                refit_and_store(store, keys, cfg, device, progress)
    cache = refit_store(store)
    return pd.concat([cache.load_rows(refit_key(run.run_key(s), cfg)) for s in seeds], ignore_index=True)


def missing_refits(keys: list[str], cfg: rf.RefitConfig, store: Store, report: bool = False) -> list[str]:
    """The run keys whose refits under cfg are not cached (valid) yet; `report` names the damaged ones."""
    cache, todo = refit_store(store), []
    for key in keys:
        status = cache.status(refit_key(key, cfg))
        if report and status not in ("ok", "missing"):
            print(f"loopscope: refit of {key}: {status}; redoing it.", file=sys.stderr)
        todo += [key] if status != "ok" else []
    return todo


def refit_config(preset_name: str) -> rf.RefitConfig:
    return REFIT.get(preset_name, rf.RefitConfig())


def trainings(preset_name: str, tasks=TASKS) -> list[tuple[RunConfig, str]]:
    """The models E3 refits: E2's norm-trained ones (trained as E2's if E2 has not run)."""
    return [(preset(preset_name, task, "norm"), "e2") for task in tasks]


def run(
    preset_name: str, seeds: list[int], store: Store, device: str = "cpu", tasks=TASKS, progress: bool = True,
    refit_cfg: rf.RefitConfig | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Refit the norm models of each task (training them first if E2 has not); write the e3 table."""
    cfg = refit_cfg or refit_config(preset_name)
    check_study_precision(store, preset_name, [run for run, _ in trainings(preset_name, tasks)])
    rows = [refit_runs(run, seeds, store, cfg, device, progress) for run, _ in trainings(preset_name, tasks)]
    rows = pd.concat(rows, ignore_index=True)
    store.write_table(f"e3-{preset_name}", rows)
    return rows


# ---------------------------------------------------------------- summaries and claims


LEVELS = ("in-range", "beyond", "all")  # difficulty levels of seed_values/curves, besides one difficulty
CURVE = ["task", "refit_target", "refit_steps", "eval_loops"]  # one summary row per curve point


def seed_values(rows: pd.DataFrame, preset_name: str, metric: str = "recovery", level="in-range") -> pd.DataFrame:
    """One value per seed and (task, refit_target, refit_steps, eval_loops).

    recovery: as stored (NaN where guarded); level "in-range" is the recovery of the seed's accuracies
    averaged over the in-range difficulties (stored at difficulty IN_RANGE), an int one difficulty's; the
    beyond and all levels are not defined (a mean of per-difficulty recoveries is not a recovery).
    accuracy: averaged over the level's difficulties ("in-range", "beyond", "all" or one difficulty); the
    original model in norm mode is the target `original` at step 0."""
    if metric == "recovery":
        if level != "in-range" and (level in LEVELS or int(level) == IN_RANGE):
            raise ValueError(f"recovery is stored for the in-range mean and single difficulties, not {level!r}.")
        difficulty = IN_RANGE if level == "in-range" else int(level)
        picked = rows[(rows["metric"] == "recovery") & (rows["difficulty"] == difficulty)]
    elif metric == "accuracy":
        picked = rows[rows["metric"] == "accuracy"]
        if level in LEVELS:
            ranged = stats.with_range(picked, train_ranges(preset_name, picked["task"].unique()))
            picked = picked[ranged["range"] == level] if level != "all" else picked
        else:
            picked = picked[picked["difficulty"] == int(level)]
    else:
        raise ValueError(f"metric must be recovery or accuracy, got {metric!r}.")
    return picked.groupby([*CURVE, "seed"], as_index=False)["value"].mean()  # all-NaN (guarded) stays NaN


def curves(
    rows: pd.DataFrame, preset_name: str, metric: str = "recovery", level="in-range", layers: int | None = None
) -> pd.DataFrame:
    """Per task x target x refit_steps x n: mean [95% bootstrap CI over seeds] of seed_values() (guarded
    seeds left out: n_guarded counts them; all guarded: NaN), plateau of the mean over refit steps
    (plateaued), and same_as: the targets that coincide with it (block layers from the preset unless
    `layers` is given)."""
    per_seed = seed_values(rows, preset_name, metric, level)
    summary = stats.mean_ci(per_seed.dropna(subset=["value"]), CURVE)
    guarded = per_seed.groupby(CURVE)["value"].agg(lambda v: int(v.isna().sum())).rename("n_guarded").reset_index()
    summary = guarded.merge(summary, on=CURVE, how="left").assign(n=lambda d: d["n"].fillna(0).astype(int))
    curve = ["task", "refit_target", "eval_loops"]
    flags = summary.set_index("refit_steps").groupby(curve)["mean"].apply(plateaued).rename("plateau").reset_index()
    summary = summary.merge(flags, on=curve)
    same = {}
    for task in summary["task"].unique():
        block = layers or preset(preset_name, task).model.layers_per_block
        for target, names in rf.distinct_targets(rf.TARGETS, block).items():
            same[(task, target)] = ", ".join(n for n in names if n != target)
    return summary.assign(same_as=[same.get(k, "") for k in zip(summary["task"], summary["refit_target"], strict=True)])


def summarize(rows: pd.DataFrame, preset_name: str, layers: int | None = None) -> pd.DataFrame:
    """curves() of the in-range recovery, with the in-range accuracies of the original, the removed and
    the refit model (seed means) and `pooled` (recovery of those seed-mean accuracies)."""
    summary = curves(rows, preset_name, "recovery", "in-range", layers)
    acc = rows[rows["metric"] == "accuracy"]
    acc = stats.with_range(acc, train_ranges(preset_name, acc["task"].unique()))
    acc = acc[acc["range"] == "in-range"].groupby(CURVE)["value"].mean().rename("acc_refit").reset_index()
    fixed, orig = ["task", "eval_loops"], acc["refit_target"] == ORIGINAL
    for name, part in (("acc_original", acc[orig]), ("acc_removed", acc[~orig & (acc["refit_steps"] == 0)])):
        summary = summary.merge(part.groupby(fixed)["acc_refit"].mean().rename(name).reset_index(), on=fixed)
    summary = summary.merge(acc[~orig], on=CURVE, how="left")
    pooled = rf.recovery(summary["acc_refit"], summary["acc_removed"], summary["acc_original"])
    summary = summary.assign(pooled=pooled)  # the ratio of seed means: steadier when the gap is small
    order = ["n_guarded", "mean", "ci_low", "ci_high", "n", "ci_method", "acc_original", "acc_removed", "acc_refit"]
    return summary[[*CURVE, *order, "pooled", "plateau", "same_as"]]


def final(summary: pd.DataFrame) -> pd.DataFrame:
    """The rows of a summarize()/curves() table at each (task, target, n)'s last refit step."""
    last = summary.groupby(["task", "refit_target", "eval_loops"])["refit_steps"].transform("max")
    return summary[summary["refit_steps"] == last]


def at(summary: pd.DataFrame, task: str, target: str, n: int) -> pd.Series | None:
    """The summary row of (task, target) at n and the last refit step, or None."""
    s = summary[(summary["task"] == task) & (summary["refit_target"] == target) & (summary["eval_loops"] == n)]
    return None if s.empty else s.sort_values("refit_steps").iloc[-1]


def claims(rows: pd.DataFrame, preset_name: str) -> list[Claim]:
    """E3 by docs/design.md's verdict rules (engine.experiments.verdicts.e3_claims) at n = T after the last refit step,
    at the held-out mean and the hardest held-out difficulty; a table without held-out items is judged on its
    in-range ones."""
    return verdicts.e3_claims(verdicts.judged_items(rows, train_ranges(preset_name, rows["task"].unique())))


def format_summary(summary: pd.DataFrame) -> str:
    lines = []
    for task, s in summary.groupby("task", sort=False):
        T = int(s["eval_loops"].min())
        first = s[s["eval_loops"] == T].iloc[0]
        seeds = int(first["n"] + first["n_guarded"])
        lines.append(
            f"\n{task}: recovery at n = T = {T}, in-range mean, {seeds} seeds, 95% "
            f"bootstrap CI (original {first['acc_original']:.3f}, norm removed {first['acc_removed']:.3f})"
        )
        lines.append(f"{'target  steps':<14}" + "".join(f"{int(k):>7d}" for k in sorted(s["refit_steps"].unique())))
        for target, c in s[s["eval_loops"] == T].groupby("refit_target", sort=False):
            c = c.sort_values("refit_steps")
            last, note = c.iloc[-1], f"  (= {c['same_as'].iloc[0]})" if c["same_as"].iloc[0] else ""
            lines.append(
                f"{target:<14}" + "".join(f"{v:7.3f}" for v in c["mean"])
                + f"  [{last['ci_low']:.3f}, {last['ci_high']:.3f}]  pooled {last['pooled']:.3f}"
                + f"  plateau {'yes' if last['plateau'] else 'no'}{note}"
            )  # fmt: skip
        lines.append("at the last step, by n:" + "".join(f"{n:>7d}" for n in sorted(s["eval_loops"].unique())))
        for target, c in s[s["refit_steps"] == s["refit_steps"].max()].groupby("refit_target", sort=False):
            lines.append(f"{target:<23}" + "".join(f"{v:7.3f}" for v in c.sort_values("eval_loops")["mean"]))
    return "\n".join(lines)


def report(rows: pd.DataFrame, preset_name: str) -> str:
    """What `loopscope run e3` prints: the recovery table, then the verdicts."""
    return "\n".join([format_summary(summarize(rows, preset_name)), *verdicts.lines(claims(rows, preset_name))])
