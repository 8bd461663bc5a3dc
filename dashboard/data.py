"""Reading the results store for the dashboard: cached, keyed on the files' state, never raising.

The cached functions take the files' (size, mtime) as an argument named `state`: it is only the cache key,
so a rewritten file is read again (st.cache_data skips arguments whose names start with an underscore,
so the key must not be called `_state`).

Every loader returns data together with a list of problems (sentences for the reader), so a
damaged or unreadable file becomes a message on the page, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import charts, results
from dashboard.matrix import DRILL
from dashboard.results import OWN_FOLDER, catalog, presets, results_root, table_path, tables_state  # noqa: F401
from dashboard.ui import as_text  # what a visitor typed, shown as text
from engine import studies
from engine.core import stats
from engine.core.presets import train_ranges
from engine.core.store import RESULT_COLUMNS, CorruptRun, Store, weights_not_kept
from engine.experiments import e3, e4, verdicts
from engine.runtime import jobs

HELD_OUT = (verdicts.MEAN, verdicts.HARDEST)  # the second design's judged levels: "held-out mean", "hardest held-out"
SUMMARY_LEVELS = (*HELD_OUT, "in-range mean", "beyond-range mean", "all difficulties mean")
ENGINE_LEVELS = dict(zip(SUMMARY_LEVELS[2:], e3.LEVELS, strict=True))  # the page's choice -> e3's level
SPLITS = {"heldout": "held-out", "seen": "seen in training", "beyond": "beyond the training range"}


def files_state(root: Path) -> tuple:
    """(path, size, mtime) of every file under root: the cache key that changes when results do."""
    if not root.is_dir():
        return ()
    found = []
    for p in root.rglob("*"):
        try:
            stat = p.stat()
        except OSError:  # removed while listed
            continue
        if S_ISREG(stat.st_mode):
            found.append((str(p), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


# ---------------------------------------------------------------- experiment tables


@dataclass
class Table:
    """One experiment table at one preset; rows is None when the table is missing or unreadable."""

    experiment: str
    preset: str
    rows: pd.DataFrame | None = None
    problems: list[str] = field(default_factory=list)
    root: Path | None = None  # the results folder it is in
    key: tuple | None = None  # (path, size, mtime): which bytes the rows were read from (None: no rows)

    @property
    def seeds(self) -> list[int]:
        return sorted(int(s) for s in self.rows["seed"].unique()) if self.rows is not None else []


# cache_resource, not cache_data: one shared Table, never copied (cache_data unpickles its ~10 MB of rows on every
# call, 10-20 ms of each page view); nothing changes a table's rows in place (pandas copies on write)
@st.cache_resource(max_entries=16, show_spinner=False)
def _read_table(path: str, experiment: str, preset_name: str, state: tuple) -> Table:
    table = Table(experiment, preset_name, root=Path(path).parent)
    try:
        rows = pd.read_parquet(path)
    except Exception as e:  # any damage: truncated, not parquet, unreadable
        table.problems.append(
            f"`{Path(path).name}` could not be read ({type(e).__name__}); "
            f"rerun `loopscope run {experiment} --preset {preset_name}` to rewrite it."
        )
        return table
    missing = [c for c in RESULT_COLUMNS if c not in rows.columns]
    if missing:
        table.problems.append(f"`{Path(path).name}` lacks the columns {', '.join(missing)}; it is not a results table.")
        return table
    if "split" in rows:  # the second design: each row says where its items come from
        rows["range"] = np.where(rows["split"] == "beyond", "beyond", "in-range")
    else:
        ranges = train_ranges(preset_name, rows["task"].unique())
        inside = [d in ranges.get(t, ()) for t, d in zip(rows["task"], rows["difficulty"], strict=True)]
        rows["range"] = np.where(rows["task"].isin(list(ranges)), np.where(inside, "in-range", "beyond"), "n/a")
    table.rows, table.key = rows, (path, *state)
    return table


def table(experiment: str, preset_name: str, root: Path | None = None) -> Table:
    """The table `<root>/<experiment>-<preset>.parquet` (root: the results folder unless given; in the study's own
    folder for a study that has one, dashboard.results.table_path), read once per change of the file."""
    path = table_path(root or results_root(), experiment, preset_name)
    if not path.is_file():
        return Table(experiment, preset_name, root=path.parent)
    stat = path.stat()
    return _read_table(str(path), experiment, preset_name, (stat.st_size, stat.st_mtime_ns))


def difficulty_options(rows: pd.DataFrame) -> list[str]:
    """The summary levels present, then every difficulty (as text: the value is also its URL form)."""
    levels = [lvl for lvl in SUMMARY_LEVELS if level_mask(rows, lvl).any()]
    return levels + [str(d) for d in sorted(rows["difficulty"].unique())]


def equivalent_level(rows: pd.DataFrame, level: str) -> str | None:
    """The same difficulty choice in another table, or its nearest stand-in where that table lacks it (a
    first-design table has no held-out items: their in-range mean, or its hardest in-range difficulty);
    None where it has nothing comparable."""
    if level_mask(rows, level).any():
        return level
    if level == verdicts.MEAN and level_mask(rows, "in-range mean").any():
        return "in-range mean"
    in_range = rows.loc[rows["range"] == "in-range", "difficulty"]
    return str(int(in_range.max())) if level == verdicts.HARDEST and len(in_range) else None


def level_mask(rows: pd.DataFrame, level: str) -> pd.Series:
    """The rows of a difficulty choice: a summary level (SUMMARY_LEVELS; the held-out ones as
    engine.experiments.verdicts.levels defines them) or one difficulty."""
    if level in HELD_OUT:
        held = rows["split"] == "heldout" if "split" in rows else pd.Series(False, index=rows.index)
        if level == verdicts.HARDEST:
            hardest = rows["difficulty"].where(held).groupby(rows["task"]).transform("max")
            held &= rows["difficulty"] == hardest
        return held
    if level == "in-range mean":
        return rows["range"] == "in-range"
    if level == "beyond-range mean":
        return rows["range"] == "beyond"
    if level == "all difficulties mean":
        return pd.Series(True, index=rows.index)
    return rows["difficulty"] == int(level)


def token_name(token_id) -> str:
    """The vocabulary entry of a token id (engine.core.tasks.VOCAB), or the id where it is out of range."""
    from engine.core.tasks import VOCAB

    i = int(token_id)
    return VOCAB[i] if 0 <= i < len(VOCAB) else str(i)


def seed_values(rows: pd.DataFrame, metric: str, difficulty: str, by: list[str]) -> pd.DataFrame:
    """One value per seed and group: the metric averaged over the chosen difficulties (stats.seed_means)."""
    return stats.seed_means(rows[level_mask(rows, difficulty)], metric, by)


@st.cache_data(max_entries=64, show_spinner=False)
def curve_stats(per_seed: pd.DataFrame, by: tuple[str, ...]) -> pd.DataFrame:
    """Mean and 95% bootstrap CI over seeds per group (engine.core.stats.mean_ci), cached on the data."""
    return stats.mean_ci(per_seed, list(by))


@st.cache_data(max_entries=64, show_spinner=False)
def mode_comparison_by(per_seed: pd.DataFrame, by: tuple[str, ...], col: str, a: str, b: str) -> pd.DataFrame:
    """Cliff's delta of b against a (column col) per group, with its CI and p (engine.core.stats.summarize_modes)."""
    return stats.summarize_modes(per_seed, group_cols=by, mode_col=col, a=a, b=b)


