"""Chart builders: pure functions from tidy frames to Altair charts (no Streamlit in here).

Colours are Okabe-Ito (colour-blind safe): each boundary mode keeps its colour on every page.
Every layer is named, so tests and readers can find the CI band, the budget rule and the chance rule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import altair as alt
import pandas as pd
import vl_convert

from dashboard.caching import memoized
from engine import paper

MODE_COLORS = {"norm": "#0072B2", "none": "#D55E00", "norm->none": "#CC79A7"}
STACKED_COLORS = {"norm": "#009E73", "none": "#E69F00", "norm->none": "#000000"}
OTHER_COLORS = ("#E69F00", "#56B4E9", "#009E73", "#000000")
_CUTS = [0.0, *(cut for cut, _ in paper.DELTA_MAGNITUDES), 1.0]
MAGNITUDES = tuple(zip(_CUTS[:-1], _CUTS[1:], [*(name for _, name in paper.DELTA_MAGNITUDES), "large"], strict=True))
MAGNITUDE_SHADES = ("#ffffff", "#f2f2f2", "#e4e4e4", "#d4d4d4")
SERIES_ORDER = ("norm", "none", "norm->none")
CHANCE = 0.5
WIDTH, HEIGHT = 560, 300
N_TITLE = "inference loop count n (loop steps)"
# fit-x: the width follows the page (Streamlit stretches it), the plot keeps its height (Streamlit's default
# "fit" would squeeze the plot to make room for the legend and axis titles)
AUTOSIZE = alt.AutoSizeParams(type="fit-x", contains="padding")
X_AXES = {  # E4's axis (engine.experiments.e4.AXES; also the URL value) -> (column, title); T: the row's own
    "n": ("eval_loops", N_TITLE),
    "ratio": ("overshoot_ratio", "overshoot ratio n / T (multiples of the trained budget)"),
    "difference": ("overshoot_diff", "overshoot difference n − T (loop steps beyond the budget)"),
}
INTEGER_AXES = {"eval_loops", "overshoot_diff", "refit_steps"}
SET_SEP = " · "  # series of a compared result set: `<series> · <set>`
LABEL_STEP = 14  # px between the labels of reference points at the same x
MIN_BAND_SEEDS = 3  # no CI band from fewer seeds: a bootstrap over 2 seeds only restates their range
LEVEL_DASHES = ([1, 0], [8, 4], [2, 3], [8, 3, 2, 3])  # the reference levels' rules: solid, dashed, dotted, dash-dot
LEVELS_TITLE = "levels (black rules)"


# a line-style legend's symbol: a dark unfilled stroke (with point=True a filled symbol hides the dash)
DASH_SYMBOL = dict(symbolType="stroke", symbolStrokeWidth=2, symbolStrokeColor="#333333", symbolFillColor="transparent")
DASH_LEGEND = alt.Legend(**DASH_SYMBOL)


def series_label(arch: str, boundary: str, archs: Sequence[str]) -> str:
    """`norm` when only looped models are shown; `looped, norm` / `stacked, norm` when both are."""
    return boundary if set(archs) <= {"looped"} else f"{arch}, {boundary}"


def color_of(label: str, i: int = 0) -> str:
    """A series' colour from its mode (and architecture); a compared result set (`norm · cpu-1layer`) keeps
    the colour of its mode and is told apart by its dash."""
    arch, _, boundary = label.split(SET_SEP)[0].rpartition(", ")
    palette = STACKED_COLORS if arch == "stacked" else MODE_COLORS
    return palette.get(boundary, OTHER_COLORS[i % len(OTHER_COLORS)])


def color_scale(labels: Sequence[str]) -> alt.Scale:
    """Fixed colours per series, in the canonical order norm, none, norm->none (looped before stacked)."""

    def rank(label: str) -> tuple:
        arch, _, boundary = label.split(SET_SEP)[0].rpartition(", ")
        return (arch == "stacked", SERIES_ORDER.index(boundary) if boundary in SERIES_ORDER else 9, label)

    labels = sorted(dict.fromkeys(labels), key=rank)
    return alt.Scale(domain=labels, range=[color_of(s, i) for i, s in enumerate(labels)])


def budget_rules(T: int | float, label: str | None = None) -> pd.DataFrame:
    """One budget rule at x = T, for `curves(budgets=...)`."""
    return pd.DataFrame({"x": [T], "label": [label or f"trained budget T = {T:g}"]})


def _budget_layers(budgets: pd.DataFrame, colors=alt.Undefined) -> list[alt.Chart]:
    # a rule per series in its colour, on the curves' scale and legend (legend=None here made Vega warn of a
    # conflicting legend, E4's page)
    color = alt.Color("series:N", scale=colors) if "series" in budgets else alt.value("#444444")
    rule = (
        alt.Chart(budgets)
        .mark_rule(strokeDash=[6, 4], strokeWidth=1.5)
        .encode(x="x:Q", color=color)
        .properties(name="budget")
    )
    # above the plot's frame, beside the data, never on it: at the foot a label crossed the state-norm curves (Norms
    # page) and E4's δ at o = 1; two sets' labels stacked upwards, never overlapping (y in px from the frame's top)
    stacked = budgets.assign(y_px=[-4 - 14 * i for i in range(len(budgets))])
    text = (
        alt.Chart(stacked)
        .mark_text(align="left", dx=4, baseline="bottom", fontSize=11)
        .encode(x="x:Q", y=alt.Y("y_px:Q", scale=None), text="label:N", color=color)
        .properties(name="budget-label")
    )
    return [rule, text]


def _chance_layers(chance: float, label: str, x_at: float) -> list[alt.Chart]:
    """The chance rule, dotted, with its label as a tooltip: a text on the plot would sit where curves near chance
    run (every caption names the dotted rule)."""
    data = pd.DataFrame({"y": [chance], "x": [x_at], "label": [label]})
    rule = (
        alt.Chart(data)
        .mark_rule(strokeDash=[2, 3], color="#666666")
        .encode(y="y:Q", tooltip=["label:N"])
        .properties(name="chance")
    )
    return [rule]


def _reference_layers(refs: pd.DataFrame, left: bool = False) -> list[alt.Chart]:
    """The paper's reported figures: points where x is given, horizontal rules where it is not. left: the points'
    labels to their left (a margin the figure keeps free for them), else to their right."""
    layers = []
    points, levels = refs[refs["x"].notna()], refs[refs["x"].isna()]
    if len(points):
        layers.append(
            alt.Chart(points)
            .mark_point(shape="diamond", size=110, filled=True, color="#000000")
            .encode(x="x:Q", y="y:Q", tooltip=["label:N", "y:Q"])
            .properties(name="reference")
        )
        # points sharing an x get their labels LABEL_STEP px apart, the highest point's label on top: two refits
        # that end at the same level at n = T must not overprint (each label is its own layer: dy is not a channel)
        points = points.assign(rank=points.groupby("x")["y"].rank(method="first", ascending=False) - 1,
                               count=points.groupby("x")["y"].transform("size"))  # fmt: skip
        for i, (_, point) in enumerate(points.iterrows()):
            dy = LABEL_STEP * (point["rank"] - (point["count"] - 1) / 2)
            layers.append(
                alt.Chart(pd.DataFrame([point[["x", "y", "label"]]]))
                .mark_text(
                    align="right" if left else "left",
                    dx=-10 if left else 10,
                    dy=float(dy),
                    baseline="middle",
                    fontSize=11,
                )  # fmt: skip
                .encode(x="x:Q", y="y:Q", text="label:N")
                .properties(name=f"reference-label-{i}")
            )
    if len(levels):
        # named in a legend, one dash per level, never by a text on the plot: a level's label sat on its rule, where
        # the curves that reach it run (E3's full recovery at 1.0)
        labels = list(dict.fromkeys(levels["label"]))
        dashes = alt.Scale(domain=labels, range=[LEVEL_DASHES[i % len(LEVEL_DASHES)] for i in range(len(labels))])
        legend = alt.Legend(orient="bottom", direction="vertical", labelLimit=0, symbolSize=500, **DASH_SYMBOL)
        layers.append(
            alt.Chart(levels)
            .mark_rule(color="#000000", opacity=0.6, strokeWidth=1.5)
            .encode(
                y="y:Q",
                strokeDash=alt.StrokeDash("label:N", title=LEVELS_TITLE, scale=dashes, legend=legend),
                tooltip=["label:N", "y:Q"],
            )
            .properties(name="reference-level")
        )
    return layers


@memoized()
def curves(
    stats: pd.DataFrame,
    x: str,
    x_title: str,
    y_title: str,
    *,
    seeds: pd.DataFrame | None = None,
    budgets: pd.DataFrame | None = None,
    chance: float | None = None,
    chance_label: str = "chance 0.5",
    references: pd.DataFrame | None = None,
    y_domain: tuple[float, float] | None = (0.0, 1.0),
    y_log: bool = False,
    x_domain: tuple[float, float] | None = None,
    legend_title: str = "mode",
    dash: str | None = None,
    dash_title: str | None = None,
    x_values: Sequence[float] | None = None,
    labels_left: bool = False,
) -> alt.LayerChart:
    """Mean per series against x with its CI band (stats: series, x, mean, ci_low, ci_high, n),
    optional per-seed lines (seeds: series, seed, x, value), budget rule(s), chance and reference marks.
    dash: a column of stats whose values are drawn solid (its first value) and dashed (default: `arch` where
    both architectures are shown); dash_title: a legend for it (none by default: the series labels name it).
    No band where a point averages fewer than MIN_BAND_SEEDS seeds (band_rows). x_values: the x axis' ticks (default:
    Vega's); labels_left: reference points' labels to their left (_reference_layers)."""
    colors = color_scale(stats["series"]) if len(stats) else alt.Undefined
    scale = alt.Scale(type="log") if y_log else alt.Scale(domain=list(y_domain) if y_domain else alt.Undefined)
    x_scale = alt.Scale(domain=list(x_domain), nice=False) if x_domain else alt.Scale(nice=False)
    ticks = list(x_values) if x_values is not None else alt.Undefined
    axis = alt.Axis(tickMinStep=1 if x in INTEGER_AXES else alt.Undefined, values=ticks)
    x_enc = alt.X(f"{x}:Q", title=x_title, scale=x_scale, axis=axis)
    # one legend, merged over the layers, drawn as solid strokes (the mean lines), not as the faint band
    legend = alt.Legend(orient="bottom", symbolType="stroke", symbolOpacity=1, symbolStrokeWidth=3, symbolSize=300)
    color = alt.Color("series:N", title=legend_title, scale=colors, legend=legend if len(stats) else None)
    base = alt.Chart(stats).encode(x=x_enc, color=color)
    tooltip = [
        alt.Tooltip("series:N", title=legend_title),
        alt.Tooltip(f"{x}:Q", title=x),
        alt.Tooltip("mean:Q", format=".3f"),
        alt.Tooltip("ci_low:Q", format=".3f", title="95% CI low"),
        alt.Tooltip("ci_high:Q", format=".3f", title="95% CI high"),
        alt.Tooltip("n:Q", title="seeds"),
    ]
    # stacked models dashed (the colour legend already names the architecture), or the column asked for
    dash_col = dash
    if dash is not None:  # the first value solid, the next dashed; the series labels (or dash_title's legend) name them
        tooltip = [*tooltip[:1], alt.Tooltip(f"{dash}:N", title=dash_title or dash), *tooltip[1:]]  # and the tooltip
        # a legend of its own under the colours', one entry a line, long enough (symbolSize) to show each dash whole
        legend = alt.Legend(orient="bottom", direction="vertical", labelLimit=0, symbolSize=500,
                            **DASH_SYMBOL) if dash_title else None  # fmt: skip
        values = list(dict.fromkeys(stats[dash]))
        dashes = alt.Scale(domain=values, range=[LEVEL_DASHES[i % len(LEVEL_DASHES)] for i in range(len(values))])
        dash = alt.StrokeDash(f"{dash}:N", scale=dashes, legend=legend, title=dash_title or alt.Undefined)
    elif "arch" in stats and stats["arch"].nunique() > 1:
        dash, dash_col = alt.StrokeDash("arch:N", legend=None), "arch"
    banded = band_rows(stats)
    band = alt.Chart(banded).encode(x=x_enc, color=color)
    band = band.encode(detail=f"{dash_col}:N") if dash_col else band  # one band per drawn line, never merged
    layers = [
        band.mark_area(opacity=0.18)
        .encode(y=alt.Y("ci_low:Q", scale=scale, title=y_title), y2="ci_high:Q")
        # the band is the 95% CI from engine.core.stats (bootstrap over seeds), not Altair's own aggregate
        .properties(name="ci-band"),
    ][: 1 if len(banded) else 0]  # no band layer without rows: an empty one has an infinite extent (a Vega warning)
    if seeds is not None and len(seeds):
        layers.append(
            alt.Chart(seeds)
            .mark_line(opacity=0.35, strokeWidth=1)
            .encode(x=x_enc, y=alt.Y("value:Q", scale=scale), color=color, detail="seed:N")
            .properties(name="seeds")
        )
    mean = base.mark_line(point=True, strokeWidth=2.5).encode(y=alt.Y("mean:Q", scale=scale, title=y_title),
                                                              tooltip=tooltip)  # fmt: skip
    layers.append((mean.encode(strokeDash=dash) if dash else mean).properties(name="mean"))
    if budgets is not None and len(budgets):
        layers += _budget_layers(budgets, colors)
    if chance is not None:
        x_right = x_domain[1] if x_domain else (stats[x].max() if len(stats) else 1)
        layers += _chance_layers(chance, chance_label, x_right)
    if references is not None and len(references):
        layers += _reference_layers(references, labels_left)
    chart = alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, autosize=AUTOSIZE)
    # the reference levels' dashes are their own legend, apart from a dash the curves may have (arch, set)
    return chart.resolve_scale(color="shared", strokeDash="independent")


def band_rows(stats: pd.DataFrame) -> pd.DataFrame:
    """The points of a curve that get a CI band: those averaging at least MIN_BAND_SEEDS seeds."""
    return stats[stats["n"] >= MIN_BAND_SEEDS] if "n" in stats else stats


@memoized()
def delta_chart(
    summary: pd.DataFrame,
    x: str,
    x_title: str,
    budgets: pd.DataFrame | None = None,
    y_title: str = "Cliff's δ, none vs norm",
    height: int = 220,
) -> alt.LayerChart:
    """Cliff's delta (none vs norm) per x with its CI, over shaded magnitude bands (paper.DELTA_MAGNITUDES)."""
    bands = pd.DataFrame(
        [(sign * lo, sign * hi, name) for lo, hi, name in MAGNITUDES for sign in (1, -1)],
        columns=["y", "y2", "magnitude"],
    )
    names = [m[2] for m in MAGNITUDES]
    layers = [
        alt.Chart(bands)
        .mark_rect(opacity=0.9)
        .encode(
            y=alt.Y(
                "y:Q",
                scale=alt.Scale(domain=[-1.06, 1.06], nice=False),
                title=y_title,
                axis=alt.Axis(values=[-1, -0.5, 0, 0.5, 1]),
            ),  # room for a point and its CI at ±1
            y2="y2:Q",
            fill=alt.Fill(
                "magnitude:N",
                scale=alt.Scale(domain=names, range=list(MAGNITUDE_SHADES)),
                title="|δ| magnitude",
                legend=alt.Legend(orient="bottom", symbolStrokeColor="#999999", symbolStrokeWidth=0.5),
            ),
        )
        .properties(name="magnitude-bands"),
        alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="#666666").encode(y="y:Q"),
    ]
    pad = 0.5 if x in INTEGER_AXES else 0.05 * float(summary[x].max() - summary[x].min() or 1) if len(summary) else 0
    # half a step beyond the first and last x: their points and CIs are drawn whole, not cut at the edge
    domain = [float(summary[x].min()) - pad, float(summary[x].max()) + pad] if len(summary) else alt.Undefined
    axis = alt.Axis(tickMinStep=1 if x in INTEGER_AXES else alt.Undefined)
    base = alt.Chart(summary).encode(
        x=alt.X(f"{x}:Q", title=x_title, scale=alt.Scale(domain=domain, nice=False), axis=axis)
    )
    layers += [
        base.mark_rule(strokeWidth=1.5, color="#333333", opacity=0.6)
        .encode(y="delta_ci_low:Q", y2="delta_ci_high:Q")
        .properties(name="delta-ci"),
        base.mark_point(filled=True, size=60, color="#333333")
        .encode(
            y="delta:Q",
            tooltip=[
                alt.Tooltip(f"{x}:Q"),
                alt.Tooltip("delta:Q", format="+.3f", title="Cliff's δ"),
                alt.Tooltip("delta_ci_low:Q", format="+.3f", title="95% CI low"),
                alt.Tooltip("delta_ci_high:Q", format="+.3f", title="95% CI high"),
                alt.Tooltip("magnitude:N"),
                alt.Tooltip("p_value:Q", format=".3g", title="Mann-Whitney p"),
            ],
        )
        .properties(name="delta"),
    ]
    if budgets is not None and len(budgets):
        layers += _budget_layers(budgets)
    return alt.layer(*layers).properties(width=WIDTH, height=height, autosize=AUTOSIZE)


