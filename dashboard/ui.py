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


READ = "_link_read"  # session key: the URL parameters the page read without a widget (dashboard/app.py names the rest)
STUDY_HELP = (
    "The tables found, largest study first; the default is the largest with an E2 table. gpu: the study at the "
    "paper's scale on a GPU (its own folder, gpu/: E2, E3 and E5's ladder and rescale surgery); cpu: the second CPU "
    "study (held-out items, docs/design.md's verdict rules); cpu-1layer: the first, an earlier design."
)
as_text = results.as_text  # a value from elsewhere (a URL, a text box, a file) in a Markdown body: text, never a link


def _ignored_link(key: str, options: Sequence, multi: bool = False) -> list[str]:
    """The values a link's URL parameter `key` gives that no option of its widget has (Streamlit drops them
    silently and shows the default), read before the widget is made; [] when the link matches or is silent."""
    given = [v for v in st.query_params.get_all(key) if v != ""]
    valid = {str(o) for o in options}
    return [v for v in (given if multi else given[:1]) if v not in valid]


def _link_notice(label: str, key: str, ignored: list[str], shown) -> None:
    """Say which link parameter was ignored and what is shown instead; kept for the session (Streamlit strips
    the bad value from the URL at once) until the reader changes the widget."""
    notes = st.session_state.setdefault("_link_notices", {})
    if ignored:
        notes[key] = (ignored, shown)
    if key not in notes:
        return
    ignored, was = notes[key]
    if was != shown:  # the reader chose something: the notice has served its purpose
        del notes[key]
        return
    values = ", ".join(f"{key}={as_text(v)}" for v in ignored)  # what the URL said, as text (not Markdown)
    what = ", ".join(map(str, shown)) if isinstance(shown, list) else shown
    st.warning(f"This link's {values} matches no {label} here: it was ignored, and **{what}** is shown instead.")


def select(label: str, options: Sequence, key: str, default=None, **kw):
    options = list(options)
    index = options.index(default) if default in options else 0
    ignored = _ignored_link(key, options)
    value = st.selectbox(label, options, index=index, key=key, bind="query-params", **kw)
    _link_notice(label, key, ignored, value)
    return value


def one_of(label: str, options: Sequence[str], key: str, default: str | None = None, **kw) -> str:
    options = list(options)
    default = default if default in options else options[0]
    ignored = _ignored_link(key, options)
    value = st.segmented_control(label, options, default=default, required=True, key=key, bind="query-params", **kw)
    _link_notice(label, key, ignored, value)
    return value


def some_of(label: str, options: Sequence[str], key: str, default: Sequence[str] | None = None, **kw) -> list[str]:
    options = list(options)
    default = [o for o in (default if default is not None else options) if o in options]
    ignored = _ignored_link(key, options, multi=True)
    value = st.pills(label, options, selection_mode="multi", default=default, key=key, bind="query-params", **kw)
    _link_notice(label, key, ignored, list(value))
    return value


def toggle(label: str, key: str, default: bool = False, **kw) -> bool:
    return st.toggle(label, value=default, key=key, bind="query-params", **kw)


def pick_study(options: Sequence[str], key: str = "preset", having: Sequence[str] | None = None) -> str | None:
    """The study (preset) to show: a selector where there are several, else the only one (or None); by default
    dashboard.results.default_study where it is among `having` (the studies that have what the page shows; all
    options unless given), else the first of them. One label and help on every page, so the selector keeps its
    value (and its URL parameter) from page to page."""
    having = list(options if having is None else having)
    default = results.default_study()
    default = default if default in having else having[0] if having else None
    if len(options) > 1:
        return select("study (preset)", options, key, default=default, help=STUDY_HELP)
    chosen = options[0] if options else None
    asked = st.query_params.get(key)
    st.session_state.setdefault(READ, set()).add(key)  # read here, not unknown (dashboard/app.py)
    if asked and asked != chosen:  # no selector to fall back on: say what the link asked for and what is shown
        shown = f"**{chosen}** is shown instead" if chosen else "nothing is shown"
        st.warning(f"This link's {key}={as_text(asked)} has no table on this page: {shown}.")
    return chosen


def pick_preset(experiment: str, key: str = "preset") -> str | None:
    """The study whose table of this experiment to show: the presets it exists at, then each study with a folder of
    its own that lacks it (the GPU study runs no E4: the page says so rather than showing another study's table)."""
    found = results.presets(experiment)
    lacking = [s for s in results.studies() if s in results.OWN_FOLDER and s not in found]
    return pick_study([*found, *lacking], key, having=found)


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


def not_run_yet(what: str, command: str | None, problems: Sequence[str] = ()) -> None:
    """The empty state: what is missing, why (if a file is damaged), and the command that makes it (None: the
    study does not run it, and `what` says so)."""
    for problem in problems:
        st.error(problem)
    if command is None:
        st.info(f"**Not part of this study.** {what}")
        return
    state = "**Needs a rerun.**" if problems else "**Not run yet.**"
    st.info(f"{state} {what} Produce it with the command below, then reload this page.")
    st.code(command, language="bash")


def export_subtitle(caption: str, width: int = 110) -> list[str]:
    """The caption's first sentence, wrapped to lines of about `width` characters (a figure's export subtitle)."""
    first = caption.split(". ")[0].rstrip(".") + "."
    lines, line = [], ""
    for word in first.split():
        if line and len(line) + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}".strip()
    return [*lines, line] if line else lines


def figure(chart: alt.TopLevelMixin, table: pd.DataFrame, name: str, caption: str, title: str | None = None) -> None:
    """A chart, its caption, and downloads: PNG and SVG (rendered on click) and the plotted data as CSV. The PNG
    and SVG carry a title (`title`: what, study, task, level; else the file name) and the caption's first
    sentence, so an exported figure says what it shows on its own."""
    from dashboard import caching, charts

    caching.keep_altair_schema_table()  # every later chart of this process is built faster
    # st.altair_chart(chart) would convert and validate the chart on every run; the spec is the same (dict(): the
    # element takes its datasets out of the top level of the dict it is given, so it gets its own)
    st.vega_lite_chart(dict(caching.vega_spec(chart)), width="stretch")
    st.caption(caption)
    heading, subtitle = title or name, export_subtitle(caption)
    png, svg, csv = st.columns(3, gap="small", width=360)
    png.download_button(
        "PNG",
        data=lambda: charts.to_png(charts.titled(chart, heading, subtitle)),
        file_name=f"{name}.png",
        mime="image/png",
        key=f"{name}-png",
        on_click="ignore",
        icon=":material/image:",
    )
    svg.download_button(
        "SVG",
        data=lambda: charts.to_svg(charts.titled(chart, heading, subtitle)),
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