@st.cache_data(max_entries=64, show_spinner=False)
def paired_summary(per_seed: pd.DataFrame, x: str, col: str, a: str, b: str, family_T: int) -> pd.DataFrame:
    """a against b of the same seed per x (engine.core.stats.paired_summary): mean difference with its CI,
    Wilcoxon p, Holm p within each side of family_T (below, at, beyond), and the paper's Cliff's delta and
    Mann-Whitney p on the same seeds."""
    return stats.paired_summary(per_seed, [x], col, a, b, trained_loops=family_T, loops_col=x)


E4_FAMILIES = {"n": 1, "ratio": 0, "difference": 0}  # the T whose sides make docs/design.md's Holm families for E4:
# n = 2..3T (n = 1 alone), the matched ratios o = 1, 2, 3, and the differences n - T > 0 (0 alone)


def compare_roots() -> list[Path]:
    """The folders under which a writable dashboard's compare box may read: LOOPSCOPE_COMPARE_ROOTS
    (os.pathsep-separated), else the results folder's parent."""
    listed = [p for p in os.environ.get("LOOPSCOPE_COMPARE_ROOTS", "").split(os.pathsep) if p.strip()]
    return [Path(p).expanduser().resolve() for p in listed] or [results_root().resolve().parent]


def compare_folder(text: str) -> Path | None:
    """The other results folder a comparison reads, or None for this one. A read-only copy reads only the folders
    listed in LOOPSCOPE_COMPARE (os.pathsep-separated): a public page must not open paths its visitors type.
    A writable one reads only folders under compare_roots(), symbolic links resolved, whatever is typed."""
    if not text.strip():
        return None
    folder = Path(text.strip()).expanduser()
    listed = [Path(p).expanduser().resolve() for p in os.environ.get("LOOPSCOPE_COMPARE", "").split(os.pathsep) if p]
    if jobs.read_only() and folder.resolve() not in listed:
        st.warning(f"{as_text(folder)} is not among the folders this read-only copy compares with (LOOPSCOPE_COMPARE).")
        return None
    roots = [*compare_roots(), results_root().resolve() / jobs.WORKBENCH]  # the jobs' own folder (not a link out)
    if not jobs.read_only() and not any(folder.resolve().is_relative_to(root) for root in roots):
        st.warning(
            f"{as_text(folder)} is outside the folders this dashboard compares from "
            f"({', '.join(f'`{r}`' for r in roots)}; LOOPSCOPE_COMPARE_ROOTS sets them)."
        )
        return None
    if not folder.is_dir():
        st.warning(f"{as_text(folder)} is not a folder.")
        return None
    return folder