@memoized()
def paired_chart(
    summary: pd.DataFrame,
    per_seed: pd.DataFrame,
    x: str,
    x_title: str,
    y_title: str,
    budgets: pd.DataFrame | None = None,
    height: int = 220,
) -> alt.LayerChart:
    """Per-seed paired differences against x: one thin line per seed (per_seed: seed, x, diff), the mean
    difference with its 95% CI (summary: x, mean_diff, ci_low, ci_high and the tests, from
    engine.core.stats.paired_summary), the zero line and the budget rule(s)."""
    axis = alt.Axis(tickMinStep=1 if x in INTEGER_AXES else alt.Undefined)
    x_enc = alt.X(f"{x}:Q", title=x_title, scale=alt.Scale(nice=False), axis=axis)
    base = alt.Chart(summary).encode(x=x_enc)
    fields = {"mean_diff": ("+.3f", "mean difference"), "ci_low": ("+.3f", "95% CI low"),
              "ci_high": ("+.3f", "95% CI high"), "n_pairs": ("d", "seeds (pairs)"),
              "wilcoxon_p": (".3g", "Wilcoxon p"), "wilcoxon_p_holm": (".3g", "Holm p")}  # fmt: skip
    tooltip = [alt.Tooltip(f"{x}:Q")] + [
        alt.Tooltip(f"{c}:Q", format=f, title=t) for c, (f, t) in fields.items() if c in summary
    ]
    layers = [
        alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="#666666").encode(y="y:Q").properties(name="zero"),
        alt.Chart(per_seed)
        .mark_line(opacity=0.3, strokeWidth=1, color="#555555")
        .encode(x=x_enc, y=alt.Y("diff:Q", title=y_title), detail="seed:N")
        .properties(name="seeds"),
        base.mark_area(opacity=0.25, color="#333333").encode(y="ci_low:Q", y2="ci_high:Q").properties(name="ci-band"),
        base.mark_line(point=alt.OverlayMarkDef(color="#000000"), strokeWidth=2.5, color="#000000")
        .encode(y="mean_diff:Q", tooltip=tooltip)
        .properties(name="mean"),
    ]
    if budgets is not None and len(budgets):
        layers += _budget_layers(budgets)
    return alt.layer(*layers).properties(width=WIDTH, height=height, autosize=AUTOSIZE)


