"""Runs as cached units: train what is missing, evaluate, store; never recompute what is cached."""

from __future__ import annotations

import contextvars
import hashlib
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from engine.evaluate import evaluate
from engine.model import LoopedLM
from engine.presets import RunConfig
from engine.store import RESULT_COLUMNS, ROW_KEY, Store, atomic_write, parquet_bytes, provenance
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


@dataclass(frozen=True)
class Live:
    """How a background job (engine.jobs) watches and protects the trainings an experiment starts."""

    checkpoint_every: int = 0  # steps between checkpoints under <results>/jobs/ckpt/ (0: none)
    report: Callable[[str, int, int, float], None] | None = None  # (what, steps done, total, mean loss)


_LIVE: contextvars.ContextVar[Live | None] = contextvars.ContextVar("loopscope_live", default=None)


@contextmanager
def live(settings: Live) -> Iterator[None]:
    """Checkpoint and report every training that ensure_runs starts inside this block (e2.run, e4.run...)."""
    token = _LIVE.set(settings)
    try:
        yield
    finally:
        _LIVE.reset(token)


def checkpoint_path(store: Store, cfg: RunConfig, seeds: list[int]) -> Path:
    """Where a group's training checkpoint lives until the group's runs are stored."""
    group = hashlib.sha256(" ".join(cfg.run_key(s) for s in seeds).encode()).hexdigest()[:16]
    return store.root / "jobs" / "ckpt" / f"{group}.safetensors"


def missing_seeds(cfg: RunConfig, seeds: Iterable[int], store: Store) -> list[int]:
    """The seeds without a valid cached run (a damaged one is reported and redone)."""
    todo = []
    for seed in seeds:
        status = store.status(cfg.run_key(seed))
        if status == "ok":
            continue
        if status != "missing":
            print(f"loopscope: {status}; redoing it.", file=sys.stderr)
        todo.append(seed)
    return todo


def train_and_evaluate(
    cfg: RunConfig,
    group: list[int],
    experiment: str,
    device: str = "cpu",
    progress: bool = True,
    checkpoint: Path | None = None,
    checkpoint_every: int = 0,
    on_step: Callable[[int, int, float], None] | None = None,
) -> list[tuple[str, dict, dict[str, torch.Tensor], pd.DataFrame]]:
    """Train one group of seeds and evaluate it: (run key, manifest, weights, rows) per seed, not yet stored
    (a Ray task returns these to the driver, which owns the store)."""
    result = train_group(cfg, group, device, progress, checkpoint, checkpoint_every, on_step)
    raw = evaluate(result.model, cfg.task, cfg.eval_loops, cfg.model.boundary, progress=progress)
    rows = label_rows(raw, cfg, group, experiment, cfg.model.boundary)
    prov = provenance(result.device)
    out = []
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
            **({"resumed_from_step": result.resumed_from} if result.resumed_from else {}),
        }
        out.append((key, manifest, result.model.member_state(i), rows[rows["run_key"] == key]))
    return out


def groups_of(todo: list, size: int) -> list[list]:
    """`todo` (seeds, or run keys) in consecutive groups of `size`: the groups trained (ensure_runs) or
    refit (engine.e3) together, in order. A seed's result depends on its group's size (engine.train)."""
    return [todo[i : i + size] for i in range(0, len(todo), size)]


def ensure_runs(
    cfg: RunConfig,
    seeds: Iterable[int],
    store: Store,
    experiment: str = "train",
    device: str = "cpu",
    group_size: int = 16,
    progress: bool = True,
) -> list[str]:
    """Train and evaluate every seed that has no valid cached run; return all seeds' run keys.

    Inside `with live(...)`, each group is checkpointed under <results>/jobs/ckpt/ and resumes from there."""
    seeds = list(seeds)
    todo = missing_seeds(cfg, seeds, store)
    settings = _LIVE.get() or Live()
    for group in groups_of(todo, group_size):
        checkpoint = checkpoint_path(store, cfg, group) if settings.checkpoint_every > 0 else None
        on_step = None
        if settings.report is not None:
            what = f"train {cfg.task.name} {cfg.model.arch} {cfg.model.boundary}, seeds {', '.join(map(str, group))}"
            on_step = lambda done, total, loss, what=what: settings.report(what, done, total, loss)
        for key, manifest, state, rows in train_and_evaluate(
            cfg, group, experiment, device, progress, checkpoint, settings.checkpoint_every, on_step
        ):
            store.save_run(key, manifest, state, rows)
        if checkpoint is not None:
            checkpoint.unlink(missing_ok=True)  # the runs are stored: the checkpoint has done its job
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


def merge_into_tables(store: Store, rows: pd.DataFrame) -> list[str]:
    """Add a run's new rows to every experiment table that holds the run, so the figures show them."""
    written = []
    for path in sorted(store.root.glob("e*-*.parquet")):
        try:
            table = pd.read_parquet(path)
        except Exception:  # a damaged table is the dashboard's to report and a rerun's to rewrite
            continue
        if list(table.columns) != RESULT_COLUMNS or not table["run_key"].isin(rows["run_key"]).any():
            continue  # another kind of table (E3's refits, E1's probes), or without these runs
        new = rows.assign(experiment=table["experiment"].iloc[0])
        merged = pd.concat([table, new], ignore_index=True).drop_duplicates(ROW_KEY, keep="last")
        atomic_write(path, parquet_bytes(merged.reset_index(drop=True)))
        written.append(path.name)
    return written


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
