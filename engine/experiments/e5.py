"""E5, beyond the paper: agreement itself put to the test (docs/design.md, "E5 predictions", in §8).

Four parts on the preset's models, one table `e5-<preset>` (the parts each study runs: its entry in engine.studies):
  1. train mode x run mode  every E2 model (fixed T) run in both modes at n = 1..3T: `norm`, `none`, `norm->none`
                            and the reverse surgery `none->norm` (cached in the E2 runs' folders).
  2. a range of loop counts both modes trained with the loop count drawn per step (train.loops: RANGE_SPECS,
                            uniform over 1..2T and a log-normal Poisson with mean T), the same seeds, both run modes.
  3. where the surgery bites a ladder of model scales (its entry's ladder: width, layers, training length),
                            LADDER_SEEDS seeds each, norm-trained, run with and without the norm.
  4. the rescale surgery    the norm-trained models of parts 1-2 (where a preset runs no part 1-2: every rung of the
                            ladder) run with the boundary norm replaced by fixed per-step scalars (`norm->rescale`;
                            engine.core.model), measured once per run on training data
                            (engine.core.evaluate.state_scales) and stored in its folder (`scales.safetensors`).

The table has ROW_COLUMNS and, from each run's config, `train_loops` (the distribution by name, `fixed:T` for E2's
models), `params` (one model's parameters) and `train_steps`. E2 and E4 tables keep only their own labels, so
the rows E5 adds to E2's runs stay here.

summarize() is one long table, a row per estimate (`part`, `quantity`), levels (i) and (iii) of the verdict rules
(engine.experiments.verdicts.levels; a preset without held-out items, `smoke`, uses its in-range items):
  effects  run, train, agreement: per seed pair (seed s's norm- and none-trained models of one distribution),
           with A(train, run) the accuracy, R = ½[A(norm,none) + A(none,none) − A(norm,norm) − A(none,norm)],
           M = ½[A(none,norm) + A(none,none) − A(norm,norm) − A(norm,none)], G = ½[A(norm,norm) + A(none,none)
           − A(norm,none) − A(none,norm)]; mean with a bootstrap CI over seeds, Wilcoxon signed-rank p against 0,
           Holm across n on each side of T
  range    none-norm: each model run as trained, paired by seed (stats.paired_summary); `in_range` marks the n
           inside a distribution's trained range (trained_range: each drawn at >= IN_RANGE_SHARE of the steps)
  ladder   damage: A(norm) − A(norm->none) per seed, paired; per (params, train_steps)
  rescale  recovery: (A(norm->rescale) − A(norm->none)) / (A(norm) − A(norm->none)) per seed, NaN where the
           surgery cost < paper.MIN_REFIT_GAP (as E3); mean over the other seeds with its CI
  accuracy each boundary label's mean accuracy with its CI (the figures' curves)
claims() applies E5's rules (docs/design.md, "E5 predictions"); each claim says its `outcome` (agreement,
normalisation, mixed, undecided, reported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd

from engine import paper, studies
from engine.core import stats
from engine.core.model import BOUNDARIES
from engine.core.presets import RunConfig, preset, tasks_of
from engine.core.store import ROW_COLUMNS, Store, file_of
from engine.core.tasks import TASK_NAMES
from engine.experiments import verdicts
from engine.experiments.verdicts import HARDEST, MEAN, MIN_DAMAGED, Claim, levels

TITLE = "agreement tested directly (beyond the paper)"
BEYOND = "— (beyond the paper: inferred, never varied)"  # E5's claims have no figure of the paper
TASKS = TASK_NAMES
EXTRA = ["train_loops", "params", "train_steps"]
COLUMNS = [*ROW_COLUMNS, *EXTRA]
CELLS = {label: (label.split("->")[0], label.split("->")[-1]) for label in ("norm", "none", "norm->none", "none->norm")}
EFFECTS = ("run", "train", "agreement")
LEVELS = (MEAN, HARDEST)
LADDER_SEEDS = 4
# the GPU study's rescale rule per rung: undecided unless 3 of its 4 seeds were damaged (docs/gpu-study.md)
RUNG_MIN_DAMAGED = 3
IN_RANGE_SHARE = 0.01  # a loop count is inside a distribution's trained range if drawn at >= 1% of the steps
SMALL_GAP = 0.02  # part 2: |mean d| below this counts as closed
SCALES = "scales.safetensors"  # a run's rescale scalars, beside its weights
SCALE_EXAMPLES = 256  # training items per training difficulty the scalars are measured on
# Each study's E5 parts, ladder rungs (d_model, n_heads, d_ff, layers_per_block, steps as a multiple of the
# preset's; the preset's own model is E2's) and ladder tasks are in its entry (engine.studies). `cpu`: its ladder is
# parity only, a cost-only trim decided before E5 ran (dev/LOG.md, 2026-12-03): reported, not judged. The GPU study
# and its ladder on the CPU run parts 3 and 4 (the ladder and the rescale surgery on every rung): parts 1-2 are not
# in their predictions and would cost far too much at 19M.


def parts(preset_name: str) -> tuple[int, ...]:
    return studies.STUDIES[preset_name].e5_parts if preset_name in studies.STUDIES else (1, 2, 3, 4)


def ladder_only(preset_name: str) -> bool:
    """Whether a preset runs none of parts 1-2 (the GPU study): its E5 is the ladder (and the rescale surgery)."""
    return not {1, 2} & set(parts(preset_name))


def range_specs(T: int) -> tuple[str, ...]:
    """Part 2's distributions for a budget T: uniform over 1..2T, and heavy-tailed with mean T (clipped to 3T)."""
    return (f"uniform:1-{2 * T}", f"lognormal:{T}:{3 * T}")