def mode_comparison(per_seed: pd.DataFrame, by: tuple[str, ...]) -> pd.DataFrame:
    """Cliff's delta none vs norm per group."""
    return mode_comparison_by(per_seed, by, "boundary", "norm", "none")


# ---------------------------------------------------------------- E3 and E4: the engine's own summaries


def _engine_rows(experiment: str, preset_name: str) -> pd.DataFrame | None:
    """The table's rows as the engine wrote them (without the dashboard's `range` column)."""
    rows = table(experiment, preset_name).rows
    return None if rows is None else rows.drop(columns="range")


def engine_level(choice: str):
    """A difficulty choice of the page ('in-range mean', ..., or a difficulty) as engine.experiments.e3 names it;
    'held-out mean' is E3's in-range mean where every in-range item is held out (e3_levels)."""
    return ENGINE_LEVELS.get(choice) or (e3.LEVELS[0] if choice == verdicts.MEAN else int(choice))


def e3_levels(rows: pd.DataFrame, metric: str) -> list[str]:
    """The difficulty choices of an E3 metric: recovery is stored for the in-range mean (at difficulty
    e3.IN_RANGE) and per difficulty; accuracy has every level and difficulty."""
    picked = rows[(rows["metric"] == metric) & (rows["difficulty"] != e3.IN_RANGE)]
    # the second design holds out every in-range item E3 evaluates: its in-range mean is the verdicts' held-out mean
    # (as the other pages name it); the first design's table has no split and keeps "in-range mean"
    in_range = picked[picked["range"] == "in-range"] if "range" in picked else picked.iloc[:0]
    held = "split" in picked and len(in_range) and bool((in_range["split"] == "heldout").all())
    mean = verdicts.MEAN if held else "in-range mean"
    if metric == "recovery":
        return [mean] + [str(d) for d in sorted(picked["difficulty"].unique())]
    levels = [level for level in difficulty_options(picked) if level not in HELD_OUT]  # e3's own levels only
    return [mean if level == "in-range mean" else level for level in levels]


@st.cache_data(max_entries=32, show_spinner=False)
def _e3_curves(preset_name: str, metric: str, difficulty: str, state: tuple) -> tuple[pd.DataFrame | None, str | None]:
    rows = _engine_rows("e3", preset_name)
    try:
        level = engine_level(difficulty)
        if metric == "recovery" and level == "in-range":  # the headline: exactly what the claims read
            return e3.summarize(rows, preset_name), None
        return e3.curves(rows, preset_name, metric, level), None
    except Exception as e:  # a table too small or too odd to summarise is a message, not a crash
        return None, f"`e3-{preset_name}.parquet` could not be summarised ({type(e).__name__}: {e})."


def e3_curves(preset_name: str, metric: str, difficulty: str) -> tuple[pd.DataFrame | None, str | None]:
    """Per task, target, refit step and n: the mean over seeds with its CI, seeds guarded and plateau:
    engine.experiments.e3.summarize for the in-range recovery (the claims' table), else e3.curves."""
    return _e3_curves(preset_name, metric, difficulty, tables_state(results_root()))


@st.cache_data(max_entries=32, show_spinner=False)
def _e3_seed_values(preset_name: str, metric: str, difficulty: str, state: tuple) -> pd.DataFrame:
    return e3.seed_values(_engine_rows("e3", preset_name), preset_name, metric, engine_level(difficulty))


def e3_seed_values(preset_name: str, metric: str, difficulty: str) -> pd.DataFrame:
    """The per-seed values behind e3_curves (engine.experiments.e3.seed_values)."""
    return _e3_seed_values(preset_name, metric, difficulty, tables_state(results_root()))


def _e4_rows(root: str, preset_name: str, task: str, difficulty: str) -> pd.DataFrame:
    rows = table("e4", preset_name, Path(root)).rows
    rows = rows[(rows["task"] == task) & level_mask(rows, difficulty)]
    return rows.drop(columns="range")


@st.cache_data(max_entries=64, show_spinner=False)
def _e4_summaries(root: str, preset_name: str, task: str, difficulty: str, axis: str, metric: str, state: tuple):
    rows = _e4_rows(root, preset_name, task, difficulty)
    try:
        return e4.curves(rows, axis, metric), e4.compare(rows, axis, metric), None
    except Exception as e:
        return None, None, f"`e4-{preset_name}.parquet` could not be summarised ({type(e).__name__}: {e})."


def e4_summaries(preset_name: str, task: str, difficulty: str, axis: str, metric: str, root: Path | None = None):
    """E4 on the task's rows at the chosen difficulties, on one axis (n, ratio n/T, difference n - T):
    each architecture's curve per mode (engine.experiments.e4.curves) and looped vs stacked where both
    exist (e4.compare: the gap, Cliff's delta with its CI, p); with E4's modes, where the stacked model
    run as `norm->none` stands for `none`. All difficulties pooled, this is e4.summarize's table."""
    root = root or results_root()
    return _e4_summaries(str(root), preset_name, task, difficulty, axis, metric, tables_state(root))


