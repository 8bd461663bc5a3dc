"""Runs as cached units: train what is missing, evaluate, store; never recompute what is cached."""

from __future__ import annotations

import contextvars
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from engine.core.evaluate import evaluate
from engine.core.model import LoopedLM
from engine.core.presets import RunConfig
from engine.core.store import (
    RESULT_COLUMNS,
    ROW_COLUMNS,
    ROW_KEY,
    Store,
    atomic_write,
    machine,
    parquet_bytes,
    provenance,
)
from engine.core.train import train_group
from engine.errors import UsageError


def boundary_label(trained: str, evaluated: str) -> str:
    """`norm`, `none`, or `norm->none` for the surgery, so no reader can mix them."""
    return trained if trained == evaluated else f"{trained}->{evaluated}"


def label_rows(
    raw: pd.DataFrame, cfg: RunConfig, seeds: list[int], experiment: str, eval_boundary: str
) -> pd.DataFrame:
    """Turn evaluate()'s member-indexed rows into ROW_COLUMNS rows."""
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
    return rows[ROW_COLUMNS]


@dataclass(frozen=True)
class Live:
    """How a background job (engine.runtime.jobs) watches and protects the trainings an experiment starts."""

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


def group_id(cfg: RunConfig, group: list[int]) -> str:
    """A name for one training group: its checkpoint and its lock are called this."""
    return hashlib.sha256(" ".join(cfg.run_key(s) for s in group).encode()).hexdigest()[:16]


def checkpoint_path(store: Store, cfg: RunConfig, group: list[int]) -> Path:
    """Where a group's training checkpoint lives until the group's runs are stored."""
    return store.root / "jobs" / "ckpt" / f"{group_id(cfg, group)}.safetensors"