@memoized()
def difference_chart(diffs: pd.DataFrame, x: str, x_title: str, y_title: str, budgets=None) -> alt.LayerChart:
    """Two result sets compared: the difference of their means per series and x (diffs: series, x, diff),
    in the series' colours, with the zero line."""
    colors = color_scale(diffs["series"]) if len(diffs) else alt.Undefined
    axis = alt.Axis(tickMinStep=1 if x in INTEGER_AXES else alt.Undefined)
    legend = alt.Legend(orient="bottom", symbolType="stroke", symbolStrokeWidth=3)
    layers = [
        alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="#666666").encode(y="y:Q").properties(name="zero"),
        alt.Chart(diffs)
        .mark_line(point=True, strokeWidth=2)
        .encode(
            x=alt.X(f"{x}:Q", title=x_title, scale=alt.Scale(nice=False), axis=axis),
            y=alt.Y("diff:Q", title=y_title),
            color=alt.Color("series:N", title="series", scale=colors, legend=legend),
            tooltip=["series:N", alt.Tooltip(f"{x}:Q"), alt.Tooltip("diff:Q", format="+.3f", title="difference")],
        )
        .properties(name="difference"),
    ]
    if budgets is not None and len(budgets):
        layers += _budget_layers(budgets)
    return alt.layer(*layers).properties(width=WIDTH, height=220, autosize=AUTOSIZE)