@st.cache_data(max_entries=32, show_spinner=False)
def _e4_seed_values(root: str, preset_name: str, task: str, difficulty: str, axis: str, metric: str, state: tuple):
    return e4.seed_values(_e4_rows(root, preset_name, task, difficulty), axis, metric)


def e4_seed_values(
    preset_name: str, task: str, difficulty: str, axis: str, metric: str, root: Path | None = None
) -> pd.DataFrame:
    """The per-seed values behind e4_summaries (engine.experiments.e4.seed_values)."""
    root = root or results_root()
    return _e4_seed_values(str(root), preset_name, task, difficulty, axis, metric, tables_state(root))


# ---------------------------------------------------------------- E1's manifest


@st.cache_data(max_entries=8, show_spinner=False)
def _e1_manifest(path: str, state: tuple) -> tuple[dict, str | None]:
    path = Path(path)
    try:
        return Store(path.parent).probe_manifest(path.stem), None
    except CorruptRun as e:
        return {}, f"{e}; rerun `loopscope ouro` to rewrite it."


def e1_manifest(slug: str) -> tuple[dict, str | None]:
    """`e1-<slug>.json` (model identity, n = 1 check, decoded top tokens), checked against its table."""
    path = results_root() / f"e1-{slug}.json"
    state = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in (path, path.with_suffix(".parquet")) if p.exists())
    return _e1_manifest(str(path), state)


def shown_token(text: str) -> str:
    """A decoded token as the E2 tables show theirs (bare: `0`, `even`), quoted only where blank space would hide it."""
    return text if text and text == text.strip() and text.isprintable() else repr(text)


def e1_top_tokens(manifest: dict, task: str) -> pd.DataFrame:
    """The head's most frequent token per mode and step, decoded (E1 tokens are the LM's, not engine.core.tasks')."""
    tops = manifest.get("tasks", {}).get(task, {}).get("top_tokens", {})
    table = pd.DataFrame(
        {mode: {int(n): shown_token(t.get("text", "")) for n, t in steps.items()} for mode, steps in tops.items()}
    )
    if table.empty:
        return table
    table = table.sort_index().T
    table.columns = [f"n={n}" for n in table.columns]
    return table.rename_axis("mode").reset_index()


# ---------------------------------------------------------------- runs


@st.cache_data(max_entries=4096, show_spinner=False)
def _run_record(root: str, key: str, state: tuple) -> tuple[dict | None, str | None]:
    """One run's row of the runs table, or why it cannot be listed; cached per run, so one changed run
    does not make every checkpoint be hashed again."""
    store = Store(Path(root))
    status = store.status(key)
    if status != "ok":
        return None, status
    try:
        m = store.manifest(key)
        cfg = m["config"]
        return {
            "run_key": key,
            "experiment": m.get("experiment", ""),
            "task": cfg["task"]["name"],
            "arch": "looped" if cfg["model"]["tied"] else "stacked",
            "trained boundary": cfg["model"]["boundary"],
            "T": cfg["model"]["trained_loops"],
            "seed": m["seed"],
            "steps": m.get("steps"),
            "final loss": loss_shown(m.get("final_loss"), m.get("loss_curve")),
            # a seed group trains as one batched model: its wall time once, on the group's first seed
            "group wall (s)": m.get("wall_time_s") if m["seed"] == min(m.get("group") or [m["seed"]]) else None,
            "weights": "kept" if weights_not_kept(m) is None else "not kept",
            "device": m.get("device", ""),
            "commit": str(m.get("git_commit", ""))[:10] + ("+dirty" if m.get("git_dirty") else ""),
            "created": m.get("created", ""),
        }, None
    except (KeyError, TypeError, AttributeError) as e:
        return None, f"run {key}: its manifest lacks {e} (written by an older version?)"


def run_stores(root: Path | None = None) -> dict[str, Path]:
    """{folder: store} of the runs the dashboard lists: the results folder's own (""), each study's own folder
    (OWN_FOLDER, e.g. "gpu") and the jobs' workbench (jobs.WORKBENCH) that hold runs; no other subfolder is read."""
    root = root or results_root()
    own = {study: root / folder for study, folder in OWN_FOLDER.items() if (root / folder / "runs").is_dir()}
    bench = {jobs.WORKBENCH: root / jobs.WORKBENCH} if (root / jobs.WORKBENCH / "runs").is_dir() else {}
    return {"": root, **own, **bench}


def run_id(folder: str, key: str) -> str:
    """A run's name across stores: its key in the results folder, `<study>/<key>` in a study's own folder (the GPU
    study reruns a CPU config, the bridge rung, under the same key)."""
    return f"{folder}/{key}" if folder else key


def store_tables(root: Path, own: bool = False) -> tuple:
    """(path, size, mtime) of the experiment tables (E1's aside) in one store's folder that the engine writes there:
    a study's own folder holds its study's, the results folder those of the studies without a folder of their own;
    `own`: every study's (the workbench, where jobs write each study's tables)."""
    if not root.is_dir():
        return ()
    found = []
    for p in sorted(root.glob("e*-*.parquet")):
        m = results.TABLE_NAME.match(p.name)
        if m is None or m.group(1) == "e1" or m.group(2) not in studies.STUDIES:
            continue
        if own or table_path(root, m.group(1), m.group(2)).parent == root:
            try:
                found.append((str(p), p.stat().st_size, p.stat().st_mtime_ns))
            except OSError:  # removed while listed
                continue
    return tuple(found)