# A ladder that continues a lower study's (its entry's ladder_partner and `continues`: the GPU study's ladder on the
# CPU continues E5's `cpu` ladder to 412k). Its rules read the lower study's rungs only where both trained with the
# same recipe; else the preset trains those rungs itself, in its own folder, under its own recipe (docs/gpu-study.md:
# "the lower rungs again only if the adopted recipe is not R1").


def continues(preset_name: str) -> str | None:
    """The study whose ladder this one continues (its entry's ladder_partner, where `continues`) where both train
    with the same recipe (the TrainConfig, its group size apart); None where the preset trains those rungs itself,
    or continues none."""
    entry = studies.STUDIES.get(preset_name)
    if entry is None or not entry.continues:
        return None
    lower = entry.ladder_partner
    own, theirs = (replace(preset(p).train, group_size=1) for p in (preset_name, lower))
    return lower if own == theirs else None


def ladder(preset_name: str, task: str) -> list[RunConfig]:
    """Part 3's norm-trained configs, smallest first (none for a task outside its ladder_tasks). A rung that is the
    preset's own model is E2's config (its runs are reused); the others train LADDER_SEEDS seeds as one group. A
    preset that continues a lower study's ladder under another recipe (its entry, continues) trains that study's
    rungs of the common training length first."""
    entry = studies.STUDIES.get(preset_name)
    if entry is None or task not in entry.ladder_tasks or 3 not in entry.e5_parts:
        return []
    base = preset(preset_name, task, "norm")
    specs = entry.ladder
    if entry.continues and continues(preset_name) is None:
        specs = tuple(s for s in studies.STUDIES[entry.ladder_partner].ladder if s[4] == 1) + specs
    out = []
    for d, heads, ff, layers, times in specs:
        model = replace(base.model, d_model=d, n_heads=heads, d_ff=ff, layers_per_block=layers)
        train = replace(base.train, steps=base.train.steps * times)
        if (model, train) != (base.model, base.train):
            train = replace(train, group_size=min(LADDER_SEEDS, base.train.group_size))
        out.append(replace(base, model=model, train=train))
    return out


def trainings(preset_name: str, tasks=TASKS) -> list[tuple[RunConfig, str]]:
    """Per task: E2's two configs (reused, or trained as E2's), part 2's, then the ladder's other rungs; at a preset
    without parts 1-2 (the GPU study) only the ladder, whose rung at the preset's own model is E2's config."""
    out, run_parts = [], parts(preset_name)
    for task in (t for t in tasks if t in tasks_of(preset_name)):
        fixed = [preset(preset_name, task, boundary) for boundary in BOUNDARIES]
        T = fixed[0].model.trained_loops
        ranged = [replace(cfg, train=replace(cfg.train, loops=spec)) for spec in range_specs(T) for cfg in fixed]
        out += [(cfg, "e2") for cfg in fixed if 1 in run_parts] + [(cfg, "e5") for cfg in ranged if 2 in run_parts]
        out += [(cfg, "e2" if cfg in fixed else "e5") for cfg in ladder(preset_name, task) if (cfg, "e2") not in out]
    return out


def rungs(preset_name: str) -> list[RunConfig]:
    """The ladder's own rungs, every task: those that are not E2's config."""
    return [c for task in TASKS for c in ladder(preset_name, task) if c != preset(preset_name, task, "norm")]


def seeds_for(preset_name: str, cfg: RunConfig, seeds) -> list[int]:
    """The seeds a training of trainings() uses: the first LADDER_SEEDS for the ladder's own rungs (at a preset
    without parts 1-2, every rung, E2's model included), else all."""
    return sorted(seeds)[:LADDER_SEEDS] if ladder_only(preset_name) or cfg in rungs(preset_name) else list(seeds)


def rescaled(preset_name: str, cfg: RunConfig) -> bool:
    """Whether part 4 runs on a config's models: the norm-trained models of parts 1-2, or, at a preset without
    them (the GPU study), every rung of the ladder."""
    if cfg.model.boundary != "norm" or 4 not in parts(preset_name):
        return False
    return ladder_only(preset_name) or cfg not in rungs(preset_name)


def ensure(preset_name: str, cfg: RunConfig, label: str, seeds, store: Store, device="cpu", progress=True) -> list[str]:
    """One training of trainings(): train what is missing (`label` owns the runs), evaluate the models in the run
    mode they were not trained in, and the rescale surgery where rescaled() says; return the run keys."""
    from engine.experiments.runs import ensure_runs, ensure_surgery  # training code: only when running

    keys = ensure_runs(cfg, seeds, store, label, device, progress=progress)
    ensure_surgery(store, keys, cfg.max_eval_loops, "e5", device, progress, trained=cfg.model.boundary)
    if rescaled(preset_name, cfg):
        ensure_rescale(store, keys, cfg.max_eval_loops, device, progress)
    return keys


def evaluated(preset_name: str, cfg: RunConfig, rows: pd.DataFrame) -> bool:
    """Whether a trained run's rows hold all that ensure() adds to them: the other run mode at n = 1..max_eval_loops
    and, where rescaled(), the rescale surgery's. A run is trained (its status `ok`) before these are added; three 55k
    seeds were shipped in that gap without them (found 2026-12-06), so cpu_ladder.ship asks this first."""
    from engine.experiments.runs import boundary_label, reaches

    trained = cfg.model.boundary
    labels = [boundary_label(trained, "none" if trained == "norm" else "norm")]
    labels += ["norm->rescale"] if rescaled(preset_name, cfg) else []
    return all(reaches(rows, label, cfg.max_eval_loops) for label in labels)


