"""Streamlit pieces shared by the pages: URL-bound widgets, figures with their downloads, empty states.

Every widget is bound to the URL (`bind="query-params"`, the key is the parameter's name), so each
view is a link. Option values are plain text and double as their URL form (no format_func: a bound
selectbox writes the displayed label into the URL).
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import charts, data


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


def pick_preset(experiment: str, key: str = "preset") -> str | None:
    """The scale to show: a selector where several presets exist, else the only one (or None)."""
    options = data.presets(experiment)
    if len(options) > 1:
        return select("scale (preset)", options, key, help="Tables found for this experiment; largest scale first.")
    return options[0] if options else None


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