def _loop_count(series: str) -> float:
    """The n of a ladder series label (`n = 12 (3T)` -> 12), for ordering; labels without one last."""
    try:
        return float(series.split("=", 1)[1].split()[0])
    except (IndexError, ValueError):
        return math.inf


def rung_points(summaries: dict, task: str, level: str, part: str = "ladder") -> pd.DataFrame:
    """Per rung of E5's ladder at n = T and 3T, from {study: engine.experiments.e5.summarize's table} (a study and
    its partner on the other device; a summary that is None, or lacks the task and level, or has another T than
    the first, is left out): part `ladder` (the surgery's damage) or `rescale` (its recovery, fixed-T training).
    Columns: series (n = T / 3T), params, steps, mean, ci_low, ci_high, n, device (CPU or GPU: the study's,
    dashboard.results.device_of), study and run_on (device and precision, dashboard.results.run_on): ladder_chart's
    points."""
    from dashboard.results import device_of, run_on

    columns = ["series", "params", "steps", "mean", "ci_low", "ci_high", "n", "device", "study", "run_on"]
    frames, T = [], None
    for study, summary in summaries.items():
        s = summary[(summary["task"] == task) & (summary["level"] == level)] if summary is not None else None
        if s is None or s.empty or T is not None and int(s["trained_loops"].iloc[0]) != T:
            continue
        T = int(s["trained_loops"].iloc[0])
        s = s[(s["part"] == part) & s["eval_loops"].isin([T, 3 * T]) & s["mean"].notna()]
        s = s[s["train_loops"] == f"fixed:{T}"] if part == "rescale" else s
        frames.append(s.assign(
            series=[f"n = {n} ({'T' if n == T else '3T'})" for n in s["eval_loops"]],
            steps=s["train_steps"].astype(int).astype(str), device=device_of(study), study=study, run_on=run_on(study),
        ))  # fmt: skip
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def devices_note(points: pd.DataFrame, T: int) -> str:
    """The ladder figure's sentence on its devices (rung_points): which study each device's points come from, and
    the rungs run on both (the bridge) with both means at n = T; for one device, what every rung ran on."""
    if "device" not in points or points["device"].nunique() < 2:
        if "run_on" not in points or points.empty:
            return ""
        by = points.groupby("run_on")["params"].agg(["min", "max"])
        spans = [f"{how}, {lo:,.0f}–{hi:,.0f} parameters" for how, (lo, hi) in by.iterrows()]
        return " Run on: " + "; ".join(spans) + "."
    studies = ", ".join(f"{d}: `{s}`" for d, s in points[["device", "study"]].drop_duplicates().to_numpy())
    at_T = points[points["series"].str.startswith(f"n = {T} ")]
    both = at_T.groupby(["params", "steps"]).filter(lambda g: g["device"].nunique() > 1)
    bridges = [
        f"{int(p):,} parameters: "
        + ", ".join(f"{r.device} {r.mean:+.3f} ({int(r.n)} seeds)" for r in g.sort_values("device").itertuples())
        for p, g in both.groupby("params")
    ]
    how = ", ".join(dict.fromkeys(points["run_on"])) if "run_on" in points else ""
    note = f" Markers by device ({studies}; GPU hollow{'; ' + how if how else ''})."
    return note + (f" Run on both devices (the bridge), at n = T: {'; '.join(bridges)}." if bridges else "")


