"""Inspector: one input through a trained run's loop, step by step, in every mode the run can be run in. One forward
of the chosen run's stored weights per mode (engine.core.inspector), the loaded model kept per run; every widget in
the URL, so a view is a link."""

from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import streamlit as st
import torch

from dashboard import data, inspector_chart, ui
from dashboard.ui import as_text
from engine.core import inspector, tasks
from engine.core.store import Store, weights_not_kept
from engine.experiments import e5
from engine.experiments.runs import capability_hint, load_models, machine_text
from engine.runtime import jobs

UNITS = {"parity": "bits", "chain": "hops"}
SCALES_FROM = "scalars measured in `norm` mode on training items (engine/experiments/e5.py, `loopscope run e5`)"


@st.cache_resource(max_entries=8, show_spinner=False)
def _model(root: str, key: str, state: tuple):
    """A run's model (one member, eval mode) and config, loaded once per change of its folder (state)."""
    model, cfg, _ = load_models(Store(Path(root)), [key])
    return model.eval(), cfg


@st.cache_data(max_entries=32, show_spinner=False)
def _scales(root: str, key: str, state: tuple, n: int):
    """The run's stored rescale scalars for n = 1..n, or None where it has none that reach n."""
    scales = e5.load_scales(Store(Path(root)), key, n)
    return None if scales is None else scales.tolist()


@contextmanager
def one_thread():
    """One intra-op thread for this script thread only (OpenMP's count is per thread): one item's matrices are tiny,
    and on a busy 2-core machine two threads waiting on each other took 1-19 s where one took 0.2 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@st.cache_data(max_entries=64, show_spinner=False)
def _steps(root: str, key: str, state: tuple, tokens: tuple, label: int, n: int, modes: tuple) -> pd.DataFrame:
    model, _ = _model(root, key, state)
    scales = _scales(root, key, state, n) if "rescale" in dict(modes).values() else None
    with one_thread():
        return inspector.inspect(model, torch.tensor(tokens), label, n, dict(modes), scales)


def spans(ns: list[int]) -> str:
    """1, 2, 3, 5, 7, 8 -> "1–3, 5, 7–8"."""
    out, start = [], None
    for i, n in enumerate(ns):
        start = n if start is None else start
        if i + 1 == len(ns) or ns[i + 1] != n + 1:
            out.append(f"{start}–{n}" if n > start else f"{n}")
            start = None
    return ", ".join(out)


def whole_number(key: str, label: str, low: int, high: int, default: int, help: str) -> int:
    """A number input bound to the URL; a link's value that is no whole number in [low, high] is named, not dropped
    silently (Streamlit shows the default for it)."""
    asked = st.query_params.get(key)
    if asked is not None and not (asked.strip().isdigit() and low <= int(asked) <= high):
        st.warning(f"This link's {key}={as_text(asked)} is not a whole number of {low}–{high}: it was ignored, and "
                   f"**{default}** is shown instead.")  # fmt: skip
        del st.query_params[key]
    return st.number_input(label, low, high, default, key=key, bind="query-params", help=help)


def restore_note(key: str, manifest: dict) -> tuple[str, str]:
    """How to get a weightless run's weights, in one sentence with the command and the time its group's training and
    evaluation take (engine.runtime.jobs.restore_seconds, as the Run page says it); and, where the maker's torch CPU
    capability differs from this machine's, how to match its kernels ('' otherwise)."""
    group, made = manifest.get("group"), manifest.get("machine")
    made = made if isinstance(made, dict) else {}
    seeds = len(group) if isinstance(group, list) and group else 1
    what = f"its group of {seeds} seeds" if seeds > 1 else "it"
    seconds = jobs.restore_seconds(manifest)
    if seconds:
        estimate = (f"about {data.duration(seconds)} on the machine that made it, {as_text(machine_text(made))}; "
                    "longer on a busy or slower one")  # fmt: skip
    else:
        estimate = "its manifest records no wall time to estimate from"
    note = (f"This run's weights are not kept here, so it cannot be inspected until `loopscope restore {key}` "
            f"retrains {what} ({estimate}) and keeps them where its rows come out bit for bit as stored.")  # fmt: skip
    hint = capability_hint(made).strip().removeprefix("(").removesuffix(")") if made else ""
    return note, as_text(hint[:1].upper() + hint[1:] + ".", most=300) if hint else ""


st.title("Inspector")
st.markdown(
    "One input through a trained run's loop: at every loop step n the readout's answer (the larger of the two answer "
    "logits), the most likely token over the whole vocabulary and its probability, the margin log p(right) − "
    "log p(wrong), and the state's norm before and after the boundary, in each mode the run can be run in: as "
    "trained, with the other boundary (the surgery), and with the rescale surgery where the run stores its scalars."
)
table, problems = data.runs()
looped = table[table["arch"] == "looped"] if len(table) else table
if problems:
    st.caption(f"{len(problems)} damaged run(s) left out; the Runs page names them.")
if looped.empty:
    st.info(
        f"No looped run under `{as_text(data.results_root())}` to inspect. Train one with "
        "`loopscope train --preset smoke --seeds 1`, then reload this page."
    )
    st.stop()
looped = looped.assign(kept=looped["weights"] == "kept").sort_values("kept", ascending=False, kind="stable")
kept = looped[looped["kept"]]
# the default: a norm-trained parity run (a typed input, and every surgery to compare), else any run with weights
rank = (kept["task"] != "parity").astype(int) * 2 + (kept["trained boundary"] != "norm").astype(int)
first = kept.assign(rank=rank).sort_values("rank", kind="stable")
labels = {  # plain text (a manifest's values are data): shown through as_text
    r.run: f"{r.folder + ' · ' if r.folder == jobs.WORKBENCH else ''}{r.study + ' · ' if r.study else ''}"
    f"{r.experiment} · {r.task} · trained {r['trained boundary']} · "
    f"seed {r.seed}" + ("" if r.kept else " · no weights")
    for _, r in looped.iterrows()
}
left, mid, right = st.columns([5, 2, 3])
with left:
    run = ui.select(
        "run", list(labels), "run", default=first["run"].iloc[0] if len(first) else None,
        help=f"The looped runs, those with weights first ({len(kept)} of {len(looped)}; the Runs page lists them all). "
        "A run key, `<study>/<key>` for a run in a study's own folder.",
    )  # fmt: skip
