"""`loopscope verify`: retrain seeds of a shipped study on this machine and say whether they match it.

A run is bit-identical when it is retrained by the same code on the same kind of machine: the CPU model and
its vector instruction sets decide which kernels torch and the BLAS pick, and so the rounding (dev/LOG.md,
2026-12-03: another x86-64 CPU gave different weights for every seed, the thread count changed nothing).
So verify first compares bit for bit; where that fails it asks whether the retrained seeds fall inside
the shipped seeds' distribution, per n, with a Mann-Whitney test (two-sided) on the accuracy over the
held-out (or in-range) difficulties. A shipped run stored without its weights (engine.core.store) is judged
bit for bit on its rows alone (every stored value equal), which the report says.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import torch

from engine import paper
from engine.core import stats
from engine.core.presets import RunConfig
from engine.core.store import Store, machine, weights_not_kept
from engine.experiments.runs import ensure_runs


def judged_accuracy(rows: pd.DataFrame, cfg: RunConfig) -> pd.DataFrame:
    """Per seed and n, accuracy averaged over the held-out training difficulties (all training difficulties
    where the config holds nothing out), in the mode the runs were trained with."""
    acc = rows[(rows["metric"] == "accuracy") & (rows["boundary"] == cfg.model.boundary)]
    acc = acc[acc["difficulty"].isin(cfg.task.train_difficulties)]
    return acc.groupby(["seed", "eval_loops"], as_index=False)["value"].mean()


def verify(store: Store, cfg: RunConfig, seeds: list[int], device: str = "cpu", progress: bool = True) -> dict:
    """Retrain `seeds` (in their whole groups) into a temporary folder and compare them with `store`'s runs."""
    shipped_keys = [cfg.run_key(s) for s in cfg.group(seeds[0])]
    shipped_keys = [k for k in shipped_keys if store.status(k) == "ok"]
    with tempfile.TemporaryDirectory(prefix="loopscope-verify-") as tmp:
        fresh = Store(Path(tmp))
        ensure_runs(cfg, seeds, fresh, "verify", device, progress)
        identical, rows_only = {}, []
        for seed in seeds:
            key = cfg.run_key(seed)
            if weights_not_kept(store.manifest(key)) is None:
                a, b = store.load_weights(key), fresh.load_weights(key)
                same = a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
            else:
                same, rows_only = True, [*rows_only, seed]
            rows_a, rows_b = store.load_rows(key), fresh.load_rows(key)
            keys = [c for c in rows_b.columns if c not in ("value", "experiment")]  # experiment: "verify" here
            common = rows_b.merge(rows_a, on=keys, suffixes=("", "_shipped"))
            identical[seed] = bool(
                same and len(common) == len(rows_b) and (common["value"] == common["value_shipped"]).all()
            )
        retrained = judged_accuracy(pd.concat([fresh.load_rows(cfg.run_key(s)) for s in seeds]), cfg)
    shipped = judged_accuracy(pd.concat([store.load_rows(k) for k in shipped_keys]), cfg)
    per_n = []
    for n, here in retrained.groupby("eval_loops"):
        there = shipped[shipped["eval_loops"] == n]["value"].to_numpy()
        per_n.append({
            "n": int(n), "retrained": here["value"].mean(), "shipped": there.mean(),
            "shipped_min": there.min(), "shipped_max": there.max(),
            "inside": bool(((here["value"] >= there.min()) & (here["value"] <= there.max())).all()),
            "mann_whitney_p": stats.mann_whitney_p(here["value"].to_numpy(), there),
        })  # fmt: skip
    return {
        "identical": identical,
        "rows_only": rows_only,
        "per_n": pd.DataFrame(per_n),
        "machine": machine(),
        "shipped_seeds": len(shipped_keys),
        "retrained_groups": cfg.groups(seeds),
    }


def report(result: dict, cfg: RunConfig) -> str:
    lines = [f"{cfg.task.name} {cfg.model.arch} {cfg.model.boundary}: this machine {result['machine']}"]
    for seed, same in result["identical"].items():
        lines.append(f"  seed {seed}: {'bit-identical to the shipped run' if same else 'differs from the shipped run'}")
    if result.get("rows_only"):
        lines.append(
            f"  (seeds {', '.join(map(str, result['rows_only']))}: weights not kept here, so compared on their stored "
            "rows alone, every value bit for bit)"
        )
    if all(result["identical"].values()):
        return "\n".join([*lines, "verified: bit for bit."])
    groups = result["retrained_groups"]
    if len(result["identical"]) < sum(map(len, groups)):  # the rest of the groups was retrained, not compared
        spelled = ",".join(f"{g[0]}-{g[-1]}" for g in groups)  # a group is a range of seeds (RunConfig.group)
        lines.append(
            f"  (each seed trained in its whole group of {cfg.train.group_size}: asking for the groups' other seeds "
            f"too, --seeds {spelled}, costs nothing more and gives the test below its power)"
        )
    lines.append(
        f"  not bit-identical: per n, the retrained seeds against the {result['shipped_seeds']} shipped seeds "
        f"(accuracy over the judged difficulties; Mann-Whitney, two-sided; outside = p < {paper.ALPHA}):"
    )
    for r in result["per_n"].itertuples():
        flag = "ok" if r.mann_whitney_p >= paper.ALPHA else "OUTSIDE"
        lines.append(
            f"  n={r.n:3d}  retrained {r.retrained:.3f}  shipped {r.shipped:.3f} [{r.shipped_min:.3f}, "
            f"{r.shipped_max:.3f}]  all in shipped range: {r.inside}  p {r.mann_whitney_p:.3g}  {flag}"
        )
    return "\n".join(lines)