@st.cache_data(max_entries=8, show_spinner=False)
def _key_studies(state: tuple) -> dict[str, str]:
    import pyarrow.parquet as pq

    found: dict[str, set[str]] = {}
    for path, *_ in state:
        study = results.TABLE_NAME.match(Path(path).name).group(2)
        try:
            keys = set(pq.read_table(path, columns=["run_key"]).column(0).to_pylist())
        except Exception:  # a damaged table: its page says so; its runs are shown without a study
            continue
        for key in keys:
            if isinstance(key, str) and results.RUN_KEY.fullmatch(key):
                found.setdefault(key, set()).add(study)
    return {key: ", ".join(sorted(names, key=studies.by_order().index)) for key, names in found.items()}


def key_studies(folder: str, root: Path) -> dict[str, str]:
    """run key -> the study (studies, comma-separated) whose tables in the store `root` hold its rows: how a run in a
    folder shared by several studies (the results folder: `cpu`, `cpu-1layer`, ...; the workbench) is known to be
    one study's. A run in no table there (trained but never tabled) is in none."""
    return _key_studies(store_tables(root, own=folder == jobs.WORKBENCH))


def runs() -> tuple[pd.DataFrame, list[str]]:
    """Every valid cached run of every store (run_stores), and a sentence for each run that could not be read.
    Columns: `study` (the study a run belongs to: its own folder's, else the study whose tables in its folder hold
    it, "" where none does), the manifest's fields, `folder` (its store: "" the results folder, a study's own folder,
    or jobs.WORKBENCH) and `run` (its run_id)."""
    tables, problems = [], []
    for folder, root in run_stores().items():
        state = files_state(root / "runs")  # one walk of the runs; its digest keys the table (one look-up a view)
        table, found = _runs(str(root), hashlib.sha256(repr(state).encode()).hexdigest())
        problems += found
        if not len(table):
            continue
        if folder in OWN_FOLDER:  # a study's own folder: its runs are that study's
            study = [folder] * len(table)
        else:
            by_key = key_studies(folder, root)
            study = [by_key.get(k, "") for k in table["run_key"]]
        tables.append(table.assign(study=study, folder=folder, run=[run_id(folder, k) for k in table["run_key"]]))
    if not tables:
        return pd.DataFrame(), problems
    table = pd.concat(tables, ignore_index=True)
    middle = [c for c in table.columns if c not in ("study", "folder", "run")]
    return table[["study", *middle, "folder", "run"]], problems


@st.cache_data(max_entries=4096, show_spinner=False)
def _refit_record(root: str, key: str, state: tuple) -> tuple[dict | None, str | None]:
    """One stored E3 refit's row of the refits table, or why it cannot be listed (as _run_record)."""
    store = Store(Path(root), folder="refits")
    status = store.status(key)
    if status != "ok":
        return None, status.replace("run ", "refit ", 1)
    try:
        m = store.manifest(key)
        refit = m.get("refit") or {}
        schedule = [s for s in refit.get("schedule") or [] if isinstance(s, int | float)]
        losses = m.get("final_loss") if isinstance(m.get("final_loss"), dict) else {}
        curves = m.get("loss_curve") if isinstance(m.get("loss_curve"), dict) else {}
        return {
            "refit_key": key,
            "run_key": str(m["run_key"]),
            "seed": m["seed"],
            "targets": ", ".join(map(str, refit.get("targets") or losses)),
            "refit steps": int(max(schedule)) if schedule else None,
            "final loss": "; ".join(f"{t} {loss_shown(v, curves.get(t))}" for t, v in losses.items()) or MISSING,
            "weights": "kept" if weights_not_kept(m) is None else "not kept",
            "device": m.get("device", ""),
            "commit": str(m.get("git_commit", ""))[:10] + ("+dirty" if m.get("git_dirty") else ""),
            "created": m.get("created", ""),
        }, None
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        return None, f"refit {key}: its manifest lacks {e} (written by an older version?)"


def refits() -> tuple[pd.DataFrame, list[str]]:
    """Every stored E3 refit (<store>/refits/) of every store, with what it refits: `study` and `run` (the run id of
    the run it refits, with its task, arch, trained boundary and seed where that run is listed), its targets, refit
    steps, final loss per target and provenance; and a sentence for each refit that could not be read."""
    listed, _ = runs()
    by_run = listed.set_index("run") if len(listed) else pd.DataFrame()
    records, problems = [], []
    for folder, root in run_stores().items():
        for key in Store(root, folder="refits").run_keys():
            record, problem = _refit_record(str(root), key, files_state(root / "refits" / key))
            problems += [problem] if problem else []
            if record is None:
                continue
            run = run_id(folder, record["run_key"]) if results.RUN_KEY.fullmatch(record["run_key"]) else ""
            source = by_run.loc[run] if run and run in by_run.index else None
            facts = {c: source[c] if source is not None else "" for c in ("study", "task", "arch", "trained boundary")}
            if source is None and folder in OWN_FOLDER:
                facts["study"] = folder
            records.append({"study": facts.pop("study"), "refit_key": key, "refits run": run or "—", **facts,
                            **{k: v for k, v in record.items() if k not in ("refit_key", "run_key")}})  # fmt: skip
    table = pd.DataFrame(records)
    order = ["study", "task", "trained boundary", "seed"]
    return (table.sort_values(order, ignore_index=True) if len(table) else table), problems


