"""Runs as cached units: train what is missing, evaluate, store; never recompute what is cached."""

from __future__ import annotations

import sys
from collections.abc import Iterable

import pandas as pd
import torch

from engine.evaluate import evaluate
from engine.model import LoopedLM
from engine.presets import RunConfig
from engine.store import RESULT_COLUMNS, Store, provenance
from engine.train import train_group


def boundary_label(trained: str, evaluated: str) -> str:
    """`norm`, `none`, or `norm->none` for the surgery, so no reader can mix them."""
    return trained if trained == evaluated else f"{trained}->{evaluated}"


def label_rows(
    raw: pd.DataFrame, cfg: RunConfig, seeds: list[int], experiment: str, eval_boundary: str
) -> pd.DataFrame:
    """Turn evaluate()'s member-indexed rows into RESULT_COLUMNS rows."""
    seed_of = pd.Series(seeds)
    rows = raw.assign(
        experiment=experiment,
        seed=seed_of[raw["member"]].to_numpy(),
        run_key=[cfg.run_key(s) for s in seed_of[raw["member"]]],
        task=cfg.task.name,
        arch=cfg.model.arch,
        boundary=boundary_label(cfg.model.boundary, eval_boundary),
        trained_loops=cfg.model.trained_loops,
    )
    return rows[RESULT_COLUMNS]


def ensure_runs(
    cfg: RunConfig,
    seeds: Iterable[int],
    store: Store,
    experiment: str = "train",
    device: str = "cpu",
    group_size: int = 16,
    progress: bool = True,
) -> list[str]:
    """Train and evaluate every seed that has no valid cached run; return all seeds' run keys."""
    seeds = list(seeds)
    todo = []
    for seed in seeds:
        status = store.status(cfg.run_key(seed))
        if status == "ok":
            continue
        if status != "missing":
            print(f"loopscope: {status}; redoing it.", file=sys.stderr)
        todo.append(seed)
    for start in range(0, len(todo), group_size):
        group = todo[start : start + group_size]
        result = train_group(cfg, group, device=device, progress=progress)
        raw = evaluate(result.model, cfg.task, cfg.eval_loops, cfg.model.boundary, progress=progress)
        rows = label_rows(raw, cfg, group, experiment, cfg.model.boundary)
        prov = provenance(result.device)
        for i, seed in enumerate(group):
            key = cfg.run_key(seed)
            losses = result.losses[:, i]
            manifest = {
                "seed": seed,
                "experiment": experiment,
                "config": cfg.to_dict(),
                **prov,
                "wall_time_s": round(result.wall_s, 2),
                "group_size": len(group),
                "steps": cfg.train.steps,
                "final_loss": float(losses[-1]),
                "loss_curve": [round(float(v), 5) for v in losses[:: max(1, len(losses) // 100)]],
            }
            store.save_run(key, manifest, result.model.member_state(i), rows[rows["run_key"] == key])
    return [cfg.run_key(s) for s in seeds]


def load_models(store: Store, keys: list[str]) -> tuple[LoopedLM, RunConfig, list[int]]:
    """Load runs that share one config into one ensemble (one member per run)."""
    manifests = [store.manifest(k) for k in keys]
    cfgs = {RunConfig.from_dict(m["config"]) for m in manifests}
    if len(cfgs) != 1:
        raise ValueError("runs loaded together must share one config; evaluate them separately.")
    cfg = cfgs.pop()
    model = LoopedLM(cfg.model, members=len(keys))
    for i, key in enumerate(keys):
        model.load_member(i, store.load_checkpoint(key))
    return model, cfg, [m["seed"] for m in manifests]


def extend_eval(
    store: Store,
    keys: list[str],
    loops: list[int],
    boundary: str | None = None,
    experiment: str = "train",
    device: str = "cpu",
    progress: bool = True,
) -> pd.DataFrame:
    """Evaluate cached runs at more loop counts (or in the other boundary mode) from their checkpoints."""
    model, cfg, seeds = load_models(store, keys)
    mode = boundary or cfg.model.boundary
    with torch.no_grad():
        raw = evaluate(model.to(device), cfg.task, max(loops), mode, loops=loops, progress=progress)
    rows = label_rows(raw, cfg, seeds, experiment, mode)
    for key in keys:
        store.add_rows(key, rows[rows["run_key"] == key])
    return rows


# ---------------------------------------------------------------- named experiments


def ensure_surgery(store: Store, keys: list[str], loops: int, experiment: str, device: str, progress: bool) -> None:
    """Evaluate norm-trained runs in none mode (`norm->none` rows) where that is not cached yet."""
    missing = []
    for key in keys:
        rows = store.load_rows(key)
        have = rows.loc[rows["boundary"] == "norm->none", "eval_loops"]
        if have.empty or have.max() < loops:
            missing.append(key)
    if missing:
        extend_eval(store, missing, list(range(1, loops + 1)), "none", experiment, device, progress)


def collect(store: Store, keys: list[str], experiment: str) -> pd.DataFrame:
    rows = pd.concat([store.load_rows(k) for k in keys], ignore_index=True)
    return rows.assign(experiment=experiment)[RESULT_COLUMNS]
