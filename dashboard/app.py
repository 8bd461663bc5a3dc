"""loopscope dashboard: `loopscope dashboard` (or `streamlit run dashboard/app.py`)."""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `streamlit run` from a checkout

from dashboard.results import presets, results_root  # noqa: E402  (after the path fix above)
from dashboard.ui import READ  # noqa: E402
from engine.runtime import settings  # noqa: E402  (torch-free: the first page imports nothing heavy)

PAGES = Path(__file__).resolve().parent / "app_pages"  # absolute: streamlit_app.py runs this file from the root

# the tab icon as an emoji: Streamlit draws it as an inline SVG, where `:material/...:` makes every page fetch it
# from fonts.gstatic.com (the Material Symbols font itself ships with Streamlit: the other icons stay local)
st.set_page_config(page_title="loopscope", page_icon="🔁", layout="wide")
# No full garbage collection after every script run (Streamlit's default, `runner.postScriptGC`): with torch, pandas
# and Altair loaded it walks every object of the process, about 0.2 s of server CPU per page view, most of a repeat
# view's cost. Python's own generational collector still runs; reference counting frees a page's frames at once.
st.config.set_option("runner.postScriptGC", False)
# No motion: Streamlit animates its running indicator, skeletons and fades, and a visitor's browser repaints them
# at 60 frames a second for as long as a page waits for the server (software-rasterised where there is no GPU);
# still, a results viewer shows the same. First on every page, so it arrives with the first message of a run.
# A chart's own toolbar (Streamlit's, on hover) offers "Download as PNG": an untitled copy beside each figure's
# titled PNG/SVG export (dashboard.ui.figure). st.vega_lite_chart has no option to leave it out (its embed options
# take theme, renderer and padding; vega-embed's actions are already off), so the button is hidden here.
# (Two rules: the button itself, and its slot in the toolbar where the browser knows :has.)
CHART_PNG_BUTTON = 'button[aria-label^="Download as PNG"]'
st.html(
    "<style>*, *::before, *::after { animation: none !important; transition: none !important; }"
    "[data-testid=stMainBlockContainer] { padding-top: 2.5rem; }"
    f"[data-testid=stElementToolbar] {CHART_PNG_BUTTON} {{ display: none !important; }}"
    f"[data-testid=stElementToolbarButton]:has({CHART_PNG_BUTTON}) {{ display: none !important; }}</style>"
)  # the first screen for the results
settings.adopt_settings(st.secrets)  # read_only and the caps may come from st.secrets (Community Cloud)
address = st.config.get_option("server.address")  # None: every interface, unless this is AppTest (no server)
testing = st.config.get_option("global.appTest")  # st.config's: AppTest patches that one, not st.get_option
exposed = None if address is None and testing else settings.guard_address(address)
pages = {
    "Results": [
        st.Page(PAGES / "overview.py", title="Overview", icon=":material/fact_check:", default=True),
        st.Page(PAGES / "accuracy.py", title="Accuracy vs depth", icon=":material/show_chart:"),
        st.Page(PAGES / "norms.py", title="Norm trajectories", icon=":material/stacked_line_chart:"),
        st.Page(PAGES / "refit.py", title="Readout refit (E3)", icon=":material/tune:"),
        st.Page(PAGES / "stacked.py", title="Looped vs stacked (E4)", icon=":material/layers:"),
        st.Page(PAGES / "ouro.py", title="Ouro (E1)", icon=":material/public:"),
    ],
    "Provenance": [st.Page(PAGES / "runs.py", title="Runs", icon=":material/table:")],
    "Inside a run": [st.Page(PAGES / "inspector.py", title="Inspector", icon=":material/troubleshoot:")],
    "Live": [st.Page(PAGES / "run.py", title="Run", icon=":material/play_circle:")],
}
if presets("e5"):  # a page appears with its data: E5 is run by name, after the paper's experiments
    pages["Beyond the paper"] = [st.Page(PAGES / "agreement.py", title="Agreement (E5)", icon=":material/join_inner:")]
page = st.navigation(pages)
if settings.read_only():  # a read-only copy names no server folder
    st.sidebar.caption(f"Results: `{settings.shown_path(results_root().resolve())}`.")
else:
    st.sidebar.caption(f"Results folder: `{results_root()}` (set `LOOPSCOPE_RESULTS` to change it).")
try:
    settings.read_only_setting()
except settings.Refused as e:  # an unclear LOOPSCOPE_READ_ONLY: say so on every page, which all behave read-only
    st.error(str(e))
if settings.read_only():
    st.sidebar.caption(exposed or "Read-only: this copy shows results and runs nothing.")
    st.set_option("client.showErrorDetails", "type")  # an error outside page.run() (a callback, a fragment): no trace
notice = st.empty()  # above the page: a link's parameters that name nothing on it (filled after it runs)
asked = list(st.query_params)
st.session_state[READ] = set()  # parameters a page reads without a widget (ui.pick_study with one study)
try:
    page.run()
    read = st.session_state[READ]
    unknown = [k for k in asked if k in st.query_params and k not in st.session_state and k not in read]
    if unknown:  # a bad value of a known parameter is named by its widget (ui._link_notice); an unknown one here
        from dashboard.ui import as_text

        named = ", ".join(f"{as_text(k)}={as_text(st.query_params.get(k, ''))}" for k in unknown)
        notice.warning(f"This link's {named} names nothing on this page: ignored.")
except Exception as e:  # last resort: a message, never a traceback (Streamlit's rerun/stop are BaseExceptions)
    st.error(
        f"This page could not be drawn ({type(e).__name__}: {settings.redact(str(e))}). The results may be from "
        "another version; `loopscope list` shows what is cached."
    )