MISSING = "—"  # a value a manifest does not give (never "None" or "nan" on a page)


def loss_shown(loss, curve) -> str:
    """A final training loss for a reader (charts.loss_text: "0 exactly" for a 0 that the run's loss curve reaches,
    where fp32 rounds every answer's probability to 1); MISSING where there is none, where it is not finite, or where a
    0 stands without a curve that ends near it (no loss was measured: a placeholder, not a result)."""
    try:
        value = float(loss)
    except (TypeError, ValueError):
        return MISSING
    if not math.isfinite(value):
        return MISSING
    if value == 0:
        last = curve[-1] if isinstance(curve, list) and curve else None
        if not (isinstance(last, int | float) and not isinstance(last, bool) and abs(last) < 1e-3):
            return MISSING
    return charts.loss_text(value)


@st.cache_data(max_entries=8, show_spinner=False)
def _runs(root: str, state: str) -> tuple[pd.DataFrame, list[str]]:
    root = Path(root)
    records, problems = [], []
    for key in Store(root).run_keys():
        record, problem = _run_record(str(root), key, files_state(root / "runs" / key))
        records += [record] if record else []
        problems += [problem] if problem else []
    table = pd.DataFrame(records)
    order = ["experiment", "task", "arch", "trained boundary", "seed"]
    return (table.sort_values(order, ignore_index=True) if len(table) else table), problems


@st.cache_data(max_entries=32, show_spinner=False)
def _run_detail(root: str, key: str, state: tuple) -> tuple[dict, pd.DataFrame | None, str | None]:
    store = Store(Path(root))
    try:
        return store.manifest(key), store.load_rows(key), None
    except CorruptRun as e:
        return {}, None, str(e)
    except Exception as e:
        return {}, None, f"run {key}: its rows could not be read ({type(e).__name__})"


def run_detail(run: str) -> tuple[dict, pd.DataFrame | None, str | None]:
    """One run's manifest and its evaluation rows (checksums verified), or a sentence saying why not; run: its
    run_id (a run key, or `<study>/<key>` for a run in a study's own folder)."""
    folder, _, key = run.rpartition("/")
    root = run_stores().get(folder, results_root())
    return _run_detail(str(root), key, files_state(root / "runs" / key))


GPU_FACTS = {"name": "GPU", "capability": "compute capability", "memory_gib": "memory (GiB)", "driver": "driver",
             "cuda": "CUDA", "cudnn": "cuDNN", "torch": "torch"}  # fmt: skip


def gpu_facts(manifest: dict) -> list[tuple[str, str]]:
    """A GPU run's provenance as (what, value): the manifest's `gpu` (engine.core.store.gpu_info), its dtype policy
    and peak memory; [] for a run without them (a CPU run)."""
    gpu = manifest.get("gpu") if isinstance(manifest.get("gpu"), dict) else {}
    facts = [(label, str(gpu[k])) for k, label in GPU_FACTS.items() if gpu.get(k) not in (None, "")]
    for key, label in (("dtype_policy", "dtype policy"), ("peak_memory_gib", "peak memory (GiB)"),
                       ("estimated_memory_gib", "estimated memory (GiB)")):  # fmt: skip
        if manifest.get(key) not in (None, ""):
            facts.append((label, str(manifest[key])))
    return facts


