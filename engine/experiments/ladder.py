"""The GPU study's rules that read the ladder of both devices at once (docs/gpu-study.md, "Predictions and rules",
committed before any GPU run; docs/design.md §9): E5's `cpu` ladder (16k-412k parameters, on the CPU) continued by
the `gpu` study's (412k-19M, on a GPU), parity, norm-trained, seeds 0-3 at every rung, the same training length.

  trend     the slope b of per-seed damage (accuracy of `norm` minus `norm->none`, held-out mean) against
            log10(parameters), OLS over the (rung, seed) points of every rung, at T and at 3T; its 95% CI by a
            bootstrap that resamples the seeds jointly across rungs (a resampled seed brings its points at every
            rung). *grows* if the CI lies above 0, *shrinks* if below, *flat* otherwise. Each rung counts once: the
            bridge (the rung both devices ran) enters with the CPU's seeds, the rung's first measurement; the GPU's
            enter the bridge comparison.
  collapse  per rung, E2 (d)'s criteria at n = T on `norm->none`: accuracy <= 0.55, top-token share >= 0.9, the
            state norm's max/min over steps 1..T <= 3; each per seed, then the median over seeds decides, the seed
            furthest from collapse on each criterion beside it.
  bridge    not a claim: per label and n, the Mann-Whitney p of the GPU's seeds against the CPU's at the bridge.
  learned   not a claim: the trend over the seeds whose `norm` accuracy at T exceeds 0.55 alone, at T and 3T (a seed
            that never learned scores 0.50 both ways, damage 0); added 2026-12-06 after the 19M probe's seeds, when
            three of its seven scored 0.50 (docs/gpu-study.md).

The rescale recovery per rung is E5 part 4's rule on each rung (engine.experiments.e5.claims, ladder-only tables).
`reading` puts the three parts' outcomes against the two predictions in one sentence (the E5 page, the report).
"""

from __future__ import annotations

import re
from functools import partial

import numpy as np
import pandas as pd

from engine import paper, studies
from engine.core import stats
from engine.experiments.e5 import BEYOND, LADDER_SEEDS
from engine.experiments.verdicts import MEAN, Claim, levels, norm_ratios

SEEDS = tuple(range(LADDER_SEEDS))  # the same seeds at every rung: E5's ladder trains seeds 0-3
RESAMPLES = 2000  # 4 seeds have 35 distinct resamples: 2,000 draws settle the quantiles
LABELS = ("norm", "norm->none", "norm->rescale")


def ladder_rows(rows: pd.DataFrame, device: str) -> pd.DataFrame:
    """One device's ladder from an E5 table: looped parity, fixed-T norm-trained models (and their surgeries) at the
    table's shortest training (the ladder's common length: E5's `cpu` ladder also has one longer-trained rung),
    seeds 0-3, with a `device` column."""
    r = rows[(rows["task"] == "parity") & (rows["arch"] == "looped") & rows["seed"].isin(SEEDS)]
    r = r[r["train_loops"].str.startswith("fixed:") & r["boundary"].isin(LABELS)]
    return r[r["train_steps"] == r["train_steps"].min()].assign(device=device)