LADDER_PAD = 0.06  # of the y span, beyond the lowest and highest CI bound: a bound never sits on the plot's frame
LADDER_X_PAD = 1.25  # a factor beyond the smallest and largest model: the end rungs' CIs drawn whole, off the frame
LADDER_HEAD_PX = 24  # the plot's top band (px), above every point and CI: the paper's size is marked there, beside the
# data (a rule at 19M ran through the 19M rung's points and intervals)


def ladder_domains(points: pd.DataFrame, reference_params: float) -> tuple:
    """ladder_chart's x (parameters, log) and y domains: every rung, the paper's mark and every CI bound inside,
    with room beyond (LADDER_X_PAD, LADDER_PAD), 0 (the zero rule) on the y axis, and above it all a band of
    LADDER_HEAD_PX that no point reaches (the paper's mark); Undefined for no points."""
    values = pd.concat([pd.to_numeric(points[c], errors="coerce") for c in ("ci_low", "ci_high", "mean")])
    values = values[values.abs() != float("inf")].dropna()
    params = pd.to_numeric(points["params"], errors="coerce").dropna()
    if values.empty or params.empty:
        return alt.Undefined, alt.Undefined
    lo, hi = min(0.0, float(values.min())), max(0.0, float(values.max()))
    pad = LADDER_PAD * ((hi - lo) or 1.0)
    x = [
        min(float(params.min()), reference_params) / LADDER_X_PAD,
        max(float(params.max()), reference_params) * LADDER_X_PAD,
    ]
    bottom, top = lo - pad, hi + pad
    return x, [bottom, top + (top - bottom) * LADDER_HEAD_PX / (HEIGHT - LADDER_HEAD_PX)]


