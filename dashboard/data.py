"""Reading the results store for the dashboard: cached, keyed on the files' state, never raising.

The cached functions take the files' (size, mtime) as an argument named `state`: it is only the cache key,
so a rewritten file is read again (st.cache_data skips arguments whose names start with an underscore,
so the key must not be called `_state`).

Every loader returns data together with a list of problems (sentences for the reader), so a
damaged or unreadable file becomes a message on the page, never a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import report
from dashboard.report import SCALE_ORDER, TABLE_NAME  # one definition, shared with the static report
from engine.core import stats
from engine.core.presets import train_ranges
from engine.core.store import RESULT_COLUMNS, CorruptRun, Store
from engine.experiments import REGISTRY, e2, e3, e4
from engine.runtime import jobs

SUMMARY_LEVELS = ("in-range mean", "beyond-range mean", "all difficulties mean")
ENGINE_LEVELS = dict(zip(SUMMARY_LEVELS, e3.LEVELS, strict=True))  # the page's choice -> the engine's level


@st.cache_data(max_entries=4, show_spinner=False)
def _report_html(root: str, preset_name: str | None, state: tuple) -> bytes:
    return report.html(Path(root), preset_name).encode()


def report_html(preset_name: str | None = None) -> bytes:
    """The static report (dashboard.report) of the results folder, as `loopscope report` writes it; rebuilt
    when a table changes."""
    root = results_root()
    return _report_html(str(root), preset_name, _tables_state(root))


def results_root() -> Path:
    return Path(os.environ.get("LOOPSCOPE_RESULTS", "cached_results"))


def files_state(root: Path) -> tuple:
    """(path, size, mtime) of every file under root: the cache key that changes when results do."""
    if not root.is_dir():
        return ()
    return tuple(sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()))


def _tables_state(root: Path) -> tuple:
    if not root.is_dir():
        return ()
    return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in root.glob("e*-*.parquet")))


# ---------------------------------------------------------------- experiment tables


@dataclass
class Table:
    """One experiment table at one preset; rows is None when the table is missing or unreadable."""

    experiment: str
    preset: str
    rows: pd.DataFrame | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted(int(s) for s in self.rows["seed"].unique()) if self.rows is not None else []


def catalog() -> dict[str, list[str]]:
    """{experiment: the presets (scales) at which its table exists, largest first}."""
    found: dict[str, list[str]] = {}
    for name, *_ in _tables_state(results_root()):
        if m := TABLE_NAME.match(name):
            found.setdefault(m.group(1), []).append(m.group(2))
    order = {n: i for i, n in enumerate(SCALE_ORDER)}
    return {e: sorted(p, key=lambda n: (order.get(n, len(order)), n)) for e, p in found.items()}


def presets(experiment: str) -> list[str]:
    return catalog().get(experiment, [])


@st.cache_data(max_entries=16, show_spinner=False)
def _read_table(path: str, experiment: str, preset_name: str, state: tuple) -> Table:
    table = Table(experiment, preset_name)
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
    ranges = train_ranges(preset_name, rows["task"].unique())
    inside = [d in ranges.get(t, ()) for t, d in zip(rows["task"], rows["difficulty"], strict=True)]
    rows["range"] = np.where(rows["task"].isin(list(ranges)), np.where(inside, "in-range", "beyond"), "n/a")
    table.rows = rows
    return table


def table(experiment: str, preset_name: str) -> Table:
    """The table `<root>/<experiment>-<preset>.parquet`, read once per change of the file."""
    path = results_root() / f"{experiment}-{preset_name}.parquet"
    if not path.is_file():
        return Table(experiment, preset_name)
    stat = path.stat()
    return _read_table(str(path), experiment, preset_name, (stat.st_size, stat.st_mtime_ns))


def difficulty_options(rows: pd.DataFrame) -> list[str]:
    """The summary levels present, then every difficulty (as text: the value is also its URL form)."""
    levels = [lvl for lvl in SUMMARY_LEVELS if level_mask(rows, lvl).any()]
    return levels + [str(d) for d in sorted(rows["difficulty"].unique())]


def level_mask(rows: pd.DataFrame, level: str) -> pd.Series:
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


def mode_comparison(per_seed: pd.DataFrame, by: tuple[str, ...]) -> pd.DataFrame:
    """Cliff's delta none vs norm per group."""
    return mode_comparison_by(per_seed, by, "boundary", "norm", "none")


