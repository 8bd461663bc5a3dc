"""The static report: one self-contained HTML page (claim cards, every figure as inline SVG, provenance, commands).

No Streamlit in here (`loopscope report` in engine/cli.py and the overview's download both call it): the tables
are read from the results folder, summarised by the engine (REGISTRY[e].summarize / claims, engine.core.stats) and
drawn by dashboard.charts, converted to SVG offline (vl_convert). The page loads nothing from the network.
"""

from __future__ import annotations

import functools
import hashlib
import html as htmllib
import json
import re
import time
from pathlib import Path

import pandas as pd

from dashboard import charts, matrix, results
from dashboard.results import catalog  # noqa: F401  (one definition, shared with the dashboard)
from engine import paper, studies
from engine.core import stats
from engine.core.presets import train_ranges
from engine.experiments import REGISTRY, e3, e4, verdicts
from engine.runtime.settings import shown_path  # a read-only copy names no server folder

TITLES = {"e1": "E1 · released Ouro weights", "e2": "E2 · norm vs none, from scratch",
          "e3": "E3 · readout refit", "e4": "E4 · looped vs stacked",
          "e5": "E5 · agreement tested directly (beyond the paper)"}  # fmt: skip
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1320px;margin:2em auto;padding:0 1em;
color:#1a1a1a;line-height:1.45}
h1{font-size:1.7em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
.cards{display:grid;grid-template-columns:1fr 1fr;gap:12px}.figures{display:grid;grid-template-columns:1fr 1fr;gap:18px}
.card{border:1px solid #ccc;border-radius:8px;padding:10px 14px}
.badge{display:inline-block;border-radius:10px;padding:1px 9px;font-size:.85em;font-weight:600;margin-left:.4em}
.yes{background:#d8f0dc;color:#145a23}.no{background:#f8d7d5;color:#7c1d16}.none{background:#e6e6e6;color:#333}
figure{margin:.6em 0}figure svg{width:100%;height:auto}figcaption{font-size:.9em;color:#444}
table{border-collapse:collapse;font-size:.88em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
pre{background:#f5f5f5;padding:10px;overflow-x:auto}
h3.task{margin:1.2em 0 .3em}figure h3{margin:.2em 0}
"""


def chosen_tables(root: Path, preset_name: str | None = None) -> dict[str, str]:
    """{experiment: preset}: the tables of one study (report_study: the given preset, else the default study), and
    E1's first table (named by the model it probes, not by a study: its section says so). A study's report never
    borrows another study's table for an experiment it did not run (issue 60, item 5)."""
    study = report_study(root, preset_name)
    chosen = {}
    for e, p in catalog(root).items():
        if e == "e1":
            chosen[e] = p[0]
        elif study in p:
            chosen[e] = study
    return chosen


def report_study(root: Path, preset_name: str | None = None) -> str | None:
    """The study a report is of: the preset given, else the default study outside the studies with a folder of
    their own (results.OWN_FOLDER: those get a section of their own, own_studies), else the first present."""
    if preset_name:
        return preset_name
    found = results.studies(root)
    with_e2 = results.presets("e2", root)
    shared = [s for s in found if s not in results.OWN_FOLDER]
    return next((s for s in shared if s in with_e2), (shared or found or [None])[0])


def own_studies(root: Path, preset_name: str | None = None) -> list[str]:
    """The studies with a folder of their own (the GPU study, the ladder on the CPU, ...) that get a section of
    their own after the main study's: every one present but the main study, and none where a preset was asked for
    (`--preset` reports that one study only)."""
    if preset_name:
        return []
    main = report_study(root)
    return [s for s in results.studies(root) if s in results.OWN_FOLDER and s != main]


LEGEND = (
    "At the held-out mean, by the rules written before each study ran (docs/design.md). One badge where the "
    "paper's unpaired analysis and the paired one agree, one each where they differ; (hardest: ...) where the "
    "hardest held-out difficulty reads otherwise. Every card follows."
)  # the overview's, in the same words


def say(text: str) -> None:
    """Progress of a long build (`loopscope report` prints it; the overview's download does not)."""


def _esc(text) -> str:
    return htmllib.escape(str(text))


ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")  # CommonMark's backslash escapes (dashboard.results.as_text writes them)


def _md(text) -> str:
    """The Markdown of the engine's claim texts and the dashboard's sentences as HTML: `code` and **bold** kept, a
    backslash-escaped mark shown as the mark (as text, like the rest: a value from a file never becomes markup)."""
    marks: list[str] = []
    text = ESCAPED.sub(lambda m: marks.append(m.group(1)) or f"\ue000{len(marks) - 1}\ue001", str(text))
    text = _esc(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub("\ue000(\\d+)\ue001", lambda m: _esc(marks[int(m.group(1))]), text)


def _svg(chart) -> str:
    svg = charts.to_svg(chart).decode()
    return svg[svg.index("<svg") :]  # no XML prolog inside HTML


# ---------------------------------------------------------------- claims


def claims(
    experiment: str, rows: pd.DataFrame, preset_name: str, root: Path | None = None
) -> tuple[list[dict] | None, str | None, str | None]:
    """(claims, rules, problem): dashboard.results.claims_of (REGISTRY[e].claims), the same verdicts as the
    overview's cards (with root: the overview's own, shipped or cached on disk); claims None where the engine has
    none."""
    if root is not None and results.table_path(root, experiment, preset_name).is_file():
        found = results.claims(experiment, preset_name, root)
        if not found["problems"]:
            return (found["claims"] if found["rules"] else None), found["rules"], None
    try:
        rules, found = results.claims_of(experiment, rows, preset_name)
        return (found if rules else None), rules, None
    except Exception as e:  # too small or too odd a table: a sentence in the report
        return [], None, f"{experiment}-{preset_name}.parquet could not be summarised ({type(e).__name__}: {e})"


def paired_cells(drawn: dict[tuple[str, str], str]) -> list[str]:
    """Cards {(claim, task): html} in a two-column grid: one row per claim, parity then chain (matrix.TASKS), an
    empty cell where a claim lacks a task, so a row never pairs two claims."""
    claims = list(dict.fromkeys(claim for claim, _ in drawn))
    others = sorted({t for _, t in drawn} - set(matrix.TASKS))
    cells = []
    for claim in claims:
        mine = [drawn.get((claim, t), "") for t in matrix.TASKS] + [drawn[(claim, t)] for t in others
                                                                     if (claim, t) in drawn]  # fmt: skip
        cells += [m or "<div></div>" for m in mine] + ["<div></div>"] * (len(mine) % 2)
    return cells


def card_html(title: str, levels: list[dict], scale: str) -> str:
    """E5's claim of one task: the outcome its rules name (agreement, normalisation, mixed, ...) at each level, the
    held-out mean first, in one card (as the overview's beyond_card)."""
    order = {lvl: i for i, lvl in enumerate(results.LEVELS)}
    levels = sorted(levels, key=lambda c: order.get(c["level"], len(order)))
    first = levels[0]
    said = "<br>".join(f"{_esc(c['level'])}: {_outcome_badge(c['outcome'])} {_md(c['measured'])}" for c in levels)
    return (
        f'<div class="card claim"><b>{_esc(title)}</b>{_outcome_badge(first["outcome"])}'
        f"<p>{_md(first['text'])}<br><b>Predicted:</b> {_md(first['criterion'])}</p><p>{said}</p>"
        f"<p><b>Scale:</b> {_esc(scale)}</p></div>"
    )


def _outcome_badge(outcome: str, prefix: str = "") -> str:
    kind = {"holds": "yes", "does NOT hold": "no", "agreement": "yes", "normalisation": "no"}.get(outcome, "none")
    return f'<span class="badge {kind}">{_esc(prefix + outcome)}</span>'


def rule_card_html(title: str, card: dict, scale: str, experiment: str) -> str:
    """A claim under docs/design.md's verdict rules (dashboard.results.rule_cards): each analysis at the held-out
    mean and the hardest held-out difficulty, as the overview shows it."""
    analyses = card["analyses"]
    if (experiment, card["claim"]) in results.SAME_RULE:
        analyses = {"both": analyses["paper"]}
    mean = results.LEVELS[0]
    head = "".join(_outcome_badge(a["levels"][mean][0], f"{name}: ") for name, a in analyses.items() if mean in
                   a["levels"])  # fmt: skip
    body = []
    for name, a in analyses.items():
        lines = [f"{_esc(lvl)}: {_outcome_badge(o)} {_md(m)}" for lvl, (o, m) in a["levels"].items()]
        lines += [f"holds at {_esc(a['difficulties'])} held-out difficulties"] if a["difficulties"] else []
        body.append(f"<p><b>{_esc(results.ANALYSES[name])}</b><br>{'<br>'.join(lines)}</p>")
    return (
        f'<div class="card claim rule"><b>{_esc(title)}</b>{head}<p>{_md(card["text"])}<br>'
        f"<b>Paper:</b> {_md(card['paper'])}<br><b>Rule:</b> {_md(card['criterion'])}</p>{''.join(body)}"
        f"<p><b>Scale:</b> {_esc(scale)}</p></div>"
    )


# ---------------------------------------------------------------- figures: (title, chart, caption)


def _in_range(rows: pd.DataFrame, preset_name: str) -> tuple[pd.DataFrame, str]:
    """The judged items and their name: the held-out in-range ones where the table has them (the verdict rules'
    level (i)), else the in-range difficulties (all rows where the preset's training range is unknown)."""
    if results.has_heldout(rows):
        held = rows[rows["split"] == "heldout"]
        return held, f"held-out items, difficulties {', '.join(map(str, sorted(held['difficulty'].unique())))}"
    ranges = train_ranges(preset_name, rows["task"].unique())
    inside = [d in ranges.get(t, ()) for t, d in zip(rows["task"], rows["difficulty"], strict=True)]
    if not any(inside):
        return rows, "all difficulties"
    note = "split not recorded (first design: in-range items mostly seen in training)" if "split" not in rows else ""
    return rows[inside], "in-range difficulties" + (f"; {note}" if note else "")


def _items(rows: pd.DataFrame) -> str:
    """The `split` of the rows, per split the difficulties: what an accuracy figure over them is measured on."""
    if "split" not in rows:
        return "split not recorded (first design: in-range items mostly seen in training)"
    by = rows.groupby("split")["difficulty"].unique()
    names = {"heldout": "held-out", "seen": "seen in training", "beyond": "beyond the training range"}
    return "; ".join(f"{names.get(k, k)} ({', '.join(map(str, sorted(v)))})" for k, v in by.items())


def _mode_curves(rows: pd.DataFrame, metric: str = "accuracy") -> tuple[pd.DataFrame, pd.DataFrame]:
    per_seed = stats.seed_means(rows, metric, ["arch", "boundary", "eval_loops"])
    curve = stats.mean_ci(per_seed, ["arch", "boundary", "eval_loops"])
    archs = sorted(rows["arch"].unique())

    def label(f: pd.DataFrame) -> pd.DataFrame:
        return f.assign(
            series=[charts.series_label(a, b, archs) for a, b in zip(f["arch"], f["boundary"], strict=True)]
        )

    return label(curve), label(per_seed)


def _tasks(found) -> list[str]:
    """The tasks in the pages' order: parity, then chain (matrix.TASKS), then any other."""
    found = list(found)
    return [t for t in matrix.TASKS if t in found] + sorted(t for t in found if t not in matrix.TASKS)


def e2_figures(rows: pd.DataFrame, preset_name: str) -> list[tuple[str, object, str]]:
    out = []
    for task in _tasks(rows["task"].unique()):
        part, items = _in_range(rows[(rows["task"] == task) & (rows["arch"] == "looped")], preset_name)
        curve, per_seed = _mode_curves(part)
        T = int(part["trained_loops"].max())
        chart = charts.curves(curve, "eval_loops", charts.N_TITLE, "accuracy (fraction correct)",
                              budgets=charts.budget_rules(T), chance=charts.CHANCE)  # fmt: skip
        n = int(per_seed.groupby("series")["seed"].nunique().min())
        out.append((f"E2 · {task}: accuracy per n ({items.split(';')[0]})", chart,
                    charts.caption(n, curve["ci_method"], charts.CHANCE) + f" Items: {items}."))  # fmt: skip
        pair = per_seed[per_seed["boundary"].isin(["norm", "none"])]
        if {"norm", "none"} <= set(pair["boundary"]):
            summary = stats.summarize_modes(pair, group_cols=("eval_loops",), mode_col="boundary", a="norm", b="none")
            chart = charts.delta_chart(summary, "eval_loops", charts.N_TITLE, charts.budget_rules(T))
            what = "Positive: `none` better. Cliff's δ over seeds with its 95% bootstrap CI (summarize_modes)."
            out.append((f"E2 · {task}: Cliff's δ per n, none vs norm", chart, f"{what} Items: {items}."))
            diffs = pair.pivot_table(index=["seed", "eval_loops"], columns="boundary", values="value")
            diffs = (diffs["none"] - diffs["norm"]).dropna().rename("diff").reset_index()
            paired = pd.DataFrame(
                [{"eval_loops": n, "n_pairs": len(d), **stats.paired_mean_ci(d["diff"].to_numpy())._asdict()}
                 for n, d in diffs.groupby("eval_loops")]
            ).rename(columns={"estimate": "mean_diff", "low": "ci_low", "high": "ci_high"})  # fmt: skip
            chart = charts.paired_chart(paired, diffs, "eval_loops", charts.N_TITLE, "none − norm, same seed",
                                        charts.budget_rules(T))  # fmt: skip
            what = ("Thin lines: each seed's none − norm; black: the mean with its 95% bootstrap CI over seeds "
                    "(stats.paired_mean_ci); the Wilcoxon tests are on the cards.")  # fmt: skip
            out.append((f"E2 · {task}: paired per seed, none − norm", chart, f"{what} Items: {items}."))
        out += claim_d_figures(part, task, T, items)
    return out


def claim_d_figures(part: pd.DataFrame, task: str, T: int, items: str) -> list[tuple[str, object, str]]:
    """Claim (d) is judged on the state norm and the top-token share as well as on accuracy: both per step and mode,
    as the Norm trajectories page draws them."""
    out = []
    for metric, y_title, chance in (("norm_post", "state norm ‖h_t‖ (L2, post-boundary)", None),
                                    ("top_token_share", "top-token share (fraction)", 0.5)):  # fmt: skip
        if not (part["metric"] == metric).any():
            continue
        curve, _ = _mode_curves(part, metric)
        chart = charts.curves(curve, "eval_loops", charts.N_TITLE, y_title, budgets=charts.budget_rules(T),
                              y_domain=None if chance is None else (0.0, 1.0), chance=chance,
                              chance_label="balanced answers 0.5")  # fmt: skip
        what = (
            "Mean state norm at the answer position; claim (d) reads its max/min over steps 1..T, worst seed. "
            if chance is None
            else "1.0: the head gives one token for every example (claim (d): one token). "
        )
        cap = charts.caption(int(curve["n"].min()), curve["ci_method"], None, what) + f" Items: {items}."
        out.append((f"E2 (d) · {task}: {'state norm' if chance is None else 'top-token share'} per step", chart, cap))
    return out


def e3_figures(rows: pd.DataFrame, preset_name: str, root: Path | None = None) -> list[tuple[str, object, str]]:
    own = root is not None and results.table_path(root, "e3", preset_name).is_file()
    summary, out = (summary_at(root, "e3", preset_name) if own else e3.summarize(rows, preset_name)), []
    references = pd.DataFrame(
        {
            "x": [None, None],
            "y": [paper.HEAD_LAST_REFIT_RECOVERY, paper.HEAD_REFIT_RECOVERY],
            "label": ["paper: head + last layer, full recovery", "paper: head alone ≈ 1/3"],
        }
    )
    for task in _tasks(summary["task"].unique()):
        T = int(rows.loc[(rows["task"] == task) & (rows["arch"] == "looped"), "trained_loops"].max())
        at_t = summary[
            (summary["task"] == task) & (summary["eval_loops"] == T) & (summary["refit_target"] != e3.ORIGINAL)
        ]
        if not at_t["mean"].notna().any():
            continue
        chart = charts.curves(at_t.rename(columns={"refit_target": "series"}), "refit_steps",
                              "readout refit steps (optimizer steps)", "recovery (fraction regained)",
                              references=references, y_domain=None, legend_title="refit target")  # fmt: skip
        n = int(at_t["n"].min())
        stored = rows.loc[rows["difficulty"] == e3.IN_RANGE, "split"] if "split" in rows else pd.Series(dtype=str)
        held = len(stored) > 0 and bool((stored == "heldout").all())
        level = "held-out mean, the level the verdicts read" if held else "in-range mean"
        what = f"{task}, n = T = {T}, {level} (e3.summarize). Black rules: the paper's levels. "
        out.append((f"E3 · {task}: recovery per refit step", chart, charts.caption(n, at_t["ci_method"], None, what)))
    return out


def e4_figures(rows: pd.DataFrame, preset_name: str) -> list[tuple[str, object, str]]:
    """Looped vs stacked at matched n / T, at the level the verdicts read: the held-out mean (each seed's accuracy
    averaged over the held-out in-range difficulties) where the table has held-out items, else all difficulties
    (the first study's e4.summarize)."""
    out = []
    x, x_title = charts.X_AXES["ratio"]
    held = results.has_heldout(rows)
    level = verdicts.MEAN if held else "all difficulties"
    for task in _tasks(rows["task"].unique()):
        task_rows = rows[(rows["task"] == task) & ((rows["split"] == "heldout") if held else True)]
        curve = e4.curves(task_rows, "ratio", "accuracy")
        for mode in ("norm", "none"):
            part = curve[curve["mode"] == mode]
            if part.empty:
                continue
            part = part.rename(columns={"x": x}).assign(series=[f"{a}, {mode}" for a in part["arch"]])
            part = part[part[x] <= part.loc[part["arch"] == "looped", x].max()]  # the stacked T = 1 runs to n/T = 12
            chart = charts.curves(part, x, x_title, "accuracy (fraction correct)", chance=charts.CHANCE,
                                  budgets=charts.budget_rules(1.0, "n = T"), legend_title="model, mode")  # fmt: skip
            what = f"{task}, {level}, mode {mode} (e4.curves). Items: {_items(task_rows)}. "
            cap = charts.caption(int(part["n"].min()), part["ci_method"], charts.CHANCE, what)
            out.append((f"E4 · {task}: looped vs stacked at matched n / T, mode {mode} ({level})", chart, cap))
    return out


def e1_figures(rows: pd.DataFrame, preset_name: str) -> list[tuple[str, object, str]]:
    out = []
    for task in _tasks(rows["task"].unique()):
        curve, _ = _mode_curves(rows[rows["task"] == task])
        T = int(rows["trained_loops"].max())
        mark = pd.DataFrame(
            {
                "x": [float(paper.TRAINED_LOOPS_OURO)],
                "y": [paper.SURGERY_ACCURACY_AT_T],
                "label": [f"paper: Ouro without the norm, {paper.SURGERY_ACCURACY_AT_T:.3f} at n = T"],
            }
        )
        chart = charts.curves(curve, "eval_loops", charts.N_TITLE, "accuracy (fraction correct)",
                              budgets=charts.budget_rules(T), chance=charts.CHANCE, references=mark)  # fmt: skip
        demo = "ouro" not in preset_name.lower()
        label = "Demonstration, not the released weights: a small Ouro-architecture model trained here. " * demo
        what = f"{label}E1 table `e1-{preset_name}`: {task}, all difficulties. Black diamond: the paper's figure. "
        cap = charts.caption(int(curve["n"].min()), curve["ci_method"], charts.CHANCE, what)
        out.append((f"E1 · {task}: accuracy per n" + " (demonstration, not the released weights)" * demo, chart, cap))
    return out


def _state(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return ()
    return (st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _summary_at(experiment: str, path: str, preset_name: str, state: tuple) -> pd.DataFrame:
    module = {"e3": e3, "e5": _e5()}[experiment]
    return module.summarize(pd.read_parquet(path), preset_name)


def summary_at(root: Path, experiment: str, preset_name: str) -> pd.DataFrame:
    """engine.experiments.<e3|e5>.summarize of a study's table, once per state of the file: the report reads E5's
    summary for its figures, its partner's ladder and the rules, and E3's for its figures and E5's E3 markers."""
    path = results.table_path(root, experiment, preset_name)
    return _summary_at(experiment, str(path), preset_name, _state(path))


def _e5():
    from engine.experiments import e5

    return e5


def e3_marks(root: Path | None, preset_name: str, task: str, T: int) -> pd.DataFrame | None:
    """E3's refits at n = T, the last refit step, at the held-out (in-range) mean, as labelled references: the
    diamonds the Agreement page draws on the rescale figure (charts.e3_references, read by both)."""
    if root is None or not results.table_path(root, "e3", preset_name).is_file():
        return None
    return charts.e3_references(summary_at(root, "e3", preset_name), task, T)


def e5_figures(rows: pd.DataFrame, preset_name: str, root: Path | None = None) -> list[tuple[str, object, str]]:
    """E5 at the held-out mean (the level its headline verdicts read), by the page's own builders (charts.e5_*), in
    the page's order: part 1's effects of fixed-T training, part 2's accuracy per training distribution run as
    trained, part 3's ladder, part 4's rescale recovery (with E3's refits at n = T as diamonds, as the page draws
    them) and per rung. The ladder (and the rescale recovery per rung) span this study and its partner
    (results.ladder_partners) where root holds the partner's e5 table: the caption names the partner's table."""
    e5 = _e5()
    own = root is not None and results.table_path(root, "e5", preset_name).is_file()
    summary, out = (summary_at(root, "e5", preset_name) if own else e5.summarize(rows, preset_name)), []
    probing = root is not None and results.probe_open(preset_name, root) is not None
    summaries = {} if probing else {preset_name: summary}  # while probing, its own rung is a rejected candidate's
    partner = results.ladder_partner(preset_name, root) if root is not None else None
    if partner:
        summaries[partner] = summary_at(root, "e5", partner)
    from_partner = (f" Rungs from the `{partner}` study's table (e5-{partner}.parquet) beside this study's own: the "
                    "ladder spans both." if partner else "")  # fmt: skip
    level = verdicts.MEAN if verdicts.MEAN in set(summary["level"]) else sorted(summary["level"].unique())[0]
    for task in _tasks(summary["task"].unique()):
        s = summary[(summary["task"] == task) & (summary["level"] == level)]
        T = int(s["trained_loops"].iloc[0])
        at_scale, fixed = e5.own_scale(s), f"fixed:{T}"
        effects = at_scale[(at_scale["part"] == "effects") & (at_scale["train_loops"] == fixed)]
        if len(effects):
            chart, stats_ = charts.e5_effects(effects.sort_values("eval_loops"), T)
            what = f"{task}, {level}, trained `{fixed}`: R, M and G per seed pair (e5.decompose). "
            cap = charts.caption(int(stats_["n"].min()), stats_["ci_method"], None, what)
            out.append((f"E5 · {task}: train × run effects ({level}, trained {fixed})", chart, cap))
        acc = at_scale[(at_scale["part"] == "accuracy") & at_scale["quantity"].isin(["norm", "none"])]
        if (acc["train_loops"] != fixed).any():  # part 2 run (not at the GPU study: its rungs alone)
            chart, stats_ = charts.e5_range(acc.sort_values("eval_loops"), T)
            dists = ", ".join(dict.fromkeys(acc["train_loops"]))
            what = (
                f"{task}, {level}: each model run as trained; colour: training distribution ({dists}); "
                "solid `norm`, dashed `none`. "
            )
            cap = charts.caption(int(stats_["n"].min()), stats_["ci_method"], charts.CHANCE, what)
            out.append((f"E5 · {task}: accuracy per training distribution, run as trained ({level})", chart, cap))
        points = charts.rung_points(summaries, task, level)
        if len(points[["params", "steps", "device"]].drop_duplicates()) > 1:
            points = points if points["device"].nunique() > 1 else points.drop(columns=["device", "study"])
            what = (f"{task}, {level}: norm − norm→none per seed at n = T and 3T against parameters (reported, not "
                    f"judged); the E2 model's point averages {int(points['n'].max())} seeds, the other rungs "
                    f"{int(points['n'].min())}.")  # fmt: skip
            chart = charts.ladder_chart(points, paper.PAPER_PARAMS)
            out.append((f"E5 · {task}: the surgery's damage against scale ({level})", chart,
                        what + charts.devices_note(points, T) + from_partner))  # fmt: skip
        rescale = at_scale[(at_scale["part"] == "rescale") & (at_scale["train_loops"] == fixed)]
        rescale = rescale[rescale["eval_loops"] >= T].sort_values("eval_loops")
        one_model = len(rescale[["params", "train_steps"]].drop_duplicates()) == 1  # else per rung, below
        if one_model and rescale["mean"].notna().any() and not probing:
            marks = e3_marks(root, preset_name, task, T)
            chart, stats_ = charts.e5_rescale(rescale, T, marks)
            what = f"{task}, {level}, trained `{fixed}`: the rescale surgery's recovery per seed, damaged seeds only. "
            what += ("Diamonds: E3's refits at n = T (the last refit step, e3.summarize). " if marks is not None
                     else "No E3 refits in this study: no diamonds. ")  # fmt: skip
            out.append((f"E5 · {task}: rescale surgery recovery ({level})", chart,
                        charts.point_caption(stats_, None, what)))  # fmt: skip
        per_rung = charts.rung_points(summaries, task, level, "rescale")
        if len(per_rung[["params", "steps", "device"]].drop_duplicates()) > 1:
            per_rung = per_rung if per_rung["device"].nunique() > 1 else per_rung.drop(columns=["device", "study"])
            what = (f"{task}, {level}: the rescale surgery's recovery per rung at n = T and 3T against parameters, "
                    "damaged seeds only.")  # fmt: skip
            chart = charts.ladder_chart(per_rung, paper.PAPER_PARAMS, "recovery (fraction regained)")
            out.append((f"E5 · {task}: rescale surgery recovery per rung ({level})", chart,
                        what + charts.devices_note(per_rung, T) + from_partner))  # fmt: skip
    return out


FIGURES = {"e1": e1_figures, "e2": e2_figures, "e3": e3_figures, "e4": e4_figures, "e5": e5_figures}


# ---------------------------------------------------------------- provenance and commands


def manifest_facts(paths: list[Path], refits: bool = False) -> list[dict]:
    """The provenance of each run (or refit) manifest: experiment, commit, machine, device and when, as text; a
    manifest that is not one (unreadable, nested too deep, a field of the wrong type: engine.core.store's
    valid_manifest) is left out, as the store leaves its run out."""
    from engine.core.store import valid_manifest

    out = []
    for path in paths:
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if valid_manifest(m) is not None:
            continue
        experiment = str(m.get("experiment", "e3" if refits else ""))
        out.append({
            "experiment": f"{experiment} refits" if refits else experiment,
            "commit": str(m.get("git_commit") or "")[:10] + ("+dirty" if m.get("git_dirty") else ""),
            "machine": str((m.get("machine") or {}).get("cpu", m.get("host", ""))),
            "device": str(m.get("device", "")),
            "created": str(m.get("created", "")),
        })  # fmt: skip
    return out


def provenance(root: Path, tables: dict[str, str], frames: dict[str, pd.DataFrame]) -> tuple[list[str], list[list]]:
    """From the run manifests where the runs are present (commit, machine, device, runs), else from the tables."""
    folders = list(dict.fromkeys(results.study_root(root, p) for p in tables.values()))
    runs = manifest_facts(sorted(p for folder in folders for p in folder.glob("runs/*/manifest.json")))
    if runs:
        refits = sorted(p for folder in folders for p in folder.glob("refits/*/manifest.json"))  # E3's refits
        frame = pd.DataFrame(runs + manifest_facts(refits, refits=True))
        grouped = frame.groupby(["experiment", "commit", "machine", "device"], as_index=False).agg(
            runs=("created", "size"), first=("created", "min"), last=("created", "max")
        )
        return list(grouped.columns), grouped.to_numpy().tolist()
    header = ["table", "rows", "runs", "seeds", "tasks", "sha256 (first 16)", "written (UTC)"]
    body = []
    for experiment, preset_name in tables.items():
        path = results.table_path(root, experiment, preset_name)
        rows = frames[experiment]
        seeds = sorted(int(s) for s in rows["seed"].unique())
        body.append([path.name, len(rows), rows["run_key"].nunique(), f"{len(seeds)} ({seeds[0]}–{seeds[-1]})",
                     ", ".join(sorted(rows["task"].unique())), hashlib.sha256(path.read_bytes()).hexdigest()[:16],
                     time.strftime("%Y-%m-%d %H:%M", time.gmtime(path.stat().st_mtime))])  # fmt: skip
    for experiment, preset_name in tables.items():  # E1: the probe manifest names the model and its commit
        probe = Path(root) / f"{experiment}-{preset_name}.json"
        if experiment == "e1" and probe.is_file():
            try:
                m = json.loads(probe.read_text())
                body.append([probe.name, "—", "—", "—", f"model {m.get('model', {}).get('spec', '?')}",
                             f"commit {str(m.get('git_commit', '?'))[:10]}", m.get("created", "")])  # fmt: skip
            except (OSError, ValueError):
                pass
    return header, body


INSTALL = "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .  # README: the torch pin first"


def e1_command(root: Path, slug: str, tasks: str) -> list[str]:
    """The commands that made an E1 table, from its probe manifest (`e1-<slug>.json`): the model (a demonstration
    trained here first, `python -m engine.experiments.e1_demo`) and the probe's settings."""
    try:
        m = json.loads((Path(root) / f"e1-{slug}.json").read_text())
    except (OSError, ValueError):
        return [f"loopscope ouro --task {tasks}  # e1-{slug}.json is missing: the model and settings are unknown"]
    model = m.get("model", {})
    settings = [t.get("settings", {}) for t in m.get("tasks", {}).values()]
    first = settings[0] if settings else {}
    difficulty = ",".join(f"{s['task']}={s['difficulty']}" for s in settings if "task" in s and "difficulty" in s)
    loops = first.get("loops") or []
    command = f"loopscope ouro --model {model.get('hub_id') or model.get('spec', slug)} --task {tasks}"
    command += f" --difficulty {difficulty}" if difficulty else ""
    command += f" --loops {min(loops)}-{max(loops)}" if loops else ""
    command += f" --prompts {first['prompts']}" if "prompts" in first else ""
    command += f" --readout {first['readout']}" if "readout" in first else ""
    demo = "python -m engine.experiments.e1_demo  # trains the demonstration model"
    trained = [demo] if model.get("training") else []
    return [*trained, command]


def commands(
    tables: dict[str, str], frames: dict[str, pd.DataFrame], out: str = "report", root: Path | None = None
) -> list[str]:
    lines = [INSTALL]
    for experiment, preset_name in tables.items():
        rows = frames[experiment]
        seeds = sorted(int(s) for s in rows["seed"].unique())
        span = f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
        tasks = ",".join(sorted(rows["task"].unique()))
        if experiment in REGISTRY:
            lines.append(f"loopscope run {experiment} --preset {preset_name} --seeds {span} --tasks {tasks}")
        elif experiment == "e1":
            lines += e1_command(Path(root or "."), preset_name, tasks)
    presets = set(tables.values())
    return [*lines, f"loopscope report --out {out}" + (f" --preset {presets.pop()}" if len(presets) == 1 else "")]


def _table_html(header: list[str], body: list[list]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in r) + "</tr>" for r in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


# ---------------------------------------------------------------- the page


PAGES = (  # the dashboard's pages (dashboard/app.py), each page's own title as the report's heading of its part
    ("overview", "Overview"),
    ("accuracy", "Accuracy vs depth"),
    ("norms", "Norm trajectories"),
    ("refit", "Readout refit (E3)"),
    ("stacked", "Looped vs stacked (E4)"),
    ("agreement", "Agreement tested directly (E5, beyond the paper)"),
    ("ouro", "Ouro (E1)"),
)
FIGURE_NAME = re.compile(r"^(E\d)( \(d\))? · (\S+?):")  # "E2 (d) · parity: ...": experiment, claim (d), task


def page_of(title: str) -> tuple[str, str]:
    """(page, task) of a figure by its title: E2's claim (d) on Norm trajectories, the rest of E2 on Accuracy vs
    depth, E3 on the refit page, E4 on Looped vs stacked, E5 on Agreement, E1 on Ouro."""
    m = FIGURE_NAME.match(title)
    if not m:
        return "overview", ""
    page = {"E1": "ouro", "E2": "norms" if m.group(2) else "accuracy", "E3": "refit", "E4": "stacked",
            "E5": "agreement"}.get(m.group(1), "overview")  # fmt: skip
    return page, m.group(3)


def _figures_html(figures: list[tuple[str, object, str]]) -> str:
    """One page's figures grouped by task, parity first (matrix.TASKS): each task a heading and its own grid, so no
    row of the grid pairs two tasks."""
    by_task: dict[str, list] = {}
    for title, chart, caption in figures:
        by_task.setdefault(page_of(title)[1], []).append((title, chart, caption))
    out = []
    for task in _tasks(by_task):
        drawn = "".join(f'<figure class="figure"><h3>{_esc(t)}</h3>{_svg(c)}<figcaption>{_md(cap)}</figcaption>'
                        "</figure>" for t, c, cap in by_task[task])  # fmt: skip
        out.append(f'<h3 class="task">{_esc(task)}</h3><div class="figures">{drawn}</div>')
    return "".join(out)


def _cards_html(experiment: str, rows: pd.DataFrame, preset_name: str, root: Path) -> tuple[str, str | None]:
    """One experiment's cards (the overview's "every card"): one per claim and task, parity beside chain."""
    found, rules, problem = claims(experiment, rows, preset_name, root)
    seeds = sorted(int(s) for s in rows["seed"].unique())
    scale = f"{experiment}-{preset_name}.parquet: {preset_name} preset, {len(seeds)} seed(s)"
    if found is None:
        return f"<p>No verdicts: the engine gives none for {experiment} ({_esc(scale)}).</p>", problem
    name = TITLES.get(experiment, experiment)
    if rules == "verdicts":
        found = results.rule_cards(experiment, found)
        drawn = {(c["claim"], c["task"]): rule_card_html(f"{name} ({c['claim']}) · {c['task']}", c, scale,
                                                         experiment) for c in found}  # fmt: skip
    else:  # E5: both levels of a claim and task in one card, the held-out mean first
        grouped: dict[tuple, list[dict]] = {}
        for c in found:
            grouped.setdefault((c["claim"], c["task"]), []).append(c)
        drawn = {(claim, task): card_html(f"{name}: {claim} · {task}", levels, scale)
                 for (claim, task), levels in grouped.items()}  # fmt: skip
    return f'<div class="cards">{"".join(paired_cells(drawn))}</div>', problem


@functools.lru_cache(maxsize=8)
def _rules(root: str, study: str, partner: str | None, state: tuple) -> list:
    from engine.experiments import ladder

    tables = {p: pd.read_parquet(results.table_path(Path(root), "e5", p)) for p in (study, partner) if p}
    tables = results.by_device(tables)
    return ladder.rules(tables.get("cpu"), tables.get("gpu"), ladder.every_rung(study))


def ladder_rules(root: Path, study: str) -> list:
    """engine.experiments.ladder.rules over this study's E5 ladder and its partner's, once per state of the two
    tables (the report reads them on the overview or the Agreement part, and in the reading under them)."""
    partner = results.ladder_partner(study, root)
    state = tuple(_state(results.table_path(root, "e5", p)) for p in (study, partner) if p)
    return _rules(str(root), study, partner, state)


def study_html(root: Path, tables: dict[str, str], prefix: str = "", level: int = 2) -> list[str]:
    """One study's report laid out as the dashboard's pages (PAGES, each page's title its heading, `prefix` before
    it): the overview (the study's note, the verdict matrix, for a study of the ladder alone its rules and figure,
    every card), then each page's figures grouped by task, then provenance and the commands. {experiment: preset}:
    the study's tables (E1's named by its model: its part says so)."""
    frames, problems, parts = {}, [], []
    for experiment, preset_name_ in tables.items():
        try:
            frames[experiment] = pd.read_parquet(results.table_path(root, experiment, preset_name_))
        except Exception as e:
            problems.append(f"{experiment}-{preset_name_}.parquet could not be read ({type(e).__name__})")
    tables = {e: p for e, p in tables.items() if e in frames}
    study = next((p for e, p in tables.items() if e != "e1"), None)
    h = f"h{level}"
    say(f"{study}: verdicts")
    parts.append(f"<{h}>{prefix}Overview</{h}>")
    if study:
        entry = STUDY_ENTRIES.get(study)
        if entry is not None:  # its note, and whether its ladder's lower rungs are its partner's (the probe decides)
            parts.append(f"<p class='note'>{_md(entry.note + ' ' + results.partner_sentence(study, root))}</p>")
        if below_bar := results.recipe_below_bar(study, root):
            parts.append(f"<p>{_md(below_bar)}</p>")
        found = [r for r in matrix.rows(study, root) if not r["note"] or r["experiment"] in tables]
        parts.append(matrix.matrix_html(found, study, links=False) + f"<p class='legend'>{_esc(LEGEND)}</p>")
        elsewhere = [(e, results.presets(e, root)) for e in ("e2", "e3", "e4", "e5") if e not in tables]
        elsewhere = [(e, p) for e, p in elsewhere if p]
        if elsewhere:
            parts.append(f"<p class='scope'>Not part of the <code>{_esc(study)}</code> study, so not in this "
                         "report: " + "; ".join(f"{e.upper()} (its tables are other studies': "
                                                f"{', '.join(f'<code>{_esc(x)}</code>' for x in p)})"
                                                for e, p in elsewhere)
                         + ". Each has its own report: <code>loopscope report --preset STUDY</code>.</p>")  # fmt: skip
    figures: dict[str, list] = {}
    for experiment, preset_name_ in tables.items():
        how = {"root": root} if experiment in ("e3", "e5") else {}  # E5's ladder spans its partner; E3's markers
        say(f"{experiment}-{preset_name_}: figures")
        try:
            for fig in FIGURES[experiment](frames[experiment], preset_name_, **how) if experiment in FIGURES else []:
                figures.setdefault(page_of(fig[0])[0], []).append(fig)
        except Exception as e:
            problems.append(f"{experiment}: figures could not be drawn ({type(e).__name__}: {e})")
    first_screen = study is not None and study in STUDY_ENTRIES and STUDY_ENTRIES[study].ladder_only
    rules = rules_html(root, study, level + 1) if study else []
    if first_screen and rules:  # a study of the ladder alone: its rules and their figure on the first screen
        ladder = [f for f in figures.get("agreement", []) if "damage against scale" in f[0]]
        parts += rules + ([_figures_html(ladder)] if ladder else [])
        figures["agreement"] = [f for f in figures.get("agreement", []) if f not in ladder]  # drawn once
    order = {e: i for i, e in enumerate(("e2", "e3", "e4", "e1", "e5"))}  # the overview's sections' order
    for experiment in sorted(tables, key=lambda e: order.get(e, len(order))):
        parts.append(f"<h{level + 1}>{prefix}{_esc(TITLES.get(experiment, experiment))}: every card</h{level + 1}>")
        cards, problem = _cards_html(experiment, frames[experiment], tables[experiment], root)
        problems += [problem] if problem else []
        parts.append(cards)
    for problem in problems:
        parts.append(f'<p class="problem"><b>Problem:</b> {_esc(problem)}</p>')
    say(f"{sum(map(len, figures.values()))} figures to SVG")
    for page, heading in PAGES[1:]:
        if not figures.get(page) and not (page == "agreement" and rules and not first_screen):
            continue
        parts.append(f'<{h} id="{_esc(prefix.strip(" ·"))}{page}">{prefix}{_esc(heading)}</{h}>')
        if page == "ouro" and "e1" in tables:
            parts.append(f"<p class='scope'>E1's table <code>e1-{_esc(tables['e1'])}.parquet</code> is named by the "
                         "model it probes, not by a study: the same part in every study's report.</p>")  # fmt: skip
        parts.append(_figures_html(figures.get(page, [])))
        if page == "agreement" and rules and not first_screen:
            parts += rules
    if tables:
        header, body = provenance(root, tables, frames)
        parts.append(f"<{h}>{prefix}Provenance</{h}>{_table_html(header, body)}")
        parts.append(f"<{h}>{prefix}Reproduce</{h}><pre>" + _esc("\n".join(commands(tables, frames, root=root)))
                     + "</pre>")  # fmt: skip
    return parts


STUDY_ENTRIES = studies.STUDIES
GPU_STUDY = (
    "The study at the paper's scale, run on a GPU (docs/gpu-study.md, “Predictions and rules, written before it "
    "runs”): the second CPU study's parity on models up to the paper's 19M, E2 and E3 judged by the second CPU "
    "study's rules, E5's ladder (its bridge rung also run on the CPU) and rescale surgery. Its runs and tables live in "
    "a folder of their own under the results folder; the figures of E5's ladder mark each point's device."
)


def probe_html(root: Path, study: str) -> list[str]:
    """A study's recipe probe seed by seed (results.probe_rows) as a table, where it has one."""
    rows = results.probe_rows(study, root)
    if not rows:
        return []
    header, body = list(rows[0]), [list(r.values()) for r in rows]
    return [f"<h3>{_esc(study)} · the recipe probe, seed by seed</h3><p>Held-out accuracy at n = T per seed, run as "
            "trained; where seeds are missing, the range the mean over seeds 0–3 can still take "
            "(docs/gpu-study.md).</p>" + _table_html(header, body)]  # fmt: skip


def rules_heading(root: Path, study: str) -> str:
    """The rules' heading: "both devices' ladders" only where the ladder spans two devices (the GPU study and the
    `cpu` study's rungs); the Agreement page's words otherwise."""
    partner = results.ladder_partner(study, root)
    devices = {results.device_of(p) for p in (study, partner) if p}
    return "the rules over both devices' ladders" if len(devices) > 1 else "the GPU study's rules over the ladder"


def rules_html(root: Path, study: str, level: int = 3) -> list[str]:
    """The GPU study's rules over the ladder, where the E5 page shows them (results.reads_ladder_rules): its trend,
    collapse per rung and bridge, and the reading with the rescale verdicts per rung."""
    if not results.reads_ladder_rules(study, root):
        return []
    return ladder_rules_html(root, study, level)


def ladder_rules_html(root: Path, study: str, level: int = 3) -> list[str]:
    """The GPU study's rules over the ladder (engine.experiments.ladder.rules) as a table, where the study has an
    E5 table (its partner's, on the same device or the other, read beside it where root holds one)."""
    from engine.experiments import ladder

    if study not in results.presets("e5", root):
        return []
    h = f"h{level}"
    heading = f"<{h}>{_esc(study)} · {rules_heading(root, study)}</{h}>"
    if probing := results.probe_open(study, root):
        return [f"{heading}<p>{_md(probing)}</p>"]
    below_bar = results.recipe_below_bar(study, root)
    partner = results.ladder_partner(study, root)
    rules = ladder_rules(root, study)
    found = [dict(claim=r.claim, outcome=r.outcome, measured=r.measured) for r in rules]
    said = ladder.reading(found, results.claims("e5", study, root)["claims"])
    read = (f" The rungs of the <code>{_esc(partner)}</code> study's table (e5-{_esc(partner)}.parquet) are read "
            "beside this study's." if partner else "")  # fmt: skip
    return [f"{heading}<p>Written before any GPU run (docs/gpu-study.md, “Predictions and rules”): trend, collapse per "
            f"rung by E2 (d)'s criteria, the bridge; held-out mean; the bridge rung counted once, with the CPU's "
            f"seeds.{read}</p>" + (f"<p>{_md(below_bar)}</p>" if below_bar else "")
            + _table_html(["claim", "outcome", "measured"],
                          [[r.claim, r.outcome, r.measured] for r in rules])
            + f"<p><strong>What it says about the paper's collapse.</strong> {_esc(said)}</p>"]  # fmt: skip


def study_title(study: str) -> tuple[str, str]:
    """(heading, text) of a study with a folder of its own, by what it is (engine.studies): never "the GPU study"
    for a CPU one."""
    if study in results.PARTNER_RECIPE:  # a CPU study continuing the GPU study's ladder
        return "The GPU study's ladder on the CPU", _md(STUDY_ENTRIES[study].note)
    if results.device_of(study) == "GPU":
        return "The GPU study", GPU_STUDY
    entry = STUDY_ENTRIES.get(study)
    return "A study of its own folder", _md(entry.note) if entry else ""


def html(root: Path, preset_name: str | None = None) -> str:
    """The report of one study (the preset given, else the default study: report_study), laid out as the pages;
    without a preset, each study with a folder of its own (the GPU study, the ladder on the CPU) follows as its own
    section (own_studies). With a preset, that study only."""
    root = Path(root)
    tables, own = chosen_tables(root, preset_name), own_studies(root, preset_name)
    where = _esc(shown_path(root))
    study = report_study(root, preset_name)
    named = f", study <code>{_esc(study)}</code>" if study else ""
    alone = (" It reports this one study: every matrix row, card and figure is from its own tables (E1's, named by "
             "its model, excepted)." if preset_name else "")  # fmt: skip
    parts = [f"<h1>loopscope: does depth stay reusable?</h1><p>Static report of <code>{where}</code>{named}, written "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Each card is one claim of the paper: its figure, "
             "the measured one, and a verdict by the study's rules (docs/design.md, “Verdict rules”)."
             f"{alone}</p>"]  # fmt: skip
    if not tables and not own:
        parts.append(f"<p>No experiment tables under <code>{where}</code>: run <code>loopscope run e2 "
                     "--preset cpu</code> first.</p>")  # fmt: skip
    if study and not any(e != "e1" for e in tables) and tables:
        parts.append(f"<p class='problem'>No table of the <code>{_esc(study)}</code> study under <code>{where}</code>."
                     "</p>")  # fmt: skip
    parts += study_html(root, tables) if tables else []
    if study in results.OWN_FOLDER:  # a study of its own folder chosen: where its runs were made, its probe
        made = results.study_provenance(root, study)
        if made:
            header = [*results.PROVENANCE, "runs"]
            parts.append(f"<h3>{_esc(study)} · {results.device_of(study)} provenance</h3>"
                         + _table_html(header, [[r[h] for h in header] for r in made]))  # fmt: skip
        parts += probe_html(root, study)
    for study in own:
        folder = results.study_root(root, study)
        smoke = " This one is its structure at a size the CPU runs in seconds: not a result." * (study == "gpu-smoke")
        title, text = study_title(study)
        text += " " + _md(results.partner_sentence(study, root))
        parts.append(f'<h2 id="study-{_esc(study)}">{title} (<code>{_esc(study)}</code>)</h2><p>{text}'
                     f"{smoke} Folder: <code>{_esc(shown_path(folder))}</code>.</p>")  # fmt: skip
        made = results.study_provenance(root, study)
        if made:
            header = [*results.PROVENANCE, "runs"]
            parts.append(f"<h3>{_esc(study)} · {results.device_of(study)} provenance</h3>"
                         + _table_html(header, [[r[h] for h in header] for r in made]))  # fmt: skip
        parts += study_html(root, {e: study for e, p in catalog(root).items() if study in p}, f"{study} · ")
        parts += probe_html(root, study)
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>loopscope report</title>'
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")  # fmt: skip


@functools.lru_cache(maxsize=4)
def _cached_html(root: str, preset_name: str | None, state: tuple, shown: str) -> bytes:
    return html(Path(root), preset_name).encode()  # `shown`: the folder as the page names it (read-only: its name)


def html_bytes(preset_name: str | None = None, root: Path | None = None) -> bytes:
    """The report of the results folder (dashboard.results.results_root unless given) as `loopscope report` writes
    it, kept per state of its tables: the overview's download. Only this module imports dashboard.results, never
    the other way round."""
    root = Path(root) if root is not None else results.results_root()
    return _cached_html(str(root), preset_name, results.tables_state(root), shown_path(root))


def write(out: Path, root: Path, preset_name: str | None = None) -> Path:
    """Write <out>/index.html; return its path. A study's recipe-probe.json that is not one (results.probe_problem)
    ends it in one sentence (UsageError: `loopscope report` exits 2) before anything is written."""
    from engine.errors import UsageError

    if problem := next(filter(None, (results.probe_problem(s, root) for s in results.OWN_FOLDER)), None):
        raise UsageError(problem)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(html(root, preset_name), encoding="utf-8")
    return path


if __name__ == "__main__":  # `loopscope report` runs this: python -m dashboard.report OUT RESULTS [PRESET]
    import sys

    from engine.errors import UsageError, explain

    out, root, *chosen = sys.argv[1:]
    began = time.monotonic()

    def say(text: str) -> None:  # noqa: F811  (the module's hook, made to print)
        print(f"report: {text} ({time.monotonic() - began:.0f} s)", file=sys.stderr, flush=True)

    globals()["say"] = say
    try:
        written = write(Path(out), Path(root), chosen[0] if chosen else None)
    except Exception as e:  # as the CLI says it: one sentence for a known failure, a traceback for a bug
        sentence = str(e) if isinstance(e, UsageError) else explain(e)
        if sentence is None:
            raise
        print(f"loopscope: error: {sentence}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {written} ({written.stat().st_size:,} bytes)")