def held_out(ladder: pd.DataFrame) -> pd.DataFrame:
    """Per device and rung (params): verdicts.levels' held-out mean of every metric, one value per seed, label, n
    and metric (what seed_values and collapse read)."""
    out = []
    for (device, params), g in ladder.groupby(["device", "params"]):
        lv = levels(g)
        out.append(lv[lv["level"] == MEAN].assign(device=device, params=params))
    cols = ["device", "params", "seed", "boundary", "trained_loops", "eval_loops", "metric", "value"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


def seed_values(held: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Per device, rung (params), seed, label and n: the held-out mean of `metric` (held: held_out's rows)."""
    return held[held["metric"] == metric].drop(columns="metric")


def damage_points(acc: pd.DataFrame, n: int, learned_at: int | None = None) -> pd.DataFrame:
    """(params, seed, damage) at n: each rung once, the CPU's seeds where both devices ran it. learned_at: only the
    seeds whose `norm` accuracy at that n exceeds E2 (d)'s collapse accuracy (learned; the reported trend)."""
    at = acc[acc["eval_loops"] == n]
    wide = at.pivot_table(index=["device", "params", "seed"], columns="boundary", values="value").reset_index()
    if not {"norm", "norm->none"} <= set(wide.columns):
        return pd.DataFrame(columns=["params", "seed", "damage"])
    wide["damage"] = wide["norm"] - wide["norm->none"]
    wide = wide.dropna(subset=["damage"])
    on_cpu = set(wide.loc[wide["device"] == "cpu", "params"])
    keep = (wide["device"] == "cpu") | ~wide["params"].isin(on_cpu)
    if learned_at is not None:
        norm = acc[(acc["eval_loops"] == learned_at) & (acc["boundary"] == "norm")]
        norm = norm.groupby(["device", "params", "seed"])["value"].mean()
        learned = norm[norm > paper.SURGERY_COLLAPSE_ACCURACY].index
        keep &= wide.set_index(["device", "params", "seed"]).index.isin(learned)
    return wide.loc[keep, ["params", "seed", "damage"]].reset_index(drop=True)


def slope(points: pd.DataFrame) -> float:
    x, y = np.log10(points["params"].to_numpy(dtype=float)), points["damage"].to_numpy(dtype=float)
    if len(np.unique(x)) < 2:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def trend(points: pd.DataFrame, resamples: int = RESAMPLES, rng_seed: int = 0) -> dict:
    """The slope of damage against log10(parameters) with its seed-bootstrap CI, and the rule's outcome."""
    seeds = sorted(points["seed"].unique())
    if not seeds:  # no point (the learned seeds' companion where no seed learned)
        return dict(slope=float("nan"), ci_low=float("nan"), ci_high=float("nan"), outcome="undecided", seeds=0,
                    rungs=0, low=0, high=0)  # fmt: skip
    b = slope(points)
    rng = np.random.default_rng(rng_seed)
    by_seed = {s: points[points["seed"] == s] for s in seeds}
    draws = [slope(pd.concat([by_seed[s] for s in rng.choice(seeds, len(seeds))])) for _ in range(resamples)]
    draws = np.asarray([d for d in draws if np.isfinite(d)])
    low, high = np.quantile(draws, [0.025, 0.975]) if len(draws) else (np.nan, np.nan)
    outcome = "grows" if low > 0 else "shrinks" if high < 0 else "flat"
    if not np.isfinite(b) or len(seeds) < 2:
        outcome = "undecided"
    return dict(slope=b, ci_low=float(low), ci_high=float(high), outcome=outcome, seeds=len(seeds),
                rungs=int(points["params"].nunique()), low=int(points["params"].min()) if len(points) else 0,
                high=int(points["params"].max()) if len(points) else 0)  # fmt: skip


def collapse(held: pd.DataFrame) -> pd.DataFrame:
    """Per device and rung, E2 (d)'s criteria at n = T on norm->none (held: held_out's rows): the per-seed values,
    their medians, the seed furthest from collapse on each, and whether the medians meet all three."""
    out = []
    for (device, params), g in held.groupby(["device", "params"]):
        T = int(g["trained_loops"].iloc[0])
        cut = g[g["boundary"] == "norm->none"]
        at_t = cut[cut["eval_loops"] == T].groupby(["metric", "seed"])["value"].mean()
        acc, share = (at_t[m] if m in at_t.index else pd.Series(dtype=float) for m in ("accuracy", "top_token_share"))
        ratio = norm_ratios(cut, T)
        if acc.empty:
            continue
        med = dict(accuracy=acc.median(), top_token_share=share.median(), norm_ratio=ratio.median())
        out.append(dict(
            device=device, params=int(params), seeds=len(acc), **med,
            worst_accuracy=acc.max(), worst_share=share.min(), worst_ratio=ratio.max(),
            collapsed=bool(med["accuracy"] <= paper.SURGERY_COLLAPSE_ACCURACY
                           and med["top_token_share"] >= paper.SURGERY_ONE_TOKEN_SHARE
                           and med["norm_ratio"] <= paper.SURGERY_NORM_BOUND),
        ))  # fmt: skip
    return pd.DataFrame(out)


def bridge(acc: pd.DataFrame) -> pd.DataFrame:
    """Per label and n at the rung(s) both devices ran: each device's mean and the Mann-Whitney p between them."""
    both = set(acc.loc[acc["device"] == "cpu", "params"]) & set(acc.loc[acc["device"] == "gpu", "params"])
    out = []
    for (params, label, n), g in acc[acc["params"].isin(both)].groupby(["params", "boundary", "eval_loops"]):
        cpu, gpu = (g.loc[g["device"] == d, "value"].to_numpy(dtype=float) for d in ("cpu", "gpu"))
        if len(cpu) and len(gpu):
            out.append(dict(params=int(params), boundary=label, eval_loops=int(n), cpu_mean=cpu.mean(),
                            gpu_mean=gpu.mean(), mann_whitney_p=stats.mann_whitney_p(gpu, cpu)))  # fmt: skip
    return pd.DataFrame(out)


# the studies whose ladders the rules read, 16k-19M (their entries' ladder_rules)
LADDER_STUDIES = tuple(s.name for s in studies.STUDIES.values() if s.ladder_rules)


def every_rung(preset_name: str) -> tuple[int, ...] | None:
    """The rungs the rules read, by parameters, for a study of the GPU study's ladder: every rung of E5's `cpu` ladder
    and of the GPU study's, 16k-19M (the eight `cpu-ladder` trains); None for any other study (no rung is awaited)."""
    from engine.experiments.e5 import ladder

    if preset_name not in LADDER_STUDIES:
        return None
    return tuple(sorted({cfg.model.n_params for p in ("cpu", "gpu") for cfg in ladder(p, "parity")}))


def missing(acc: pd.DataFrame, every: tuple[int, ...] | None) -> list[int]:
    """The rungs of `every` without all of SEEDS run as trained and without the norm (acc: seed_values' rows)."""
    have = acc[acc["boundary"].isin(["norm", "norm->none"])].groupby("params")["seed"].nunique()
    return [p for p in every or () if have.get(p, 0) < len(SEEDS)]


def rules(
    cpu_e5: pd.DataFrame | None, gpu_e5: pd.DataFrame | None, every: tuple[int, ...] | None = None
) -> list[Claim]:
    """The cross-device rules (docs/gpu-study.md) as claims (E5's, paired, at the held-out mean): the trend at T and 3T,
    collapse per rung, the bridge (reported). Either table may be missing: what it needs is then "not run". With
    `every` (every_rung: the rungs the rule reads), the trend is undecided until each of them has its four seeds, and
    a rung's collapse until it has them: a ladder part-trained decides nothing (seen 2026-12-06: "flat", 3 rungs)."""
    frames = [ladder_rows(t, d) for t, d in ((cpu_e5, "cpu"), (gpu_e5, "gpu")) if t is not None and len(t)]
    ladder = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    claim = partial(Claim, experiment="e5", task="parity", analysis="paired", level=MEAN, beyond_paper=True,
                    paper=BEYOND)  # fmt: skip
    if ladder.empty:
        return [claim(claim="ladder trend", text="", criterion="", measured="not run", outcome="not run")]
    T = int(ladder["trained_loops"].iloc[0])
    held = held_out(ladder)
    acc = seed_values(held)
    out = []
    points = {n: damage_points(acc, n) for n in (T, 3 * T)}
    waiting = missing(acc, every)
    short = ", ".join(f"{p:,}" for p in waiting)
    awaited = (f"part-trained, undecided until every rung has its {len(SEEDS)} seeds: {len(waiting)} of the "
               f"{len(every or ())} rungs still short ({short} parameters); so far ")  # fmt: skip
    for n in (T, 3 * T):
        t = trend(points[n])
        measured = (f"b = {t['slope']:+.3f} per decade [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] over {t['rungs']} "
                    f"rungs ({t['low']:,}-{t['high']:,} parameters), {t['seeds']} seeds")  # fmt: skip
        out.append(claim(
            claim=f"ladder trend at n={n}", text="the surgery's damage against log10(parameters), 16k-19M",
            criterion="normalisation: grows (CI above 0); agreement: no sign (flat)",
            measured=(awaited if waiting else "") + measured,
            outcome="undecided" if waiting else t["outcome"]))  # fmt: skip
    for n in (T, 3 * T):  # reported: docs/gpu-study.md's note of 2026-12-06 (fourth session); not a verdict
        learned = damage_points(acc, n, learned_at=T)
        t, every = trend(learned), len(points[n])
        reads = {"grows": "above 0", "shrinks": "below 0", "flat": "across 0"}.get(t["outcome"], "undecided")
        measured = (f"b = {t['slope']:+.3f} per decade [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] (CI {reads}) over "
                    f"{len(learned)} of {every} (rung, seed) points, {t['rungs']} rungs")  # fmt: skip
        out.append(claim(
            claim=f"trend over learned seeds at n={n}", outcome="reported",
            text=f"the trend over the seeds whose norm accuracy at T exceeds {paper.SURGERY_COLLAPSE_ACCURACY} "
            "(a seed that never learned has no damage to lose)",
            criterion="reported beside the rule, not a verdict (added 2026-12-06, after the 19M probe's seeds)",
            measured=measured))  # fmt: skip
    for r in collapse(held).itertuples():
        measured = (f"{r.device}: median accuracy {r.accuracy:.3f} (highest seed {r.worst_accuracy:.3f}), top-token "
                    f"share {r.top_token_share:.3f} (lowest {r.worst_share:.3f}), norm ratio {r.norm_ratio:.2f}x "
                    f"(highest {r.worst_ratio:.2f}x) over {r.seeds} seeds")  # fmt: skip
        short = every is not None and r.seeds < len(SEEDS)  # a rung part-trained
        out.append(claim(
            claim=f"collapse {r.params:,} params ({r.device})", text="E2 (d)'s collapse at n = T on this rung",
            criterion="normalisation: collapse at 19M; agreement: no collapse needed",
            measured=measured + (f"; undecided until the rung has its {len(SEEDS)} seeds" if short else ""),
            outcome="undecided" if short else "collapses" if r.collapsed else "no collapse"))  # fmt: skip
    b = bridge(acc)
    for (params, label), g in b.groupby(["params", "boundary"]) if len(b) else ():
        low = g.loc[g["mann_whitney_p"].idxmin()]
        last = g["eval_loops"].max()
        measured = (f"smallest Mann-Whitney p {low['mann_whitney_p']:.3g} at n={low['eval_loops']} (GPU "
                    f"{low['gpu_mean']:.3f}, CPU {low['cpu_mean']:.3f}) over n = 1..{last}")  # fmt: skip
        out.append(claim(claim=f"bridge {params:,} params, {label}", criterion="", outcome="reported",
                                text="the same config on both devices (not a claim)", measured=measured))  # fmt: skip
    return out


# ---------------------------------------------------------------- the recipe probe's rule, seed by seed

# docs/gpu-study.md's bar: mean held-out accuracy at n = T over seeds 0-3, norm-trained, run as trained
RECIPE_RULE = 0.95


def recipe_score(rows: pd.DataFrame, trained: str = "norm") -> float:
    """One run's probe score: its held-out mean accuracy (verdicts.levels' MEAN) at n = T, run as trained (`trained`:
    the mode it was trained in)."""
    acc = rows[(rows["boundary"] == trained) & (rows["metric"] == "accuracy")]
    held = levels(acc)
    held = held[(held["level"] == MEAN) & (held["eval_loops"] == held["trained_loops"])]
    return float(held["value"].mean()) if len(held) else float("nan")


def recipe_outcome(scores: list[float], seeds: int = LADDER_SEEDS, rule: float = RECIPE_RULE) -> str:
    """The probe's rule applied to the seeds trained so far (in order): `adopted` once the mean over `seeds` seeds is
    certain to reach `rule` (even if every remaining seed scored 0), `rejected` once it cannot (even if every
    remaining seed scored 1.0), else `open`. With every seed in, exactly the rule: mean >= rule."""
    done = sum(scores)
    if done >= rule * seeds:
        return "adopted"
    if done + (seeds - len(scores)) * 1.0 < rule * seeds:
        return "rejected"
    return "open"


def mean_range(scores: list[float], seeds: int = LADDER_SEEDS) -> tuple[float, float]:
    """The range a candidate's mean over `seeds` seeds can still take, given its seeds so far: every remaining seed
    at 0, and every remaining seed at 1.0 (one number once all are in)."""
    return sum(scores) / seeds, (sum(scores) + seeds - len(scores)) / seeds


def best_candidate(scores: dict[str, list[float]], seeds: int = LADDER_SEEDS) -> str | None:
    """Where no candidate reaches the bar, the rule adopts the best of them: the highest mean held-out accuracy at
    n = T over `seeds` seeds (the earlier candidate on a tie). `scores`: each candidate's seeds so far, in the rule's
    order. The best once it is certain (docs/gpu-study.md, 2026-12-06): its lowest possible mean (every remaining seed
    at 0) exceeds every earlier candidate's highest possible one (every remaining seed at 1.0) and reaches every later
    one's, so that an exact tie goes to the earlier candidate; None while it is not."""
    ranges = {name: mean_range(s, seeds) for name, s in scores.items()}  # (lowest, highest) possible mean
    names = list(scores)
    for i, name in enumerate(names):
        low = ranges[name][0]
        if all(low > ranges[o][1] if j < i else low >= ranges[o][1] for j, o in enumerate(names) if o != name):
            return name
    return None


# ---------------------------------------------------------------- what the rules say, read against both predictions

_PARAMS = re.compile(r"([\d,]+) params")
_SLOPE = re.compile(r"b = [+-][\d.]+ per decade \[[^\]]+\]")


def _rung(claim: str) -> int | None:
    found = _PARAMS.search(claim)
    return int(found.group(1).replace(",", "")) if found else None


def reading(rules_found: list[dict], e5_claims: list[dict]) -> str:
    """The rules' outcomes read against docs/gpu-study.md's two predictions, part by part, and what that says about the
    paper's collapse (Ouro-1.4B and -2.6B at 0.000 by n = T). rules_found: rules()'s claims as mappings (claim,
    outcome, measured); e5_claims: the study's E5 verdicts as mappings (e5.claims), of which the parity `rescale <N>
    params` claims at the held-out mean are read. Composed from the outcomes alone: while the trend or a rung's
    collapse is undecided it says what it waits for and reads nothing."""
    rescale = [
        c for c in e5_claims if c["claim"].startswith("rescale ") and c["task"] == "parity" and c["level"] == MEAN
    ]
    trends = [c for c in rules_found if c["claim"].startswith("ladder trend at n=")]  # at T, then 3T
    falls = sorted((c for c in rules_found if c["claim"].startswith("collapse ")), key=lambda c: _rung(c["claim"]) or 0)
    if not trends or not falls:
        return "No ladder to read yet: the rules have no trend or collapse to go on."
    waiting = [c["claim"] for c in trends + falls if c["outcome"] == "undecided"]
    if waiting:
        return (f"Not read yet: {len(waiting)} of the rules' {len(trends) + len(falls)} readings "
                f"({', '.join(waiting)}) wait until every rung has its {len(SEEDS)} seeds.")  # fmt: skip
    at_t, beyond = trends[0], trends[-1]
    moves = {"grows": "grows", "shrinks": "shrinks", "flat": "neither grows nor shrinks"}
    slope_t, slope_3t = (_SLOPE.search(c["measured"]) for c in (at_t, beyond))
    trend_text = (f"the surgery's damage at n = T {moves[at_t['outcome']]} with scale"
                  f"{f' ({slope_t.group(0)})' if slope_t else ''}, and at 3T it {moves[beyond['outcome']]}"
                  f"{f' ({slope_3t.group(0)})' if slope_3t else ''}")  # fmt: skip
    trend_reads = {"grows": "normalisation", "flat": "agreement"}.get(at_t["outcome"], "neither")
    top = falls[-1]
    collapsed = [f"{_rung(c['claim']):,}" for c in falls if c["outcome"] == "collapses"]
    top_params = _rung(top["claim"]) or 0
    which = "no rung collapses" if not collapsed else f"the rungs of {', '.join(collapsed)} parameters collapse"
    verb = "collapses" if top["outcome"] == "collapses" else "does not collapse"
    where = f" ({top['measured']})" if top["measured"] else ""
    collapse_text = (
        f"at the top rung ({top_params:,} parameters) the surgery {verb} by E2 (d)'s criteria{where}, and {which}"
    )
    collapse_reads = "normalisation" if top["outcome"] == "collapses" else "agreement"
    recovered = [c for c in rescale if c["outcome"] == "agreement"]
    lost = [c for c in rescale if c["outcome"] == "normalisation"]
    others = len(rescale) - len(recovered) - len(lost)
    rescale_text = (f"the fixed per-step rescale recovers at least half of the loss at n = T (agreement (scale)) at "
                    f"{len(recovered)} of {len(rescale)} rungs" + (f", too little at {len(lost)}" if lost else "")
                    + (f", mixed or undecided at {others}" if others else ""))  # fmt: skip
    every_damaged = bool(recovered) and all(c["outcome"] in ("agreement", "undecided") for c in rescale)
    rescale_reads = "normalisation" if lost else "agreement" if every_damaged else "neither"
    parts = {"trend": trend_reads, "collapse": collapse_reads, "rescale": rescale_reads}
    if len(set(parts.values())) == 1 and trend_reads != "neither":
        tally = f"All three parts come out as the {trend_reads!r} reading predicts"
    else:
        tally = "Against the two readings' predictions, " + ", ".join(
            f"the {part} comes out as {'neither' if r == 'neither' else repr(r)} predicts" for part, r in parts.items()
        )
    ouro = f"Ouro's {paper.SURGERY_ACCURACY_AT_T:.3f} by n = T"
    if top["outcome"] == "collapses":
        paper_text = f"the paper's collapse ({ouro}) appears on this ladder at {top_params:,} parameters"
    elif at_t["outcome"] == "grows":
        paper_text = (f"the damage grows with scale: the ladder heads toward the paper's collapse ({ouro}) without "
                      f"reaching it at {top_params:,} parameters")  # fmt: skip
    elif at_t["outcome"] == "shrinks":
        paper_text = f"the ladder moves away from the paper's collapse ({ouro}) as the models grow"
    else:
        paper_text = (f"by these rules the ladder does not head toward the paper's collapse ({ouro}): the damage does "
                      f"not grow with scale, and up to {top_params:,} parameters no rung meets all three of E2 (d)'s "
                      "criteria")  # fmt: skip
    return f"Over {len(falls)} rungs, {trend_text}; {collapse_text}; {rescale_text}. {tally}, so {paper_text}. {LIMITS}"


# What the ladder's design cannot tell apart, whatever its outcomes (docs/results.md, corrected 2026-12-07; the train x
# run design of docs/design.md §10 tests it)
LIMITS = (
    "What this design cannot separate: every rung is norm-trained, so removing the norm is also running against the "
    "loop the model was trained with, and the rescale both restores the agreed scale and bounds the state, so "
    "'agreement' and 'the state's growth hurts' predict the same recovery; and accuracy cannot fall below chance, so "
    "a damage that already takes most of a rung's accuracy above chance can hardly read 'grows'."
)