def loss_curve(manifest: dict) -> pd.DataFrame:
    """The manifest's subsampled loss curve (every max(1, steps // 100)-th step) against the step."""
    curve = manifest.get("loss_curve") or []
    stride = max(1, int(manifest.get("steps") or len(curve)) // 100)
    return pd.DataFrame({"step": [1 + i * stride for i in range(len(curve))], "loss": curve})


def probe_losses(study: str, root: Path | None = None) -> pd.DataFrame:
    """The training loss of every seed of a study's recipe probe (the runs its record names, read from the study's
    store): candidate, seed, run_key, step, loss; no rows where it has none."""
    root = Path(root) if root is not None else results_root()
    probe = results.probe_record(study, root) or {}
    keys = [(name, seed, key) for name, c in probe.get("candidates", {}).items() if isinstance(c, dict)
            for seed, key in enumerate(c.get("runs", []))]  # fmt: skip
    return _probe_losses(str(results.study_root(root, study)), tuple(keys))


@st.cache_data(max_entries=16, show_spinner=False)
def _probe_losses(folder: str, keys: tuple) -> pd.DataFrame:
    store, out = Store(Path(folder)), []
    for name, seed, key in keys:
        try:
            if store.status(key) != "ok":  # not shipped here (or damaged): that seed is left out
                continue
            curve = loss_curve(store.manifest(key))
        except (OSError, ValueError, KeyError, TypeError):  # a damaged manifest: left out too, never a crash
            continue
        out.append(curve.assign(candidate=name, seed=seed, run_key=key))
    cols = ["candidate", "seed", "run_key", "step", "loss"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


# ---------------------------------------------------------------- jobs: from a job to its results

# the pages that overlay another folder's table beside the study's (views.comparison): a workbench table opens there
BESIDE_PAGES = {"e2": "accuracy.py", "e4": "stacked.py"}


def duration(seconds: float) -> str:
    """Seconds for a reader: "45 s", "12 min", "3 h 5 min" (rounded up)."""
    whole = math.ceil(seconds)
    if whole < 120:
        return f"{whole} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


def workbench_root() -> Path:
    """The folder every job writes into (engine.runtime.jobs.workbench), beside the published results."""
    return results_root() / jobs.WORKBENCH


def job_results(spec: dict | None) -> dict:
    """Where a finished job's results are: {"runs": their run ids in the workbench (the spec's own seeds, not its
    group's), "experiment": an experiment job's experiment (else None), "tables": (experiment, preset) of the
    workbench tables it wrote or added to}."""
    found = {"runs": [], "experiment": None, "tables": []}
    try:
        parsed = jobs.spec_from_dict(spec or {})
    except Exception:  # an older or damaged spec: no links, never a crash
        return found
    tables = workbench_tables()
    if isinstance(parsed, jobs.TrainSpec):
        found["runs"] = [run_id(jobs.WORKBENCH, parsed.config.run_key(s)) for s in parsed.seeds]
    elif isinstance(parsed, jobs.ExperimentSpec):
        mine = (tables["experiment"] == parsed.experiment) & (tables["preset"] == parsed.preset)
        found["experiment"] = parsed.experiment
        found["tables"] = [(parsed.experiment, parsed.preset)] if mine.any() else []
    else:
        found["runs"] = [run_id(jobs.WORKBENCH, parsed.run_key)]
        held = tables[[parsed.run_key in keys.split() for keys in tables["run_keys"]]]
        found["tables"] = list(zip(held["experiment"], held["preset"], strict=True))
    return found


def workbench_tables() -> pd.DataFrame:
    """The workbench's experiment tables (what jobs wrote, beside the published ones): experiment, preset, the
    seeds they hold (text), their largest n, and their run keys (space-separated); cached on the files' state."""
    folder = workbench_root()
    paths = sorted(folder.glob("e*-*.parquet")) if folder.is_dir() else []
    return _workbench_tables(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths))


@st.cache_data(max_entries=8, show_spinner=False)
def _workbench_tables(state: tuple) -> pd.DataFrame:
    import pyarrow.parquet as pq

    out = []
    for path, *_ in state:
        m = results.TABLE_NAME.match(Path(path).name)
        if m is None:  # another file that the glob matched
            continue
        try:
            t = pq.read_table(path, columns=["run_key", "seed", "eval_loops"]).to_pandas()
        except Exception:  # damaged: a rerun of the job rewrites it
            continue
        seeds = sorted(int(s) for s in t["seed"].unique())
        out.append({"experiment": m.group(1), "preset": m.group(2), "table": Path(path).name,
                    "seeds": ", ".join(map(str, seeds)), "largest n": int(t["eval_loops"].max()),
                    "run_keys": " ".join(sorted(t["run_key"].unique()))})  # fmt: skip
    return pd.DataFrame(out, columns=["experiment", "preset", "table", "seeds", "largest n", "run_keys"])


def log_tail(root: Path, jid: str, lines: int = 20) -> str:
    """The last lines of <root>/jobs/<jid>.log (the worker's output), or '' where there is none."""
    try:
        path = jobs.job_file(root, jid, ".log")
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 64_000))  # a long training log: read only its end
            text = f.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ---------------------------------------------------------------- E5: the engine's summary


@st.cache_data(max_entries=8, show_spinner=False)
def _e5_summary(preset_name: str, state: tuple) -> tuple[pd.DataFrame | None, str | None]:
    from engine.experiments import e5

    try:
        return e5.summarize(_engine_rows("e5", preset_name), preset_name), None
    except Exception as e:  # a table too small or too odd to summarise is a message, not a crash
        return None, f"`e5-{preset_name}.parquet` could not be summarised ({type(e).__name__}: {e})."


def e5_summary(preset_name: str) -> tuple[pd.DataFrame | None, str | None]:
    """engine.experiments.e5.summarize of the table: every estimate of the four parts, the table the claims read."""
    return _e5_summary(preset_name, tables_state(results_root()))


@st.cache_data(max_entries=8, show_spinner=False)
def _ladder_rules(preset_name: str, partner: str | None, state: tuple) -> pd.DataFrame:
    from engine.experiments import ladder

    tables = results.by_device({p: _engine_rows("e5", p) for p in (preset_name, partner) if p})
    return pd.DataFrame(ladder.rules(tables.get("cpu"), tables.get("gpu"), ladder.every_rung(preset_name)))