@memoized()
def ladder_chart(
    points: pd.DataFrame, reference_params: float, y_title: str = "accuracy lost to the surgery (norm − norm→none)"
) -> alt.LayerChart:
    """E5's ladder: the surgery's damage (mean with its 95% CI over seeds) against parameters on a log axis, one
    colour per n (points: series, params, mean, ci_low, ci_high, n, steps), a longer training drawn as a square,
    the zero line and the paper's model size marked (▼) in a band above every point, never across the data; a legend
    of one entry (one n, one training length) is left out. Points from two devices (a `device` column, CPU and GPU:
    the CPU study's ladder and the GPU study's) are told apart by their marker (shape legend `device · training
    steps`; the GPU's hollow and larger, so a rung run on both, the bridge, shows both); y_title: another quantity
    per rung (the rescale surgery's recovery)."""
    devices = sorted(points["device"].unique()) if "device" in points and len(points) else []
    if len(devices) > 1:
        marker = [f"{d} · {int(s):,} steps" for d, s in zip(points["device"], points["steps"], strict=True)]
        points = points.assign(marker=marker)
        domain = sorted(
            set(marker), key=lambda m: (m.split(" · ")[0], int(m.split(" · ")[1].split()[0].replace(",", "")))
        )
        shapes = {"CPU": ["circle", "square", "cross"], "GPU": ["triangle-up", "diamond", "triangle-down"]}
        rank = {d: [m for m in domain if m.startswith(d)] for d in devices}
        scale = alt.Scale(
            domain=domain,
            range=[shapes.get(m.split(" · ")[0], ["circle"] * 3)[rank[m.split(" · ")[0]].index(m) % 3] for m in domain],
        )
        shape = alt.Shape("marker:N", title="device · training steps", scale=scale, legend=alt.Legend(orient="bottom"))
    else:  # a legend of one entry says nothing the caption does not: none (every rung trained alike)
        points = points.assign(marker=points["steps"]) if len(points) else points.assign(marker=[])
        one = points["steps"].nunique() < 2
        shape = alt.Shape("steps:N", title="training steps", legend=None if one else alt.Legend(orient="bottom"))
    x_domain, y_domain = ladder_domains(points, reference_params)
    x = alt.X(
        "params:Q",
        title="parameters (log scale)",
        scale=alt.Scale(type="log", domain=x_domain, nice=False),
        axis=alt.Axis(format="~s", labelOverlap=True),
    )  # 20k, 1M: the padded domain's labels never run together
    colors = color_scale(points["series"]) if len(points) else alt.Undefined
    if len(points):  # n = T before n = 3T (by n, not by the label's text), each keeping its colour
        order = sorted(range(len(colors.domain)), key=lambda i: _loop_count(colors.domain[i]))
        colors = alt.Scale(domain=[colors.domain[i] for i in order], range=[colors.range[i] for i in order])
    legend = alt.Legend(orient="bottom") if len(points) and points["series"].nunique() > 1 else None  # one n: none
    color = alt.Color("series:N", title="loop count", scale=colors, legend=legend)
    tooltip = ["series:N", alt.Tooltip("params:Q", format=","), "steps:N", alt.Tooltip("mean:Q", format="+.3f"),
               alt.Tooltip("ci_low:Q", format="+.3f"), alt.Tooltip("ci_high:Q", format="+.3f"), "n:Q"]  # fmt: skip
    tooltip += ["device:N"] if len(devices) > 1 else []
    tooltip += ["run_on:N"] if "run_on" in points else []
    base = alt.Chart(points).encode(x=x, color=color)
    # every layer's y on it: one domain, stated, never merged from the layers (nor widened: its top band is the paper's)
    y_scale = alt.Scale(domain=y_domain, nice=False)
    y = alt.Y("mean:Q", title=y_title, scale=y_scale)
    if len(devices) > 1:  # the GPU's markers hollow and larger, drawn over the CPU's filled ones
        marks = [
            base.transform_filter(alt.datum.device == d)
            .mark_point(size=90 if d == "CPU" else 170, filled=d == "CPU", strokeWidth=2)
            .encode(y=y, shape=shape, tooltip=tooltip)
            .properties(name=f"mean-{d.lower()}")
            for d in devices
        ]
    else:
        marks = [
            base.mark_point(size=90, filled=True).encode(y=y, shape=shape, tooltip=tooltip).properties(name="mean")
        ]
    paper_mark = pd.DataFrame({"params": [reference_params], "label": [f"the paper's {reference_params / 1e6:.0f}M"]})
    head = LADDER_HEAD_PX / 2  # the middle of the top band, above every point and interval
    layers = [
        alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="#666666").encode(y=alt.Y("y:Q", scale=y_scale))
        .properties(name="zero"),
        base.mark_rule(strokeWidth=2).encode(y=alt.Y("ci_low:Q", scale=y_scale), y2="ci_high:Q").properties(name="ci"),
        base.mark_line(strokeWidth=1.5, opacity=0.6).encode(y=y, detail="marker:N").properties(name="line"),
        *marks,
        alt.Chart(paper_mark).mark_point(shape="triangle-down", size=70, filled=True, color="#444444")
        .encode(x="params:Q", y=alt.value(head), tooltip=["label:N"]).properties(name="paper"),
        alt.Chart(paper_mark).mark_text(align="right", dx=-9, baseline="middle", fontSize=11, color="#444444")
        .encode(x="params:Q", y=alt.value(head), text="label:N").properties(name="paper-label"),
    ]  # fmt: skip
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, autosize=AUTOSIZE).resolve_scale(color="shared")


def loss_scale(curve: pd.DataFrame) -> str:
    """`log` where every loss is positive and finite, else `linear`: a log scale cannot place a loss of exactly 0
    (the curve collapses onto the top edge and the axis loses its ticks and title)."""
    loss = pd.to_numeric(curve["loss"], errors="coerce") if "loss" in curve else pd.Series(dtype=float)
    finite = loss[loss.notna() & (loss.abs() != float("inf"))]
    return "log" if len(finite) and bool((finite > 0).all()) else "linear"


def loss_text(loss) -> str:
    """A loss for a reader: 4 decimals, scientific notation below 1e-3 (never `0.0000` for a tiny loss)."""
    try:
        value = float(loss)
    except (TypeError, ValueError):
        return "?"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value == 0:
        return "0 exactly"  # not a rounded small loss
    return f"{value:.4f}" if abs(value) >= 1e-3 else f"{value:.2e}"


@memoized()
def finite_losses(curve: pd.DataFrame) -> tuple[pd.DataFrame, str, alt.Scale]:
    """A loss curve's finite rows (others cannot be placed on either scale), its scale's name (loss_scale) and the
    y scale that draws it."""
    loss = pd.to_numeric(curve["loss"], errors="coerce")
    curve = curve[loss.notna() & (loss.abs() != float("inf"))]
    scale = loss_scale(curve)
    return curve, scale, alt.Scale(type="log") if scale == "log" else alt.Scale(type="linear", zero=True)


def loss_chart(curve: pd.DataFrame) -> alt.Chart:
    """Training loss per step (the manifest's subsampled curve): log scale, or linear where a loss is 0
    (loss_scale); non-finite losses are dropped (they cannot be placed on either scale)."""
    curve, scale, y_scale = finite_losses(curve)
    title = f"training loss (cross-entropy, nats; {scale} scale)"
    return (
        alt.Chart(curve)
        .mark_line(color="#0072B2")
        .encode(
            x=alt.X("step:Q", title="training step"),
            y=alt.Y("loss:Q", scale=y_scale, title=title),
            tooltip=["step:Q", alt.Tooltip("loss:Q", format=".4~g")],
        )
        .properties(width=WIDTH, height=HEIGHT, name="loss", autosize=AUTOSIZE)
    )