@st.cache_data(max_entries=64, show_spinner=False)
def norm_growth(rows: pd.DataFrame, modes: tuple[str, ...]) -> pd.DataFrame:
    """Per mode, range and n: max/min of the state norm over steps 1..n, worst seed and difficulty, as
    engine.experiments.e2.surgery_summary defines it for the `norm->none` models (claim (d) reads it at
    n = T); the same function on each mode's rows, so every mode is measured alike."""
    frames = []
    for mode in modes:
        part = e2.surgery_summary(rows[rows["boundary"] == mode].assign(boundary="norm->none"))
        if "surgery_norm_ratio" in part:
            frames.append(part[["task", "range", "eval_loops", "surgery_norm_ratio"]].assign(mode=mode))
    columns = ["mode", "task", "range", "eval_loops", "norm_ratio"]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True).rename(columns={"surgery_norm_ratio": "norm_ratio"})[columns]


# ---------------------------------------------------------------- E3 and E4: the engine's own summaries


def _engine_rows(experiment: str, preset_name: str) -> pd.DataFrame | None:
    """The table's rows as the engine wrote them (without the dashboard's `range` column)."""
    rows = table(experiment, preset_name).rows
    return None if rows is None else rows.drop(columns="range")


def engine_level(choice: str):
    """A difficulty choice of the page ('in-range mean', ..., or a difficulty) as the engine names it."""
    return ENGINE_LEVELS.get(choice) or int(choice)


def e3_levels(rows: pd.DataFrame, metric: str) -> list[str]:
    """The difficulty choices of an E3 metric: recovery is stored for the in-range mean (at difficulty
    e3.IN_RANGE) and per difficulty; accuracy has every level and difficulty."""
    picked = rows[(rows["metric"] == metric) & (rows["difficulty"] != e3.IN_RANGE)]
    if metric == "recovery":
        return [SUMMARY_LEVELS[0]] + [str(d) for d in sorted(picked["difficulty"].unique())]
    return difficulty_options(picked)


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
    return _e3_curves(preset_name, metric, difficulty, _tables_state(results_root()))


@st.cache_data(max_entries=32, show_spinner=False)
def _e3_seed_values(preset_name: str, metric: str, difficulty: str, state: tuple) -> pd.DataFrame:
    return e3.seed_values(_engine_rows("e3", preset_name), preset_name, metric, engine_level(difficulty))


def e3_seed_values(preset_name: str, metric: str, difficulty: str) -> pd.DataFrame:
    """The per-seed values behind e3_curves (engine.experiments.e3.seed_values)."""
    return _e3_seed_values(preset_name, metric, difficulty, _tables_state(results_root()))


def _e4_rows(preset_name: str, task: str, difficulty: str) -> pd.DataFrame:
    rows = table("e4", preset_name).rows
    rows = rows[(rows["task"] == task) & level_mask(rows, difficulty)]
    return rows.drop(columns="range")


@st.cache_data(max_entries=64, show_spinner=False)
def _e4_summaries(preset_name: str, task: str, difficulty: str, axis: str, metric: str, state: tuple):
    rows = _e4_rows(preset_name, task, difficulty)
    try:
        return e4.curves(rows, axis, metric), e4.compare(rows, axis, metric), None
    except Exception as e:
        return None, None, f"`e4-{preset_name}.parquet` could not be summarised ({type(e).__name__}: {e})."


def e4_summaries(preset_name: str, task: str, difficulty: str, axis: str, metric: str):
    """E4 on the task's rows at the chosen difficulties, on one axis (n, ratio n/T, difference n - T):
    each architecture's curve per mode (engine.experiments.e4.curves) and looped vs stacked where both
    exist (e4.compare: the gap, Cliff's delta with its CI, p); with E4's modes, where the stacked model
    run as `norm->none` stands for `none`. All difficulties pooled, this is e4.summarize's table."""
    return _e4_summaries(preset_name, task, difficulty, axis, metric, _tables_state(results_root()))


@st.cache_data(max_entries=32, show_spinner=False)
def _e4_seed_values(preset_name: str, task: str, difficulty: str, axis: str, metric: str, state: tuple):
    return e4.seed_values(_e4_rows(preset_name, task, difficulty), axis, metric)


def e4_seed_values(preset_name: str, task: str, difficulty: str, axis: str, metric: str) -> pd.DataFrame:
    """The per-seed values behind e4_summaries (engine.experiments.e4.seed_values)."""
    return _e4_seed_values(preset_name, task, difficulty, axis, metric, _tables_state(results_root()))


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