def ladder_rules(preset_name: str) -> pd.DataFrame:
    """engine.experiments.ladder.rules over this study's E5 ladder and its partner's on the other device: the GPU
    study's trend, collapse per rung and the bridge (claims' columns), cached on the tables' state."""
    return _ladder_rules(preset_name, results.ladder_partner(preset_name), tables_state(results_root()))


def ladder_reading(preset_name: str) -> str:
    """engine.experiments.ladder.reading: ladder_rules' outcomes and the study's rescale verdicts per rung (held-out
    mean) read against docs/gpu-study.md's two predictions, and what that says about the paper's collapse."""
    from engine.experiments import ladder

    return ladder.reading(ladder_rules(preset_name).to_dict("records"), results.claims("e5", preset_name)["claims"])


def rungs(preset_name: str, task: str, level: str, part: str = "ladder") -> pd.DataFrame:
    """charts.rung_points of this study's E5 summary and its partner's on the other device (the first of
    dashboard.results.ladder_partners whose e5 table exists): per rung at n = T and 3T, with its device."""
    partner = results.ladder_partner(preset_name)
    summaries = {study: e5_summary(study)[0] for study in (preset_name, partner) if study in presets("e5")}
    return charts.rung_points(summaries, task, level, part)


# ---------------------------------------------------------------- a verdict, opened: the values its rule read

DRILL_EXPERIMENTS = DRILL  # tables of runs by seed and n (dashboard.matrix: the cells that open them)
DRILL_BY = ["arch", "trained_loops", "boundary"]  # one row per model and run mode, per seed


def verdict_values(experiment: str, study: str, task: str, level: str, metric: str = "accuracy",
                   root: Path | None = None) -> tuple[pd.DataFrame, str | None]:  # fmt: skip
    """The per-seed, per-n values of a study's table at a verdict's task and level: one row per (arch, trained
    loops, run mode, seed), one column per n, each cell the metric averaged over the level's difficulties (the
    held-out levels as engine.experiments.verdicts.levels defines them; in a study without held-out items, the
    in-range stand-in its rules read, equivalent_level), and the level read; (empty, None) where the table lacks it."""
    found = table(experiment, study, root)
    if found.rows is None or experiment not in DRILL_EXPERIMENTS:
        return pd.DataFrame(), None
    rows = found.rows[found.rows["task"] == task]
    read = equivalent_level(rows, level) if len(rows) else None
    if read is None:
        return pd.DataFrame(), None
    per_seed = seed_values(rows, metric, read, [*DRILL_BY, "eval_loops"])
    if per_seed.empty:
        return pd.DataFrame(), None
    wide = per_seed.pivot_table(index=[*DRILL_BY, "seed"], columns="eval_loops", values="value", aggfunc="first")
    wide.columns = [f"n={int(n)}" for n in wide.columns]
    return wide.reset_index().rename(columns={"trained_loops": "T", "boundary": "run mode"}), read


# ---------------------------------------------------------------- runs side by side (the Runs page)


def _flat(value, prefix: str = "") -> dict:
    """A manifest's config as {dotted.key: value}."""
    if not isinstance(value, dict):
        return {prefix: value}
    out = {}
    for k, v in value.items():
        out |= _flat(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def compare_runs(runs: dict[str, str], metric: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Runs side by side ({run id: label}): their metric per n at the held-out mean (every difficulty where a run
    has no held-out items), one curve per run and run mode (`boundary`; `mode`: as trained, or another); their
    training losses; and the config fields in which they differ (one column per run, the seed included). Runs that
    cannot be read are left out."""
    curves, losses, configs = [], [], {}
    for run, label in runs.items():
        manifest, rows, problem = run_detail(run)
        if problem or rows is None:
            continue
        mine = rows[rows["metric"] == metric]
        held = mine["split"] == "heldout" if "split" in mine else pd.Series(False, index=mine.index)
        mine = mine[held] if held.any() else mine  # the held-out mean, else every difficulty
        per_n = mine.groupby(["boundary", "eval_loops"], as_index=False)["value"].mean()
        trained = ((manifest.get("config") or {}).get("model") or {}).get("boundary")
        mode = np.where(per_n["boundary"] == trained, "as trained", "surgery")
        curves.append(per_n.assign(run=label, mode=mode, curve=label + " · " + per_n["boundary"]))
        losses.append(loss_curve(manifest).assign(run=label))
        configs[label] = _flat(manifest.get("config", {})) | {"seed": manifest.get("seed")}
    keys = sorted({k for c in configs.values() for k in c})
    differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs.values()}) > 1]
    diff = pd.DataFrame([{"field": k, **{run: str(c.get(k, "—")) for run, c in configs.items()}} for k in differ])
    empty = pd.DataFrame(columns=["run", "boundary", "mode", "eval_loops", "value", "curve"])
    return (pd.concat(curves, ignore_index=True) if curves else empty,
            pd.concat(losses, ignore_index=True) if losses else pd.DataFrame(columns=["run", "step", "loss"]),
            diff)  # fmt: skip