@memoized()
def probe_loss_chart(curves: pd.DataFrame) -> alt.LayerChart:
    """The training loss of each seed of a recipe probe (data.probe_losses), coloured by candidate, one line a seed,
    on a log scale, with the loss of a model that cannot tell the two answers apart (ln 2, dotted)."""
    curves = curves.assign(seed=curves["seed"].astype(str))
    names = list(dict.fromkeys(curves["candidate"]))
    scale = alt.Scale(domain=names, range=[color_of(n, i) for i, n in enumerate(names)])
    lines = (
        alt.Chart(curves)
        .mark_line(strokeWidth=1.5)
        .encode(
            x=alt.X("step:Q", title="training step"),
            y=alt.Y("loss:Q", scale=alt.Scale(type="log"), title="training loss (cross-entropy, nats; log scale)"),
            color=alt.Color("candidate:N", scale=scale, title="candidate"),
            strokeDash=alt.StrokeDash("seed:N", title="seed"),
            detail="run_key:N",
            tooltip=["candidate:N", "seed:N", "step:Q", alt.Tooltip("loss:Q", format=".4~g")],
        )
    )
    chance = pd.DataFrame({"loss": [math.log(2)], "label": ["ln 2: the two answers equally likely"]})
    rule = alt.Chart(chance).mark_rule(strokeDash=[2, 3], color="#555").encode(y="loss:Q", tooltip=["label:N"])
    return alt.layer(lines, rule).properties(width=WIDTH, height=HEIGHT, autosize=AUTOSIZE)