def missing_seeds(cfg: RunConfig, seeds: Iterable[int], store: Store, report: bool = True) -> list[int]:
    """The seeds without a valid cached run (`report`: say which damaged ones are redone)."""
    todo = []
    for seed in seeds:
        status = store.status(cfg.run_key(seed))
        if status == "ok":
            continue
        if status != "missing" and report:
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
    if group != cfg.group(group[0]):
        raise ValueError(f"seeds {group} are not a training group of this config (see RunConfig.group).")
    result = train_group(cfg, group, device, progress, checkpoint, checkpoint_every, on_step)
    t0 = time.perf_counter()  # evaluated where it trained: on a GPU, not the host CPU
    raw = evaluate(result.model, cfg.task, cfg.max_eval_loops, cfg.model.boundary, progress=progress)
    eval_s = time.perf_counter() - t0
    result.model.cpu()  # the weights to store
    rows = label_rows(raw, cfg, group, experiment, cfg.model.boundary)
    prov = provenance(result.device)
    recorded = result.device != "cpu" or cfg.train.precision != "fp32"  # CPU fp32 manifests stay as they were
    gpu = {"dtype_policy": result.policy} if recorded else {}
    if result.peak_memory_gib is not None:
        gpu |= {"peak_memory_gib": round(result.peak_memory_gib, 2),
                "estimated_memory_gib": round(result.estimated_memory_gib, 2)}  # fmt: skip
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
            "eval_wall_s": round(eval_s, 2),
            **gpu,
            "group": group,
            "steps": cfg.train.steps,
            "final_loss": float(losses[-1]),
            "loss_curve": [round(float(v), 5) for v in losses[:: max(1, len(losses) // 100)]],
            **({"resumed_from_step": result.resumed_from} if result.resumed_from else {}),
        }
        out.append((key, manifest, result.model.member_state(i), rows[rows["run_key"] == key]))
    return out


def store_group(store: Store, cfg: RunConfig, results) -> int:
    """Store the members of a trained group that are not stored yet (the others equal them: a run depends
    on its key alone); return how many. The caller holds the group's lock."""
    todo = set(missing_seeds(cfg, [m["seed"] for _, m, _, _ in results], store, report=False))
    for key, manifest, state, rows in results:
        if manifest["seed"] in todo:
            store.save_run(key, manifest, state, rows)
    return len(todo)


def train_and_store(
    cfg: RunConfig,
    group: list[int],
    store: Store,
    experiment: str,
    device: str = "cpu",
    progress: bool = True,
    wanted: Iterable[int] | None = None,
) -> bool:
    """Train a group and store what is missing, unless `wanted` is stored already (another process may be
    training it: then wait for it). Inside `with live(...)` the group is checkpointed under
    <root>/jobs/ckpt/ and resumes from there. Returns whether it trained."""
    wanted = list(group if wanted is None else wanted)
    if not missing_seeds(cfg, wanted, store, report=False):
        return False
    what = f"train {cfg.task.name} {cfg.model.arch} {cfg.model.boundary}, seeds {group[0]}-{group[-1]}"
    with store.lock(group_id(cfg, group), f"running '{what}'"):
        if not missing_seeds(cfg, wanted, store):  # stored by another process while we waited
            return False
        settings = _LIVE.get() or Live()
        checkpoint = checkpoint_path(store, cfg, group) if settings.checkpoint_every > 0 else None
        on_step = None
        if settings.report is not None:
            on_step = lambda done, total, loss: settings.report(what, done, total, loss)  # noqa: E731
        results = train_and_evaluate(cfg, group, experiment, device, progress, checkpoint, settings.checkpoint_every,
                                     on_step)  # fmt: skip
        store_group(store, cfg, results)
        if checkpoint is not None:
            checkpoint.unlink(missing_ok=True)  # the runs are stored: the checkpoint has done its job
    return True


def ensure_runs(
    cfg: RunConfig,
    seeds: Iterable[int],
    store: Store,
    experiment: str = "train",
    device: str = "cpu",
    progress: bool = True,
) -> list[str]:
    """Train and evaluate every seed without a valid cached run, always in its whole group (RunConfig.group);
    return the seeds' run keys."""
    seeds = list(seeds)
    for group in cfg.groups(seeds):
        train_and_store(cfg, group, store, experiment, device, progress, wanted=[s for s in group if s in seeds])
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
        model.load_member(i, store.load_weights(key))
    return model, cfg, [m["seed"] for m in manifests]


def extend_eval(
    store: Store,
    keys: list[str],
    loops: list[int],
    boundary: str | None = None,
    experiment: str = "train",
    device: str = "cpu",
    progress: bool = True,
    needed: Callable[[pd.DataFrame], bool] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Evaluate cached runs at more loop counts (or in the other boundary mode) from their weights, one run
    at a time under its lock. With `needed`, a run whose stored rows do not need it is skipped; on_step(difficulties
    done, of all runs' difficulties) is called after each (a background job's progress)."""
    out, done = [], 0
    for key in keys:
        with store.lock(f"run-{key}", f"changing run {key}"):
            if needed is not None and not needed(store.load_rows(key)):
                continue
            model, cfg, seeds = load_models(store, [key])
            mode = boundary or cfg.model.boundary
            parts, each = [], cfg.task.eval_difficulties  # one difficulty at a time: the same rows, with progress
            for d in each:
                parts.append(evaluate(model.to(device), cfg.task, max(loops), mode, loops, (d,), progress=progress))
                done += 1
                if on_step is not None:
                    on_step(done, len(keys) * len(each))
            rows = label_rows(pd.concat(parts, ignore_index=True), cfg, seeds, experiment, mode)
            store.add_rows(key, rows)
            out.append(rows)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=ROW_COLUMNS)


def merge_into_tables(store: Store, rows: pd.DataFrame, published: Path | None = None) -> list[str]:
    """Add a run's new rows to the experiment tables of store that hold the run, so the figures show them; return
    their names. With `published` (a background job in the workbench: engine.runtime.jobs), the tables that hold the
    run are published's, which are only read: store gets a table of the same name holding that table's rows of the
    run (and of the runs added before), the new rows on top; the published table is left as it is."""
    written = []
    for path in sorted(Path(published or store.root).glob("e*-*.parquet")):
        try:
            table = pd.read_parquet(path)
        except Exception:  # a damaged table is the dashboard's to report and a rerun's to rewrite
            continue
        if list(table.columns)[: len(RESULT_COLUMNS)] != RESULT_COLUMNS or "refit_target" in table:
            continue  # another kind of table (E3's refits, E1's probes)
        if not table["run_key"].isin(rows["run_key"]).any():
            continue  # a table without these runs
        new = rows.assign(experiment=table["experiment"].iloc[0])
        extra = [c for c in table.columns if c not in new.columns]  # E5's per-run columns (train_loops, params...)
        new = new.join(table.drop_duplicates("run_key").set_index("run_key")[extra], on="run_key") if extra else new
        target = store.root / path.name
        if published is not None:  # the store's own table (if any), then the published rows of these runs
            own = [pd.read_parquet(target)] if target.is_file() else []
            theirs = table[table["run_key"].isin(rows["run_key"])]
            table = pd.concat([*own, theirs], ignore_index=True).drop_duplicates(ROW_KEY, keep="first")
        merged = pd.concat([table, new], ignore_index=True).drop_duplicates(ROW_KEY, keep="last")
        atomic_write(target, parquet_bytes(merged.reset_index(drop=True)))
        written.append(path.name)
    return written


# ---------------------------------------------------------------- named experiments


PAPER_LABELS = ("norm", "none", "norm->none")  # the boundary labels of E2-E4's tables


def reaches(rows: pd.DataFrame, label: str, loops: int) -> bool:
    """Whether a run's rows hold boundary label `label` up to n = loops (what the surgeries add, cached)."""
    have = rows.loc[rows["boundary"] == label, "eval_loops"]
    return not have.empty and have.max() >= loops


def ensure_surgery(
    store: Store, keys: list[str], loops: int, experiment: str, device: str, progress: bool, trained: str = "norm"
) -> None:
    """Evaluate runs trained in mode `trained` in the other mode at n = 1..loops (`norm->none` rows; E5's reverse
    surgery `none->norm`) where that is not cached yet."""
    mode = "none" if trained == "norm" else "norm"

    def needed(rows: pd.DataFrame) -> bool:
        return not reaches(rows, boundary_label(trained, mode), loops)

    extend_eval(store, keys, list(range(1, loops + 1)), mode, experiment, device, progress, needed)


def collect(store: Store, keys: list[str], experiment: str, labels: Iterable[str] | None = None) -> pd.DataFrame:
    """The stored rows of `keys` as one table of `experiment`; with `labels`, only rows of those boundary labels
    (E2-E4 keep PAPER_LABELS: the rows E5 adds to the same runs stay in E5's table)."""
    rows = pd.concat([store.load_rows(k) for k in keys], ignore_index=True)
    if labels is not None:
        rows = rows[rows["boundary"].isin(list(labels))].reset_index(drop=True)
    return rows.assign(experiment=experiment)[[c for c in ROW_COLUMNS if c in rows]]  # older runs: no split


def manifest_precision(m: dict) -> str:
    """A manifest's train.precision (left out of an fp32 config, as in every run made before the option)."""
    train = (m.get("config") or {}).get("train") if isinstance(m, dict) else None
    return str(train.get("precision") or "fp32") if isinstance(train, dict) else "fp32"


def study_precisions(store: Store, preset_name: str) -> set[str]:
    """The train.precision of the study `preset_name` in store's folder: every value its experiment tables' runs
    have in their manifests (a table none of whose runs is stored: fp32, as every table made before the option;
    a damaged table is skipped, the dashboard's to report and a rerun's to rewrite); empty where it has no table."""
    from engine.core.store import KEY, MANIFEST
    from engine.experiments import NAMES

    found: set[str] = set()
    for name in NAMES:
        path = store.root / f"{name}-{preset_name}.parquet"
        if not path.is_file():
            continue
        try:
            keys = pd.read_parquet(path, columns=["run_key"])["run_key"].dropna().unique()
        except Exception:
            continue
        seen = set()
        for key in (k for k in keys if isinstance(k, str) and KEY.fullmatch(k)):
            try:
                seen.add(manifest_precision(json.loads((store.run_dir(key) / MANIFEST).read_text())))
            except (OSError, ValueError):  # not stored here, or unreadable: Store.status says so where it matters
                continue
        found |= seen or {"fp32"}
    return found


def check_study_precision(store: Store, preset_name: str, configs: Iterable[RunConfig]) -> None:
    """A study's precision is one value: UsageError (one sentence, exit 2) before anything is computed or written
    where `configs` (a run's trainings) train in another train.precision than the study's tables in store's folder.
    Every table writer calls it (run_trainings, e3.run, e5.run), and `loopscope run` before any training starts."""
    asked = {cfg.train.precision for cfg in configs}
    stored = study_precisions(store, preset_name) if asked else set()
    if stored and stored != asked:
        study, run = " and ".join(sorted(stored)), " and ".join(sorted(asked))
        keep = f", or with --precision {study} to extend it" if len(stored) == 1 else ""
        a = "an" if run.startswith("fp") else "a"
        raise UsageError(
            f"the `{preset_name}` study in {store.root} is {study}; {a} {run} run would mix precisions in one study: "
            f"run it with --results ANOTHER_FOLDER{keep}."
        )


RECIPE_PROBE_FILE = "recipe-probe.json"  # a study's recipe probe record, in its folder (engine.runtime.cpu_ladder)


def check_recipe_adopted(store: Store, preset_name: str, keys: Iterable[str] | None = None) -> None:
    """A preset whose recipe is chosen by its own recipe probe (`cpu-ladder`: presets.CPU_LADDER_RECIPE, adopted by
    engine.runtime.cpu_ladder's probe) trains nothing else before the probe's record in store's folder names that
    recipe: UsageError (one sentence, exit 2) otherwise. keys: the runs a caller would train where missing (e5.run;
    all stored: nothing to refuse); None (`cpu_ladder rungs`): refused whatever is stored. The probe's own seeds
    train through e5.ensure."""
    from engine.core.presets import CPU_LADDER_RECIPE
    from engine.studies import STUDIES

    probed = preset_name in STUDIES and STUDIES[preset_name].recipe_probe
    if not probed or keys is not None and all(store.status(k) == "ok" for k in keys):
        return
    path = store.root / RECIPE_PROBE_FILE
    try:
        adopted = json.loads(path.read_text()).get("adopted") if path.is_file() else None
    except (OSError, ValueError, AttributeError, RecursionError):  # not a record (nested too deep included): none
        adopted = None
    if adopted != CPU_LADDER_RECIPE:
        adopted = adopted[:40] if isinstance(adopted, str) else None  # a record's word, of its type, bounded
        raise UsageError(
            f"the recipe probe has {'adopted ' + adopted if adopted else 'not adopted a recipe'} and the cpu-ladder "
            f"preset trains {CPU_LADDER_RECIPE}; run the probe first (python -m engine.runtime.cpu_ladder probe), "
            "and set presets.CPU_LADDER_RECIPE to the adopted candidate in a commit before the other rungs run."
        )


def run_trainings(
    experiment: str,
    preset_name: str,
    trainings: list[tuple[RunConfig, str]],
    seeds: list[int],
    store: Store,
    device: str,
    progress: bool,
    surgery: Callable[[RunConfig], bool],
) -> pd.DataFrame:
    """Train and evaluate what `trainings` lists (config, owning experiment), evaluate the configs `surgery`
    picks in the other mode too, and write the table `<experiment>-<preset>`; return its rows."""
    check_study_precision(store, preset_name, [cfg for cfg, _ in trainings])
    keys = []
    for cfg, label in trainings:
        got = ensure_runs(cfg, seeds, store, label, device, progress=progress)
        if surgery(cfg):
            ensure_surgery(store, got, cfg.max_eval_loops, experiment, device, progress)
        keys += got
    rows = collect(store, keys, experiment, PAPER_LABELS)
    store.write_table(f"{experiment}-{preset_name}", rows)
    return rows


# ---------------------------------------------------------------- weights kept or not

REFIT_COLUMNS = (*RESULT_COLUMNS, "refit_target", "refit_steps", "split")  # E3's rows: the refit and the split


def refit_store(store: Store) -> Store:
    """E3's refits' own store: <root>/refits/<refit_key>/ with E3's rows (REFIT_COLUMNS) and weights."""
    return Store(store.root, folder="refits", columns=REFIT_COLUMNS)


def lighten(store: Store, why: str) -> tuple[int, int]:
    """Keep the weights of the lowest seed of every training group (runs and E3 refits) and store the others
    without theirs (Store.drop_weights); return (runs kept with weights, runs made weightless)."""
    kept = dropped = 0
    for s in (store, refit_store(store)):
        groups: dict[tuple, list[tuple[int, str]]] = {}
        for key in s.run_keys():
            m = s.manifest(key)
            unit = json.dumps([m.get(f) for f in ("config", "task", "refit", "group")], sort_keys=True)
            groups.setdefault(unit, []).append((m["seed"], key))
        for members in groups.values():
            members.sort()
            kept += 1
            dropped += sum(s.drop_weights(key, why) for _, key in members[1:])
    return kept, dropped


def machine_text(m: dict) -> str:
    """A manifest's `machine` in a few words: what bit-identity rests on (engine.core.store.machine)."""
    if not m:
        return "not recorded"
    cpu, capability, threads = (m.get(k, "?") for k in ("cpu", "torch_cpu_capability", "threads"))
    return f"{cpu}, torch CPU capability {capability}, {threads} threads"


def capability_hint(made: dict) -> str:
    """Where the maker's torch CPU capability differs from this machine's, how to run its kernels here: the shipped
    AVX2 runs restore bit for bit on an AVX-512 machine with ATEN_CPU_CAPABILITY=avx2 and one thread (dev/LOG.md)."""
    theirs, here = str(made.get("torch_cpu_capability", "")), machine()["torch_cpu_capability"]
    if not theirs or theirs == here:
        return ""
    return (f" (try ATEN_CPU_CAPABILITY={theirs.lower()} OMP_NUM_THREADS={made.get('threads', 1)} "
            "loopscope restore ...: torch then picks the kernels the maker's machine used)")  # fmt: skip


def restore(store: Store, keys: list[str], device: str = "cpu", progress: bool = True) -> dict[str, str]:
    """Retrain the groups of weightless runs into a temporary folder and keep a retrained seed's weights only
    if its rows equal the stored rows bit for bit; return, per key, what happened (one sentence each)."""
    import tempfile

    from engine.core.store import MODEL, weights_not_kept

    outcome, todo = {}, {}
    for key in keys:
        m = store.manifest(key)
        if weights_not_kept(m) is None:
            outcome[key] = "has its weights already; nothing to do"
            continue
        cfg = RunConfig.from_dict(m["config"])
        todo.setdefault(cfg, []).append((m["seed"], key))
    with tempfile.TemporaryDirectory(prefix="loopscope-restore-") as tmp:
        fresh = Store(Path(tmp))
        for cfg, members in todo.items():
            ensure_runs(cfg, [s for s, _ in members], fresh, "restore", device, progress)
            for _, key in members:
                new, old = fresh.load_rows(key), store.load_rows(key)
                on = [c for c in ROW_KEY if c != "experiment"]
                both = new.merge(old, on=on, how="left", suffixes=("", "_stored"))
                same = both["value_stored"].notna().all() and bool(
                    (both["value"].to_numpy() == both["value_stored"].to_numpy()).all()
                )
                if not same:
                    made = store.manifest(key).get("machine") or {}
                    differ = int((both["value"] != both["value_stored"]).sum())
                    outcome[key] = (
                        f"retrained rows differ from the stored ones ({differ} of {len(both)} values): this machine "
                        f"({machine_text(machine())}) rounds differently from the one that made it "
                        f"({machine_text(made)}); nothing stored{capability_hint(made)}"
                    )
                    continue
                store.restore_weights(key, MODEL, fresh.read(key, MODEL))
                outcome[key] = f"restored: {len(both)} retrained rows equal the stored ones bit for bit"
    return outcome