def e1_top_tokens(manifest: dict, task: str) -> pd.DataFrame:
    """The head's most frequent token per mode and step, decoded (E1 tokens are the LM's, not engine.core.tasks')."""
    tops = manifest.get("tasks", {}).get(task, {}).get("top_tokens", {})
    table = pd.DataFrame(
        {mode: {int(n): repr(t.get("text", "")) for n, t in steps.items()} for mode, steps in tops.items()}
    )
    if table.empty:
        return table
    table = table.sort_index().T
    table.columns = [f"n={n}" for n in table.columns]
    return table.rename_axis("mode").reset_index()


# ---------------------------------------------------------------- claims


@st.cache_data(max_entries=16, show_spinner=False)
def _claims(root: str, experiment: str, preset_name: str, state: tuple) -> tuple[list[dict] | None, list[str]]:
    """REGISTRY[experiment].claims(summarize(rows, preset), T per task); None where the engine has none."""
    t = table(experiment, preset_name)
    if t.rows is None:
        return [], t.problems
    module = REGISTRY.get(experiment)
    if module is None:
        return None, []
    rows = t.rows.drop(columns="range")
    try:
        summary = module.summarize(rows, preset_name)
        trained = rows[rows["arch"] == "looped"].groupby("task")["trained_loops"].max().to_dict()
        return module.claims(summary, trained), []
    except Exception as e:  # a table too small or too odd to summarise is a message, not a crash
        return [], [f"`{experiment}-{preset_name}.parquet` could not be summarised ({type(e).__name__}: {e})."]


def claims(experiment: str, preset_name: str) -> tuple[list[dict] | None, list[str]]:
    """The paper's claims with measured figures and verdicts (None: the engine gives no verdicts yet)."""
    root = results_root()
    return _claims(str(root), experiment, preset_name, _tables_state(root))


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
            "final loss": m.get("final_loss"),
            "wall (s)": m.get("wall_time_s"),
            "device": m.get("device", ""),
            "commit": str(m.get("git_commit", ""))[:10] + ("+dirty" if m.get("git_dirty") else ""),
            "created": m.get("created", ""),
        }, None
    except (KeyError, TypeError, AttributeError) as e:
        return None, f"run {key}: its manifest lacks {e} (written by an older version?)"


def runs() -> tuple[pd.DataFrame, list[str]]:
    """Every valid cached run, and a sentence for each run that could not be read."""
    root = results_root()
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


def run_detail(key: str) -> tuple[dict, pd.DataFrame | None, str | None]:
    """One run's manifest and its evaluation rows (checksums verified), or a sentence saying why not."""
    root = results_root()
    return _run_detail(str(root), key, files_state(root / "runs" / key))


def loss_curve(manifest: dict) -> pd.DataFrame:
    """The manifest's subsampled loss curve (every max(1, steps // 100)-th step) against the step."""
    curve = manifest.get("loss_curve") or []
    stride = max(1, int(manifest.get("steps") or len(curve)) // 100)
    return pd.DataFrame({"step": [1 + i * stride for i in range(len(curve))], "loss": curve})


# ---------------------------------------------------------------- jobs: from a job to its results

EXPERIMENT_PAGES = {"e2": "accuracy.py", "e3": "refit.py", "e4": "stacked.py", "e1": "ouro.py"}


def job_results(spec: dict | None) -> dict:
    """Where a finished job's results are shown: {"runs": run keys, "experiment": e2/e3/e4 or None,
    "preset": its preset or None}. The run keys are the spec's own (RunConfig.run_key per seed), not its group's."""
    found = {"runs": [], "experiment": None, "preset": None}
    try:
        parsed = jobs.spec_from_dict(spec or {})
    except Exception:  # an older or damaged spec: no links, never a crash
        return found
    if isinstance(parsed, jobs.TrainSpec):
        found["runs"] = [parsed.config.run_key(s) for s in parsed.seeds]
    elif isinstance(parsed, jobs.ExperimentSpec):
        found["experiment"], found["preset"] = parsed.experiment, parsed.preset
    else:
        found["runs"] = [parsed.run_key]
        try:
            experiment = Store(results_root()).manifest(parsed.run_key).get("experiment")
        except CorruptRun:
            experiment = None
        if experiment in EXPERIMENT_PAGES:
            found["experiment"] = experiment
            tables = presets(experiment)
            found["preset"] = tables[0] if tables else None
    return found


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