@memoized()
def run_chart(rows: pd.DataFrame, T: int, y_title: str) -> alt.LayerChart:
    """One run: the metric against n, one line per difficulty (viridis), dashed for the surgery mode."""
    lines = (
        alt.Chart(rows)
        .mark_line(point=True)
        .encode(
            x=alt.X("eval_loops:Q", title=N_TITLE, axis=alt.Axis(tickMinStep=1)),
            y=alt.Y("value:Q", title=y_title, scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("difficulty:O", scale=alt.Scale(scheme="viridis"), legend=alt.Legend(orient="right")),
            # below the figure: beside the difficulties' legend (8-10 entries) it ran past the figure's height and
            # Streamlit cut it off after the first mode (issue 60, item 6)
            strokeDash=alt.StrokeDash(
                "boundary:N", title="evaluated as", legend=alt.Legend(**DASH_SYMBOL, orient="bottom")
            ),
            tooltip=["boundary:N", "difficulty:O", "eval_loops:Q", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(name="run")
    )
    layers = [lines, *_budget_layers(budget_rules(T)), *_chance_layers(CHANCE, "chance 0.5", rows["eval_loops"].max())]
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, autosize=AUTOSIZE)


def caption(
    n_seeds: Sequence[int] | int,
    methods: Sequence[str],
    chance: float | None = CHANCE,
    what: str = "",
    most: int | None = None,
    per: str = "series",
) -> str:
    """The sentence under every figure: n (seeds; n_seeds the fewest and `most` the most where points differ), the
    CI method, and the chance level."""
    n = n_seeds if isinstance(n_seeds, int) else len(set(n_seeds))
    many = f"{n}–{most} seeds" if most is not None and most != n else f"{n} seed{'s' if n != 1 else ''}"
    counts = pd.Series(list(methods)).value_counts()
    used = ", ".join(f"{m} {c}" for m, c in counts.items()) or "none"
    text = (
        f"{what}Mean over n = {many} per {per}; band: 95% bootstrap CI over seeds "
        f"(scipy BCa, percentile fallback where BCa is undefined; 'degenerate' = all seeds equal, no band). "
        f"Intervals drawn: {used}."
    )
    if n < MIN_BAND_SEEDS:
        text += f" No band where a point has fewer than {MIN_BAND_SEEDS} seeds: a bootstrap over so few means nothing."
    if chance is not None:
        text += f" Chance level {chance:g} (dotted): labels are exactly balanced."
    return text


def point_caption(stats: pd.DataFrame, chance: float | None, what: str) -> str:
    """`caption` for a figure whose points average different numbers of seeds (guarded or undamaged seeds left
    out per point): the fewest and the most, from the stats' `n`."""
    return caption(int(stats["n"].min()), stats["ci_method"], chance, what, most=int(stats["n"].max()), per="point")


# ---------------------------------------------------------------- export


@functools.lru_cache(maxsize=64)
def _export(spec: str, fmt: str) -> bytes:
    if fmt == "png":
        return vl_convert.vegalite_to_png(spec, scale=2)
    return vl_convert.vegalite_to_svg(spec).encode()


def titled(chart: alt.TopLevelMixin, title: str, subtitle: str | Sequence[str] = ()) -> alt.TopLevelMixin:
    """The chart with a title and subtitle lines, for an export that must say what it shows on its own (study,
    task, level, training distribution); on the page the headings and the caption say it."""
    lines = [subtitle] if isinstance(subtitle, str) else list(subtitle)
    return chart.properties(title=alt.TitleParams(text=title, subtitle=[s for s in lines if s] or alt.Undefined,
                                                  anchor="start", fontSize=14, subtitleFontSize=11))  # fmt: skip


def to_png(chart: alt.TopLevelMixin) -> bytes:
    return _export(chart.to_json(), "png")


def to_svg(chart: alt.TopLevelMixin) -> bytes:
    return _export(chart.to_json(), "svg")


# ---------------------------------------------------------------- E5 (beyond the paper): one builder per part, for
# the page and the report alike, from engine.experiments.e5.summarize's rows

EFFECT_NAMES = {"run": "run-mode effect R", "train": "train-mode effect M", "agreement": "agreement effect G"}


def _series(frame: pd.DataFrame, series) -> pd.DataFrame:
    columns = ["series", "eval_loops", "mean", "ci_low", "ci_high", "n", "ci_method"]
    return frame.assign(series=list(series))[columns + [c for c in ("mode",) if c in frame]]


def e5_effects(effects: pd.DataFrame, T: int) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Part 1: R, M and G against n (effects: the `effects` rows of one task, level and training distribution)."""
    stats = _series(effects, effects["quantity"].map(EFFECT_NAMES))
    chart = curves(stats, "eval_loops", N_TITLE, "effect on accuracy", budgets=budget_rules(T), y_domain=None,
                   legend_title="effect")  # fmt: skip
    return chart, stats


def e5_range(acc: pd.DataFrame, T: int) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Part 2: each model run as trained, one colour per training distribution and one dash per mode (`norm`
    solid, `none` dashed), so every distribution and mode is its own line (acc: the `accuracy` rows)."""
    acc = acc.assign(mode=acc["quantity"]).sort_values("mode", key=lambda m: m != "norm", kind="stable")  # norm solid
    stats = _series(acc, acc["train_loops"])
    chart = curves(stats, "eval_loops", N_TITLE, "accuracy", budgets=budget_rules(T), chance=CHANCE,
                   legend_title="trained with", dash="mode", dash_title="mode (run as trained)")  # fmt: skip
    return chart, stats


def e3_references(refits: pd.DataFrame, task: str, T: int) -> pd.DataFrame | None:
    """E3's refits at n = T after their last refit step, as the diamonds e5_rescale draws (x, y, label; labels short:
    their room is the margin left of T); None where there are none. refits: E3's mean recovery per target, n, step."""
    last = refits[(refits["task"] == task) & (refits["eval_loops"] == T) & refits["mean"].notna()]
    last = last[last["refit_steps"] == last["refit_steps"].max()]
    if last.empty:
        return None
    labels = [f"E3 {t}" for t in last["refit_target"]]
    return pd.DataFrame({"x": [float(T)] * len(last), "y": last["mean"].to_numpy(), "label": labels})


def e5_rescale(
    rescale: pd.DataFrame, T: int, refits: pd.DataFrame | None = None
) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Part 4: the rescale surgery's recovery against n >= T and E3's refits at n = T (refits: x, y, label) as
    diamonds beside its first point, labelled to their left, in a margin of REFIT_MARGIN steps before T that no curve
    enters (its axis ticks start at T): neither the markers nor their labels on the y axis or over the curve."""
    stats = _series(rescale, ["norm→rescale"] * len(rescale))
    x_domain = x_values = None
    if len(stats):
        first, last = min(int(stats["eval_loops"].min()), int(T)), int(stats["eval_loops"].max())
        margin = REFIT_MARGIN if refits is not None and len(refits) else 0.5
        x_domain, x_values = (first - margin, last + 0.25), list(range(first, last + 1))
    chart = curves(stats, "eval_loops", N_TITLE, "recovery", budgets=budget_rules(T), y_domain=None,
                   references=refits, legend_title="surgery", x_domain=x_domain, x_values=x_values,
                   labels_left=True)  # fmt: skip
    return chart, stats


REFIT_MARGIN = 2.5  # steps before T on part 4's x axis: room for E3's refit labels, left of their diamonds at T


# runs side by side: one colour a run, the legend under the figure, one run a line
RUN_COLOR = alt.Color("run:N", title="run", scale=alt.Scale(scheme="tableau10"),
                      legend=alt.Legend(orient="bottom", columns=1, labelLimit=420))  # fmt: skip


def compare_runs_chart(curves: pd.DataFrame, metric_title: str) -> alt.Chart:
    """Several runs' curves on one figure (data.compare_runs): the metric per n, one colour a run, solid where it
    runs as trained and dashed in another run mode (the surgery; the tooltip names it)."""
    dash = alt.Scale(domain=["as trained", "surgery"], range=[[1, 0], [5, 3]])
    return (
        alt.Chart(curves)
        .mark_line(strokeWidth=2)
        .encode(
            x=alt.X("eval_loops:Q", title="inference loop count n", axis=alt.Axis(tickMinStep=1)),
            y=alt.Y("value:Q", title=metric_title, scale=alt.Scale(zero=False)),
            color=RUN_COLOR,
            strokeDash=alt.StrokeDash(
                "mode:N",
                title="run mode",
                scale=dash,
                legend=alt.Legend(orient="bottom", columns=1, symbolType="stroke", symbolStrokeWidth=2),
            ),  # fmt: skip
            detail="curve:N",
            tooltip=[
                "run:N",
                alt.Tooltip("boundary:N", title="run mode"),
                "eval_loops:Q",
                alt.Tooltip("value:Q", format=".4f"),
            ],  # fmt: skip
        )
        .properties(width=WIDTH, height=HEIGHT, name="compare", autosize=AUTOSIZE)
    )


def compare_loss_chart(curves: pd.DataFrame) -> alt.Chart:
    """Several runs' training loss (their manifests' curves), one colour a run, on loss_scale's scale."""
    curves, scale, y_scale = finite_losses(curves)
    return (
        alt.Chart(curves)
        .mark_line()
        .encode(
            x=alt.X("step:Q", title="training step"),
            y=alt.Y("loss:Q", scale=y_scale, title=f"training loss (nats; {scale} scale)"),
            color=RUN_COLOR,
            tooltip=["run:N", "step:Q", alt.Tooltip("loss:Q", format=".4~g")],
        )
        .properties(width=WIDTH, height=HEIGHT, name="compare-loss", autosize=AUTOSIZE)
    )
