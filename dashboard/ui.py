"""Streamlit pieces shared by the pages: URL-bound widgets, figures with their downloads, empty states.

Every widget is bound to the URL (`bind="query-params"`, the key is the parameter's name), so each
view is a link. Option values are plain text and double as their URL form (no format_func: a bound
selectbox writes the displayed label into the URL).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import streamlit as st

from dashboard import results

if TYPE_CHECKING:  # the overview imports this module: nothing heavy on its way (charts imports Altair)
    import altair as alt
    import pandas as pd

    from dashboard import data


STUDY_HELP = (
    "The tables found, largest study first. cpu: the second CPU study (held-out items, the README's verdict rules); "
    "cpu-1layer: the first, an earlier design."
)


def select(label: str, options: Sequence, key: str, default=None, **kw):
    options = list(options)
    index = options.index(default) if default in options else 0
    return st.selectbox(label, options, index=index, key=key, bind="query-params", **kw)


def one_of(label: str, options: Sequence[str], key: str, default: str | None = None, **kw) -> str:
    options = list(options)
    default = default if default in options else options[0]
    return st.segmented_control(label, options, default=default, required=True, key=key, bind="query-params", **kw)


def some_of(label: str, options: Sequence[str], key: str, default: Sequence[str] | None = None, **kw) -> list[str]:
    options = list(options)
    default = [o for o in (default if default is not None else options) if o in options]
    return st.pills(label, options, selection_mode="multi", default=default, key=key, bind="query-params", **kw)


def toggle(label: str, key: str, default: bool = False, **kw) -> bool:
    return st.toggle(label, value=default, key=key, bind="query-params", **kw)


def pick_study(options: Sequence[str], key: str = "preset") -> str | None:
    """The study (preset) to show: a selector where there are several, else the only one (or None). One label
    and help on every page, so the selector keeps its value (and its URL parameter) from page to page."""
    if len(options) > 1:
        return select("study (preset)", options, key, help=STUDY_HELP)
    return options[0] if options else None


def pick_preset(experiment: str, key: str = "preset") -> str | None:
    """The study whose table of this experiment to show (pick_study over the presets it exists at)."""
    return pick_study(results.presets(experiment), key)


def compare_root_widget() -> str:
    """The other results folder to compare with, bound to the URL (`vs_root`); empty: this folder. A read-only
    copy offers only the folders listed in LOOPSCOPE_COMPARE."""
    from engine.runtime import jobs

    listed = [p for p in os.environ.get("LOOPSCOPE_COMPARE", "").split(os.pathsep) if p]
    if jobs.read_only():
        return select("other results folder", ["", *listed], "vs_root", help="LOOPSCOPE_COMPARE's folders.") or ""
    return st.text_input(
        "other results folder (empty: this one)",
        key="vs_root",
        bind="query-params",
        placeholder=str(results.results_root()),
        help="A folder with `e*-<preset>.parquet` tables, e.g. one `loopscope pull` fetched.",
    )


def scale_note(table: data.Table) -> str:
    seeds = table.seeds
    span = f"seeds {seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}" if seeds else "no seeds"
    count = f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"
    return f"`{table.experiment}-{table.preset}.parquet`: **{table.preset}** preset, {count} ({span})"


def not_run_yet(what: str, command: str, problems: Sequence[str] = ()) -> None:
    """The empty state: what is missing, why (if a file is damaged), and the command that makes it."""
    for problem in problems:
        st.error(problem)
    state = "**Needs a rerun.**" if problems else "**Not run yet.**"
    st.info(f"{state} {what} Produce it with the command below, then reload this page.")
    st.code(command, language="bash")


def figure(chart: alt.TopLevelMixin, table: pd.DataFrame, name: str, caption: str) -> None:
    """A chart, its caption, and downloads: PNG and SVG (rendered on click) and the plotted data as CSV."""
    from dashboard import charts

    st.altair_chart(chart, width="stretch")
    st.caption(caption)
    png, svg, csv = st.columns(3, gap="small", width=360)
    png.download_button(
        "PNG",
        data=lambda: charts.to_png(chart),
        file_name=f"{name}.png",
        mime="image/png",
        key=f"{name}-png",
        on_click="ignore",
        icon=":material/image:",
    )
    svg.download_button(
        "SVG",
        data=lambda: charts.to_svg(chart),
        file_name=f"{name}.svg",
        mime="image/svg+xml",
        key=f"{name}-svg",
        on_click="ignore",
        icon=":material/draw:",
    )
    csv.download_button(
        "CSV",
        data=table.to_csv(index=False),
        file_name=f"{name}.csv",
        mime="text/csv",
        key=f"{name}-csv",
        on_click="ignore",
        icon=":material/table:",
    )