folder, _, key = run.rpartition("/")
root = data.run_stores().get(folder, data.results_root())
manifest, _, problem = data.run_detail(run)
if problem:
    st.error(f"{as_text(problem, most=300)}. `loopscope train` with its config redoes it.")
    st.stop()
st.markdown(f"`{run}`: {as_text(labels[run], most=200)}")
if weights_not_kept(manifest) is not None:
    note, hint = restore_note(key, manifest)
    st.info(note)
    if hint:
        st.caption(hint)
    st.stop()

state = data.files_state(root / "runs" / key)
model, cfg = _model(str(root), key, state)
task, T = cfg.task, cfg.model.trained_loops
try:
    cap = jobs.caps()["max_loops"]
except jobs.Refused as e:  # a cap that is not a number: run nothing rather than guess one
    st.error(str(e))
    st.stop()
with mid:
    n_max = whole_number("n", "loop steps N", 1, cap, min(cfg.max_eval_loops, cap),
                         f"n = 1..N in one forward per mode (up to {cap}); T = {T} is the trained budget.")  # fmt: skip
with right:
    if task.name == "parity":
        default = "".join(map(str, tasks.eval_set(task, max(task.train_difficulties)).tokens[0, :-1].tolist()))
        text = st.text_input(
            "input bits", default, key="bits", bind="query-params",
            help=f"A parity string of {inspector.span(inspector.lengths(task))} bits (the run's trained and evaluated "
            f"lengths); the default is the first held-out evaluation item at {max(task.train_difficulties)} bits.",
        )  # fmt: skip
    else:
        hops = ui.select("hops k", [str(k) for k in task.eval_difficulties], "hops", default=str(T),
                         help="The chain's difficulty: hops from the root to the queried variable.")  # fmt: skip
        item = whole_number("item", "evaluation item", 0, task.eval_examples - 1, 0,
                            f"One of the run's {task.eval_examples} fixed evaluation items at k hops.")  # fmt: skip
try:
    tokens, label = (
        inspector.parity_input(text, task) if task.name == "parity" else inspector.eval_item(task, int(hops), item)
    )
except inspector.BadInput as e:  # names what is wrong, never echoes the text
    st.error(str(e))
    st.stop()

has_scales = cfg.model.boundary == "norm" and _scales(str(root), key, state, int(n_max)) is not None
supported = inspector.run_modes(cfg.model.boundary, has_scales)
left, right = st.columns([3, 2])
with left:
    modes = ui.some_of("run modes", list(supported), "modes", help="As trained, the other boundary (the surgery), "
                       f"and for a norm-trained run the rescale surgery with its stored {SCALES_FROM}.")  # fmt: skip
with right:
    quantity = ui.one_of("figure", list(inspector_chart.QUANTITIES), "show")
if cfg.model.boundary == "norm" and not has_scales:
    st.caption(f"No `norm->rescale`: this run stores no rescale scalars that reach n = {n_max}.")
if not modes:
    st.info("Pick at least one run mode.")
    st.stop()

st.markdown(
    f"**Input** `{tasks.describe(tokens)}` · right answer **{label}** · {inspector.origin(task, tokens)}. "
    f"Model: {cfg.model.n_params:,} parameters, trained budget T = {T}, trained with loop counts "
    f"`{cfg.train_loops}`, {task.name} at {inspector.span(inspector.lengths(task))} {UNITS[task.name]}."
)
picked = tuple((m, supported[m]) for m in modes)
rows = _steps(str(root), key, state, tuple(tokens.tolist()), label, int(n_max), picked)
for mode, steps in rows.groupby("mode", sort=False):
    right_at, wrong_at = steps.loc[steps["correct"], "n"].tolist(), steps.loc[~steps["correct"], "n"].tolist()
    said = f"right at n = {spans(right_at)}; wrong at n = {spans(wrong_at)}" if right_at and wrong_at else None
    st.markdown(f"- `{mode}`: {said or ('right' if right_at else 'wrong') + f' at every n = 1–{n_max}'}")

export = rows.assign(run_key=key, input=tasks.describe(tokens), right_answer=label)
chart = inspector_chart.steps_chart(rows, quantity, T)
caption = (
    f"One input, one seed: {quantity} per loop step n, one forward of N = {n_max} steps per mode. A circle where the "
    "answer (the larger of the two answer logits) is right, a cross where it is wrong; the dashed grey rule is the "
    "trained budget T" + ("; the dotted rule is margin 0, where the answer turns." if quantity == "margin" else ".")
)
ui.figure(chart, export, f"inspect-{key}-{quantity.replace(' ', '-')}", caption,
          title=f"Inspector · {labels[run]} · {tasks.describe(tokens)}")  # fmt: skip
st.dataframe(
    rows,
    hide_index=True,
    width="stretch",
    column_config={
        "top_token": st.column_config.TextColumn("top token"),
        "top_share": st.column_config.NumberColumn("top share", format="%.3f"),
        "margin": st.column_config.NumberColumn(format="%.3f"),
        "norm_pre": st.column_config.NumberColumn("norm before", format="%.3f"),
        "norm_post": st.column_config.NumberColumn("norm after", format="%.3f"),
    },
)