def run(
    preset_name: str, seeds: list[int], store: Store, device: str = "cpu", tasks=TASKS, progress: bool = True,
    compute: Callable[[RunConfig], bool] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Train what is missing, evaluate every model in the run mode it was not trained in, the rescale surgery
    (ensure); write the e5 table and return its rows. With `compute`, only the configs it picks are computed; the
    others add the runs already stored (the GPU study's pieces, and a table rebuilt from a merged store)."""
    from engine.experiments.runs import check_recipe_adopted, check_study_precision, collect

    check_study_precision(store, preset_name, [cfg for cfg, _ in trainings(preset_name, tasks)])
    computed = [(cfg, label) for cfg, label in trainings(preset_name, tasks) if compute is None or compute(cfg)]
    check_recipe_adopted(store, preset_name, (cfg.run_key(s) for cfg, _ in computed
                                              for s in seeds_for(preset_name, cfg, seeds)))  # fmt: skip
    frames = []
    for cfg, label in trainings(preset_name, tasks):
        wanted = seeds_for(preset_name, cfg, seeds)
        if (cfg, label) in computed:
            keys = ensure(preset_name, cfg, label, wanted, store, device, progress)
        else:
            keys = [key for key in map(cfg.run_key, wanted) if store.status(key) == "ok"]
        extra = dict(train_loops=cfg.train_loops, params=cfg.model.n_params, train_steps=cfg.train.steps)
        frames += [collect(store, keys, "e5").assign(**extra)] if keys else []
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    store.write_table(f"e5-{preset_name}", rows)
    return rows


# ---------------------------------------------------------------- part 4: the rescale surgery's scalars


def load_scales(store: Store, key: str, n: int):
    """A run's stored rescale scalars for steps 1..n as an (n,) tensor, or None if it has none that reach n."""
    from safetensors.torch import load

    if file_of(store.manifest(key)["files"], SCALES) is None:
        return None
    scales = load(store.read(key, SCALES))["scales"]
    return scales[:n] if len(scales) >= n else None


def save_scales(store: Store, key: str, scales, how: dict) -> None:
    """Add (or replace) a run's rescale scalars, (n,), in one atomic step of its folder. The caller holds its lock."""
    from safetensors.torch import save

    manifest = store.manifest(key)
    files = manifest.pop("files")
    keep = {name: sha for name, sha in files.items() if name != file_of(files, SCALES)}
    store.commit(key, manifest | {"state_scales": how}, {SCALES: save({"scales": scales.contiguous()})}, keep)


def ensure_rescale(store: Store, keys: list[str], loops: int, device: str = "cpu", progress: bool = True) -> None:
    """Evaluate norm-trained runs with the rescale surgery at n = 1..loops (`norm->rescale` rows) where that is not
    cached, measuring and storing each run's scalars first if it has none that reach `loops`."""
    from engine.core.evaluate import evaluate, state_scales
    from engine.experiments.runs import label_rows, load_models, reaches

    for key in keys:
        with store.lock(f"run-{key}", f"changing run {key}"):
            if reaches(store.load_rows(key), "norm->rescale", loops):
                continue
            model, cfg, seeds = load_models(store, [key])
            model = model.to(device)
            scales = load_scales(store, key, loops)
            if scales is None:
                scales = state_scales(model, cfg.task, loops, SCALE_EXAMPLES)[:, 0]
                how = dict(mode="norm", loops=loops, examples_per_difficulty=SCALE_EXAMPLES, statistic="mean RMS")
                save_scales(store, key, scales, how)
            raw = evaluate(model, cfg.task, loops, "rescale", progress=progress, scales=scales[:, None])
            store.add_rows(key, label_rows(raw, cfg, seeds, "e5", "rescale"))


# ---------------------------------------------------------------- statistics: pure functions


def trained_range(spec: str, steps: int) -> set[int]:
    """The loop counts a distribution trains: from its smallest draw up, each drawn at >= IN_RANGE_SHARE of the
    `steps` training steps (up to the first that is not: a clipped tail piles up at its maximum)."""
    from engine.core.train import loop_schedule

    shares = pd.Series(loop_schedule(spec, steps)).value_counts(normalize=True)
    n, out = int(shares.index.min()), set()
    while shares.get(n, 0.0) >= IN_RANGE_SHARE:
        out.add(n)
        n += 1
    return out


def seed_accuracy(rows: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Accuracy (or another `metric`) per seed at levels (i) and (iii) (verdicts.levels, per distribution and scale),
    looped models."""
    acc = rows[(rows["metric"] == metric) & (rows["arch"] == "looped")]
    if not (acc["split"] == "heldout").any():  # no held-out items (smoke): the in-range items stand in
        acc = acc.assign(split=acc["split"].replace("seen", "heldout"))
    frames = [levels(g).assign(**dict(zip(EXTRA, k, strict=True))) for k, g in acc.groupby(EXTRA)]
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*EXTRA, "level", "value"])
    return out[out["level"].isin(LEVELS)].drop(columns=["arch", "metric"], errors="ignore")


def decompose(acc: pd.DataFrame) -> pd.DataFrame:
    """Per seed pair: the run-mode, train-mode and agreement effects (module docstring) from the four cells.
    acc: seed_accuracy()'s columns (boundary is the cell); a seed without all four cells is left out.
    Returns the keys, seed, `effect` and `value`."""
    keys = ["task", *EXTRA, "trained_loops", "level", "eval_loops", "seed"]
    cells = acc[acc["boundary"].isin(list(CELLS))]
    wide = cells.pivot_table(index=keys, columns="boundary", values="value", aggfunc="mean")
    wide = wide.reindex(columns=list(CELLS)).dropna()
    A = {CELLS[c]: wide[c] for c in CELLS}  # A[(train, run)]
    # each effect as the sum of two same-model (or same-run-mode) differences: where two cells are equal (n = 1,
    # where both run modes are one computation: G = R = 0 by construction) their difference, and so the effect,
    # is exactly zero, not the rounding residue a four-term sum leaves (which a Wilcoxon test would rank)
    effects = pd.DataFrame({
        "run": ((A["norm", "none"] - A["norm", "norm"]) + (A["none", "none"] - A["none", "norm"])) / 2,
        "train": ((A["none", "norm"] - A["norm", "norm"]) + (A["none", "none"] - A["norm", "none"])) / 2,
        "agreement": ((A["norm", "norm"] - A["norm", "none"]) + (A["none", "none"] - A["none", "norm"])) / 2,
    })  # fmt: skip
    effects.columns.name = "effect"
    return effects.stack().rename("value").reset_index()


def _side(n, T) -> np.ndarray:
    return np.select([np.asarray(n) < np.asarray(T), np.asarray(n) == np.asarray(T)], ["below", "at"], "beyond")


def effects_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per effect and n: mean over seed pairs with its bootstrap CI, Wilcoxon p against 0, Holm across the n on
    each side of T (per task, distribution, scale, level and effect)."""
    by = ["task", *EXTRA, "trained_loops", "level", "effect", "eval_loops"]
    out = []
    for key, g in per_seed.groupby(by, sort=True):
        v = g["value"].to_numpy(dtype=float)
        ci = stats.paired_mean_ci(v)
        p = stats.wilcoxon_p(v, np.zeros_like(v))
        out.append(dict(zip(by, key, strict=True), mean=ci.estimate, ci_low=ci.low, ci_high=ci.high,
                        ci_method=ci.method, n=len(v), wilcoxon_p=p))  # fmt: skip
    table = pd.DataFrame(out, columns=[*by, "mean", "ci_low", "ci_high", "ci_method", "n", "wilcoxon_p"])
    table["side"] = _side(table["eval_loops"], table["trained_loops"])
    family = [c for c in by if c != "eval_loops"] + ["side"]
    holm = lambda p: pd.Series(stats.holm(p.to_numpy()), index=p.index)  # noqa: E731
    table["wilcoxon_p_holm"] = table.groupby(family)["wilcoxon_p"].transform(holm) if len(table) else []
    return table


def _paired(acc: pd.DataFrame, a: str, b: str, by: list[str]) -> pd.DataFrame:
    """stats.paired_summary of label a against b, in summarize()'s columns (mean = mean of a − b)."""
    if acc.empty or not {a, b} <= set(acc["boundary"]):
        return pd.DataFrame()
    t = stats.paired_summary(acc, [*by, "eval_loops"], "boundary", a, b)
    return t[t["n_pairs"] > 0].rename(columns={"mean_diff": "mean", "n_pairs": "n"})  # models with both labels


def recovery_table(acc: pd.DataFrame) -> pd.DataFrame:
    """Part 4 per (task, distribution, scale, level, n): the rescale surgery's recovery per seed (module docstring),
    mean and CI over the seeds the surgery damaged (n; guarded seeds are NaN and left out)."""
    keys = ["task", *EXTRA, "trained_loops", "level", "eval_loops"]
    wide = acc.pivot_table(index=[*keys, "seed"], columns="boundary", values="value", aggfunc="mean")
    if not {"norm", "norm->none", "norm->rescale"} <= set(wide.columns):
        return pd.DataFrame()
    wide = wide[["norm", "norm->none", "norm->rescale"]].dropna()
    gap = wide["norm"] - wide["norm->none"]
    wide["recovery"] = ((wide["norm->rescale"] - wide["norm->none"]) / gap).where(gap >= paper.MIN_REFIT_GAP)
    out = []
    for key, g in wide.groupby(keys, sort=True):
        ci = stats.bootstrap_ci_mean(g["recovery"].dropna().to_numpy())
        out.append(dict(zip(keys, key, strict=True), mean=ci.estimate, ci_low=ci.low, ci_high=ci.high,
                        ci_method=ci.method, n=int(g["recovery"].notna().sum()),
                        mean_a=g["norm->rescale"].mean(), mean_b=g["norm->none"].mean()))  # fmt: skip
    return pd.DataFrame(out)


CONTRAST = ("accuracy fwd", "accuracy rev", "margin fwd", "margin rev")  # the contrast's quantities (design.md §10)


def contrast_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The decisive contrast of docs/design.md §10 per (task, scale, level, n), where the table holds the margin and
    both surgeries: per seed pair, on accuracy D_fwd = A(norm) − A(norm->none) and D_rev = A(none) − A(none->norm);
    on the margin m the same damage relative to each model's own margin as trained, d_fwd = [m(norm) −
    m(norm->none)] / m(norm) and d_rev = [m(none) − m(none->norm)] / m(none), a seed whose margin as trained is <= 0
    left out of that side. Mean with its bootstrap CI over the pairs (n), mean_a/mean_b: the two values compared."""
    keys = ["task", *EXTRA, "trained_loops", "level", "eval_loops"]
    if not (rows["metric"] == "margin").any() or not {"norm->none", "none->norm"} <= set(rows["boundary"]):
        return pd.DataFrame()
    out = []
    for metric in ("accuracy", "margin"):
        wide = seed_accuracy(rows, metric).pivot_table(index=[*keys, "seed"], columns="boundary", values="value")
        wide = wide.reindex(columns=["norm", "norm->none", "none", "none->norm"]).dropna()
        for side, (own, cut) in (("fwd", ("norm", "norm->none")), ("rev", ("none", "none->norm"))):
            d = wide[own] - wide[cut]
            if metric == "margin":
                d = (d / wide[own]).where(wide[own] > 0)
            for key, g in d.groupby(keys, sort=True):
                ci = stats.paired_mean_ci(g.to_numpy())
                at = wide.loc[g.index]
                out.append(dict(zip(keys, key, strict=True), quantity=f"{metric} {side}", mean=ci.estimate,
                                ci_low=ci.low, ci_high=ci.high, ci_method=ci.method, n=int(g.notna().sum()),
                                mean_a=at[own].mean(), mean_b=at[cut].mean()))  # fmt: skip
    return pd.DataFrame(out)


def contrast_outcome(fwd: pd.Series, rev: pd.Series, floor: float, bar: float, unit: str) -> tuple[str, str]:
    """Rule 2 (accuracy: floor 0.05, bar 0.25) or 3 (relative margin: 0.1, 0.5) of docs/design.md §10 at one n:
    *agreement* if mean rev >= ½ mean fwd with rev's CI above `floor`; *growth* if rev's CI lies below `floor` while
    fwd's lies above `bar`; otherwise *mixed*."""
    measured = (f"{unit}: D_fwd {fwd['mean']:+.3f} [{fwd['ci_low']:+.3f}, {fwd['ci_high']:+.3f}], "
                f"D_rev {rev['mean']:+.3f} [{rev['ci_low']:+.3f}, {rev['ci_high']:+.3f}] "
                f"over {int(rev['n'])} seed pairs")  # fmt: skip
    if not (np.isfinite(fwd["mean"]) and np.isfinite(rev["mean"])):
        return "undecided", measured
    if rev["mean"] >= fwd["mean"] / 2 and rev["ci_low"] > floor:
        return "agreement", measured
    if rev["ci_high"] < floor and fwd["ci_low"] > bar:
        return "growth", measured
    return "mixed", measured


# docs/design.md §10's thresholds: (floor, bar) of rule 2 (accuracy) and rule 3 (the margin relative to its own)
CONTRAST_RULES = {"accuracy": (0.05, 0.25), "margin": (0.1, 0.5)}
CONTRAST_PAIRS = 16  # the design's seed pairs: with fewer stored, the contrast is shown and left undecided


def contrast_claims(c: pd.DataFrame, T: int) -> list[tuple[str, str, str, tuple[str, str]]]:
    """The contrast's claims at n = T (c: one task's and level's `contrast` rows at the preset's scale): rule 2 on
    accuracy, rule 3 on the margin, and the design's outcome (the margin decides where the two disagree)."""
    at = c[c["eval_loops"] == T].set_index("quantity")
    if not set(CONTRAST) <= set(at.index):
        return []
    found, outcomes = [], {}
    for metric, (floor, bar) in CONTRAST_RULES.items():
        unit = "accuracy" if metric == "accuracy" else "margin lost, relative to the margin as trained"
        outcome = contrast_outcome(at.loc[f"{metric} fwd"], at.loc[f"{metric} rev"], floor, bar, unit)
        if (pairs := int(at.loc[f"{metric} fwd", "n"])) < CONTRAST_PAIRS:  # the design is not complete: not read
            outcome = ("undecided", f"{outcome[1]} ({pairs} of the design's {CONTRAST_PAIRS} so far; would read "
                       f"{outcome[0]})")  # fmt: skip
        outcomes[metric] = outcome[0]
        found.append((f"contrast ({metric})", f"breaking agreement with the state bounded (none->norm) hurts as "
                      f"removing the norm (norm->none) does, on {metric} at n = T",
                      f"agreement: mean D_rev >= ½ mean D_fwd, D_rev's CI above {floor:g}; growth: D_rev's CI below "
                      f"{floor:g} while D_fwd's lies above {bar:g}", outcome))  # fmt: skip
    acc, margin = outcomes["accuracy"], outcomes["margin"]
    said = f"accuracy: {acc}, margin: {margin}" + ("" if acc == margin else " (they disagree: the margin decides)")
    found.append(("agreement or growth", "what the surgery breaks: agreement with the trained loop, or the bounded "
                  "state (docs/design.md §10)", "the outcome rules 2 and 3 share; where they disagree, the margin's",
                  (margin, said)))  # fmt: skip
    return found


def summarize(rows: pd.DataFrame, preset_name: str | None = None) -> pd.DataFrame:
    """The long table of estimates (module docstring): part, quantity and the keys, mean [ci_low, ci_high] over n
    seeds, Wilcoxon p (raw and Holm) where there is a test, mean_a/mean_b the two accuracies compared."""
    acc = seed_accuracy(rows)
    scale = ["task", *EXTRA, "level"]
    looped_fixed = acc[acc["train_loops"].str.startswith("fixed:")]
    parts = [
        effects_table(decompose(acc)).rename(columns={"effect": "quantity"}).assign(part="effects"),
        _paired(acc, "none", "norm", scale).assign(part="range", quantity="none-norm"),
        _paired(looped_fixed, "norm", "norm->none", scale).assign(part="ladder", quantity="damage"),
        recovery_table(acc).assign(part="rescale", quantity="recovery"),
        contrast_table(rows).assign(part="contrast"),
    ]
    curves = stats.mean_ci(acc, [*scale, "trained_loops", "boundary", "eval_loops"], unit_col="seed")
    parts.append(curves.rename(columns={"boundary": "quantity"}).assign(part="accuracy"))
    table = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    table["side"] = _side(table["eval_loops"], table["trained_loops"])
    ranges = {(s, n): trained_range(s, n) for s, n in table[["train_loops", "train_steps"]].drop_duplicates().values}
    table["in_range"] = [n in ranges[(s, k)] for s, k, n in table[["train_loops", "train_steps", "eval_loops"]].values]
    cols = ["part", "quantity", *scale, "trained_loops", "eval_loops", "side", "in_range", "mean", "ci_low", "ci_high",
            "ci_method", "n", "wilcoxon_p", "wilcoxon_p_holm", "mean_a", "mean_b"]  # fmt: skip
    return table.reindex(columns=cols)


# ---------------------------------------------------------------- E5's rules (docs/design.md)


def part1_outcome(t: pd.DataFrame) -> tuple[str, str]:
    """Part 1 at one task, distribution and level; t: the effects rows. *agreement* if, on each side of T, at
    >= 2/3 of the n G > 0 with Holm p < 0.05 and |G| is the largest effect; *normalisation* if |R| is the largest
    with Holm p < 0.05 at >= 2/3 of the n beyond T; otherwise *mixed*."""
    wide = t.pivot_table(index=["eval_loops", "side"], columns="quantity", values=["mean", "wilcoxon_p_holm"])
    if wide.empty:
        return "undecided", "no seed pair has all four cells"
    m, p = wide["mean"].abs(), wide["wilcoxon_p_holm"]
    g_wins = (wide["mean"]["agreement"] > 0) & (p["agreement"] < paper.ALPHA) & (m.idxmax(axis=1) == "agreement")
    r_wins = (p["run"] < paper.ALPHA) & (m.idxmax(axis=1) == "run")
    side = wide.index.get_level_values("side")
    share = {s: float(g_wins[side == s].mean()) for s in ("below", "beyond")}
    r_beyond = float(r_wins[side == "beyond"].mean())
    outcome = "agreement" if min(share.values()) >= 2 / 3 else "normalisation" if r_beyond >= 2 / 3 else "mixed"
    return outcome, (
        f"G significant and largest at {share['below']:.0%} of n below T, {share['beyond']:.0%} beyond; "
        f"R significant and largest at {r_beyond:.0%} of n beyond T"
    )


def part2_outcome(ranged: pd.DataFrame, fixed: pd.DataFrame, inside: set[int]) -> tuple[str, str]:
    """Part 2 for one distribution: ranged/fixed are the `range` rows (none − norm, run as trained) of the
    distribution and of fixed-T training at one task and level; inside: the distribution's trained range."""
    r = ranged[ranged["eval_loops"].isin(inside)].set_index("eval_loops")
    f = fixed[fixed["eval_loops"].isin(inside)].set_index("eval_loops")
    if r.empty:
        return "undecided", "no rows inside the trained range"
    closed = bool(((r["mean"].abs() < SMALL_GAP) | (r["wilcoxon_p_holm"] >= paper.ALPHA)).all())
    fixed_separates = bool((f["wilcoxon_p_holm"] < paper.ALPHA).any())
    ahead = float(((r["mean"] > 0) & (r["wilcoxon_p_holm"] < paper.ALPHA)).mean())
    outcome = (
        "normalisation" if ahead >= 1 / 2 else "agreement" if closed and fixed_separates else "mixed"
    )  # fmt: skip
    return outcome, (
        f"inside n = {min(inside)}..{max(inside)}: none - norm max |mean| {r['mean'].abs().max():.3f}, "
        f"none ahead (Holm p < {paper.ALPHA}) at {ahead:.0%} of n; fixed-T training separates there: "
        f"{verdicts.yes_no(fixed_separates)}"
    )


def part4_outcome(r: pd.Series | None, least: int = MIN_DAMAGED) -> tuple[str, str]:
    """Part 4 at n = T for one task and level: *agreement (scale)* if the mean recovery >= 0.5 with its CI above
    0.25; *normalisation* if the CI lies below 0.25; otherwise *mixed*; undecided with < `least` damaged seeds
    (MIN_DAMAGED of E5's 16; a rung of the GPU study's ladder: RUNG_MIN_DAMAGED of its 4, docs/gpu-study.md's rule)."""
    if r is None or r["n"] < least or not np.isfinite(r["mean"]):
        n = 0 if r is None else int(r["n"])
        return "undecided", f"undecided: only {n} seeds lost >= {paper.MIN_REFIT_GAP} to the surgery"
    measured = f"recovery {r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] over {int(r['n'])} damaged seeds"
    if r["mean"] >= 0.5 and r["ci_low"] > 0.25:
        return "agreement", measured
    return ("normalisation" if r["ci_high"] < 0.25 else "mixed"), measured


def own_scale(s: pd.DataFrame) -> pd.DataFrame:
    """The summary rows at the preset's own model, the one parts 1, 2 and 4 read (the `range` rows' params and
    train_steps); all of s where those are not one scale."""
    own = s.loc[s["part"] == "range", ["params", "train_steps"]].drop_duplicates()
    return s.merge(own, on=["params", "train_steps"]) if len(own) == 1 else s


def claims(rows: pd.DataFrame, preset_name: str) -> list[Claim]:
    """E5's verdicts for its table (judge on summarize), with the ladder claim's post hoc note (common_seeds)."""
    return common_seeds(judge(summarize(rows, preset_name)), rows)


def judge(summary: pd.DataFrame) -> list[Claim]:
    """E5's rules (docs/design.md) per task at levels (i) and (iii), on the preset's own scale (the models parts 1-2
    train); the ladder is reported, not judged. A table of the ladder alone (the GPU study: parts 3 and 4) has no
    part 1-2 claims and part 4's rule per rung. Each claim's outcome names the reading its rule supports
    (agreement, normalisation, mixed, undecided, reported); its criterion is the prediction written before E5."""
    out = []
    for (task, level), s in summary.groupby(["task", "level"], sort=True):
        T = int(s["trained_loops"].iloc[0])
        fixed = f"fixed:{T}"
        at_scale = own_scale(s)
        ladder_table = s["part"].isin(["effects", "range"]).sum() == 0
        eff = at_scale[(at_scale["part"] == "effects") & (at_scale["train_loops"] == fixed)]
        found = [] if ladder_table else [
            ("train x run", "run as trained beats run the other way (the agreement effect G dominates)",
             "agreement: G > 0 and |G| > |R|, |M| on both sides of T; normalisation: |R| dominates beyond T",
             part1_outcome(eff))]  # fmt: skip
        ranged = at_scale[at_scale["part"] == "range"]
        for spec in sorted(set(ranged["train_loops"]) - {fixed}):
            inside = trained_range(spec, int(ranged["train_steps"].iloc[0]))
            outcome = part2_outcome(
                ranged[ranged["train_loops"] == spec], ranged[ranged["train_loops"] == fixed], inside
            )
            found.append((f"range {spec}", f"trained over {spec}, the norm/none gap closes inside the trained range",
                          "agreement: it closes while fixed-T training separates; normalisation: none stays ahead",
                          outcome))  # fmt: skip
        lad = s[(s["part"] == "ladder") & s["eval_loops"].isin([T, 3 * T])]
        points = [
            f"{int(p):,} params{'' if k == lad['train_steps'].min() else f' ({int(k)} steps)'}: "
            + ", ".join(f"n={int(r.eval_loops)} {r.mean:+.3f}" for r in g.sort_values("eval_loops").itertuples())
            for (p, k), g in lad.groupby(["params", "train_steps"])
        ]
        found.append(("ladder", "the surgery's damage against model scale (accuracy lost at T and 3T)",
                      "no direct discrimination: both readings allow damage to grow with scale",
                      ("reported", "; ".join(points) or "not run")))  # fmt: skip
        found += contrast_claims(at_scale[(at_scale["part"] == "contrast") & (at_scale["train_loops"] == fixed)], T)
        rec = at_scale[(at_scale["part"] == "rescale") & (at_scale["train_loops"] == fixed)]
        rec = rec[rec["eval_loops"] == T]
        rule = "agreement (scale): mean recovery at T >= 0.5, CI above 0.25; normalisation: CI below 0.25"
        text = "a fixed per-step rescale in place of the boundary norm recovers the surgery's loss"
        seeds = lad[lad["eval_loops"] == T].groupby(["params", "train_steps"])["n"].max()  # each rung's seeds
        for (params, steps), r in rec.groupby(["params", "train_steps"]) if ladder_table else [((None, None), rec)]:
            name = f"rescale {int(params):,} params" if ladder_table else "rescale"
            least = RUNG_MIN_DAMAGED if ladder_table else MIN_DAMAGED
            outcome = part4_outcome(r.iloc[0] if len(r) else None, least)
            if ladder_table and (k := int(seeds.get((params, steps), 0))) < LADDER_SEEDS:  # a rung part-trained
                outcome = ("undecided", f"undecided: {k} of the rung's {LADDER_SEEDS} seeds trained so far")
            found.append((name, text, rule, outcome))
        for name, text, predicted, (outcome, measured) in found:
            out.append(Claim(experiment="e5", task=task, claim=name, text=text, paper=BEYOND, measured=measured,
                             criterion=predicted, analysis="paired", level=level, outcome=outcome,
                             beyond_paper=True))  # fmt: skip
    return out


def common_seeds(found: list[Claim], rows: pd.DataFrame) -> list[Claim]:
    """Post hoc, beside the ladder (reported, not judged): the E2-model rung averages 16 seeds, the other rungs
    LADDER_SEEDS; the same damage (norm - norm->none per seed, mean) on the other rungs' seeds alone is added to the
    ladder claim's measured text, so the rungs can be compared on the same seeds."""
    acc = seed_accuracy(rows)
    looped = acc[acc["train_loops"].str.startswith("fixed:")]
    out = []
    for c in found:
        part = looped[(looped["task"] == c.task) & (looped["level"] == c.level)]
        own = part[part["boundary"] == "none"][["params", "train_steps"]].drop_duplicates()  # E2's model: both modes
        if c.claim != "ladder" or len(own) != 1 or part["params"].nunique() < 2:
            out.append(c)
            continue
        at_own = part.merge(own, on=["params", "train_steps"])
        rungs = part[~part["params"].isin(own["params"])]
        seeds = sorted(int(s) for s in rungs["seed"].unique())
        T = int(part["trained_loops"].iloc[0])
        figures = []
        for n in (T, 3 * T):
            wide = at_own[at_own["eval_loops"] == n].pivot_table(index="seed", columns="boundary", values="value")
            damage = (wide["norm"] - wide["norm->none"]).dropna()
            figures.append((n, float(damage[damage.index.isin(seeds)].mean()), float(damage.mean()), len(damage)))
        span = f"{seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
        note = (f". Post hoc, not the rule: E2's model ({int(own['params'].iloc[0]):,} params) on the other rungs' "
                f"seeds {span} only: " + ", ".join(f"n={n} {a:+.3f}" for n, a, _, _ in figures)
                + f" (all {figures[0][3]} seeds: "
                + ", ".join(f"n={n} {b:+.3f}" for n, _, b, _ in figures) + ")")  # fmt: skip
        out.append(replace(c, measured=c.measured + note))
    return out


# ---------------------------------------------------------------- the terminal report


def format_summary(summary: pd.DataFrame) -> str:
    lines = []
    for (task, level), s in summary.groupby(["task", "level"], sort=True):
        T = int(s["trained_loops"].iloc[0])
        eff = s[s["part"] == "effects"]
        lines.append(f"\n{task}, {level}: effects per seed pair at n = T = {T} and 3T (95% bootstrap CI, Holm p)")
        for spec, e in eff.groupby("train_loops", sort=False):
            for n in (T, 3 * T):
                at = e[e["eval_loops"] == n].set_index("quantity")
                cells = [f"{q} {at.loc[q, 'mean']:+.3f} [{at.loc[q, 'ci_low']:+.3f}, {at.loc[q, 'ci_high']:+.3f}] "
                         f"p {at.loc[q, 'wilcoxon_p_holm']:.2g}" for q in EFFECTS if q in at.index]  # fmt: skip
                lines.append(f"  {spec:<15} n={n:<3} " + "   ".join(cells) + f"   ({int(at['n'].max())} pairs)")
        rng = s[s["part"] == "range"]
        if not rng.empty:
            lines.append("  none - norm, run as trained, by n (* inside the trained range, Holm p < 0.05 marked !)")
            for spec, r in rng.groupby("train_loops", sort=False):
                r = r.sort_values("eval_loops")
                lines.append(f"  {spec:<15} " + " ".join(
                    f"{v:+.2f}{'*' if inside else ' '}{'!' if p < paper.ALPHA else ' '}"
                    for v, inside, p in zip(r["mean"], r["in_range"], r["wilcoxon_p_holm"], strict=True)))  # fmt: skip
        lad = s[(s["part"] == "ladder") & s["eval_loops"].isin([T, 3 * T])]
        for (params, steps), g in lad.groupby(["params", "train_steps"]):
            d = g.set_index("eval_loops")
            lines.append(f"  ladder {int(params):>9,} params, {int(steps)} steps: damage at T {d.loc[T, 'mean']:+.3f}, "
                         f"at 3T {d.loc[3 * T, 'mean']:+.3f} ({int(d['n'].max())} seeds)")  # fmt: skip
        rec = s[(s["part"] == "rescale") & s["eval_loops"].isin([T, 3 * T])]
        scales = rec[["params", "train_steps"]].drop_duplicates()
        for (spec, params, _), g in rec.groupby(["train_loops", "params", "train_steps"], sort=False):
            d = g.set_index("eval_loops")
            at = f"{spec:<15}" + (f" {int(params):>10,} params" if len(scales) > 1 else "")
            lines.append(f"  rescale {at} recovery at T {d.loc[T, 'mean']:.3f} ({int(d.loc[T, 'n'])} damaged "
                         f"seeds), at 3T {d.loc[3 * T, 'mean']:.3f} ({int(d.loc[3 * T, 'n'])})")  # fmt: skip
    return "\n".join(lines)


def format_contrast(summary: pd.DataFrame, rows: pd.DataFrame) -> str:
    """The contrast of docs/design.md §10 at n = T per level, and what is reported beside it (not judged): per run
    label, the state-norm ratio over steps 1..T (verdicts.norm_ratios; median and range over seeds) and the
    non-answer share at T (1 − option rate), held-out mean. Empty where the table has no contrast."""
    c = summary[summary["part"] == "contrast"]
    if c.empty:
        return ""
    T = int(c["trained_loops"].iloc[0])
    lines = [f"\nthe decisive contrast at n = T = {T} (docs/design.md §10; margin: the share of its own margin lost)"]
    at_T = c[c["eval_loops"] == T]
    several = at_T[["train_loops", "params"]].drop_duplicates().shape[0] > 1  # a smoke table: name each model
    for (task, spec, params, level), g in at_T.groupby(["task", "train_loops", "params", "level"]):
        at = g.set_index("quantity")
        which = f" ({spec}, {int(params):,} params)" if several else ""
        lines.append(f"  {task}, {level}{which}: " + "   ".join(
            f"{q} {at.loc[q, 'mean']:+.3f} [{at.loc[q, 'ci_low']:+.3f}, {at.loc[q, 'ci_high']:+.3f}] "
            f"({at.loc[q, 'mean_a']:.3f} -> {at.loc[q, 'mean_b']:.3f}, {int(at.loc[q, 'n'])} pairs)"
            for q in CONTRAST if q in at.index))  # fmt: skip
    held = verdicts.levels(rows[rows["arch"] == "looped"])
    held = held[held["level"] == MEAN]
    lines.append("  reported, not judged (held-out mean): state-norm ratio over n = 1..T, median [range] over seeds; "
                 "non-answer share at T, mean")  # fmt: skip
    for label, g in held.groupby("boundary"):
        ratios = verdicts.norm_ratios(g, T)
        option = g[(g["metric"] == "option_rate") & (g["eval_loops"] == T)]["value"]
        lines.append(f"    {label:<14} {ratios.median():.2f}x [{ratios.min():.2f}, {ratios.max():.2f}]   "
                     f"non-answer {1 - option.mean():.4f}")  # fmt: skip
    return "\n".join(lines)


def identity_check(rows: pd.DataFrame) -> str:
    """At n = 1 every run mode reads out the same logits: the largest difference of a metric other than the state
    norm handed on between a norm model's `norm` rows and its `norm->rescale` / `norm->none` rows."""
    one = rows[(rows["eval_loops"] == 1) & ~rows["metric"].isin(["norm_post"])]
    key = ["run_key", "difficulty", "metric"]
    own = one[one["boundary"] == "norm"].set_index(key)["value"]
    worst = {}
    for label in ("norm->none", "norm->rescale"):
        other = one[one["boundary"] == label].set_index(key)["value"]
        both = pd.concat([own, other], axis=1, join="inner")
        worst[label] = float((both.iloc[:, 0] - both.iloc[:, 1]).abs().max()) if len(both) else float("nan")
    return "n = 1 identity (max |difference| to `norm`): " + ", ".join(f"{k} {v:g}" for k, v in worst.items())


def report(rows: pd.DataFrame, preset_name: str) -> str:
    """What `loopscope run e5` prints: the estimates, the n = 1 identity, then the verdicts."""
    summary = summarize(rows, preset_name)
    found = common_seeds(judge(summary), rows)
    parts = [format_summary(summary), format_contrast(summary, rows), "", identity_check(rows), *verdicts.lines(found)]
    return "\n".join(p for p in parts if p is not None)
