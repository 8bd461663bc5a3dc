"""Every cached run with its provenance and study, and every stored E3 refit with the run it refits; runs side by
side (curves, losses, config differences); one run's curves (accuracy per n and difficulty, training loss)."""

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui, views
from engine.core.store import how_to_get_weights, weights_not_kept
from engine.runtime import jobs
from engine.runtime.settings import redact, shown_path


def commit_text(provenance: dict) -> str:
    """A manifest's (or a rows_added entry's) commit, marked where the tree was dirty."""
    return f"`{provenance.get('git_commit', '?')}`{' (dirty)' if provenance.get('git_dirty') else ''}"


def shown(value) -> str:
    """A manifest's value for a reader: data.MISSING where it gives none (never "None" or "nan")."""
    return data.MISSING if value is None or value == "" or value != value else str(value)


def readable(table: pd.DataFrame) -> pd.DataFrame:
    """The runs table as the page shows it: every missing value data.MISSING (never "None"), a group's wall time on
    its first seed only (the others: MISSING); the final loss is data.loss_shown's text already."""
    out = table.copy()
    out["group wall (s)"] = [data.MISSING if w != w or w is None else f"{w:,.0f}" for w in out["group wall (s)"]]
    for column in out.columns:  # only where one is missing: a whole numeric column keeps its numbers (and its sort)
        if any(shown(v) == data.MISSING for v in out[column]):
            out[column] = [shown(v) for v in out[column]]
    return out


st.title("Cached runs")
table, problems = data.runs()
for problem in problems:
    st.warning(f"Skipped a damaged run: {redact(problem)}. `loopscope train` with its config redoes it.")
if table.empty:
    st.info(
        f"No runs under `{shown_path(data.results_root())}` yet. Train a few with "
        "`loopscope train --preset smoke --seeds 2`, then reload this page."
    )
    st.stop()

# where a run is listed: its study (a study's own folder, or the study whose tables hold it), the workbench's copies
# apart (jobs.WORKBENCH: the Run page links there by that name); a results-folder run in no table: "results folder"
source = [jobs.WORKBENCH if f == jobs.WORKBENCH else s or ("results folder" if not f else f)
          for f, s in zip(table["folder"], table["study"], strict=True)]  # fmt: skip
names = list(dict.fromkeys(source))
if len(names) > 1:
    chosen = ui.some_of("runs of", names, "studies", help="Each study's runs (its own folder's, or the results "
                        "folder's runs that its tables hold) and the workbench's, where jobs started from the "
                        "dashboard write (the GPU study reruns a CPU config, the bridge rung, under the same run "
                        "key).")  # fmt: skip
    table = table[[s in chosen for s in source]]
experiments = sorted(e for e in table["experiment"].unique() if e)
if len(experiments) > 1:
    chosen = ui.some_of("experiments", experiments, "experiments")
    table = table[table["experiment"].isin(chosen)]
own = [f for f in dict.fromkeys(table["folder"]) if f]  # the stores besides the results folder that hold runs
where = f"`{shown_path(data.results_root())}`" + (f" ({', '.join(f'`{f}/`' for f in own)} included)" if own else "")
st.caption(
    f"{len(table)} runs under {where}: provenance from each run's manifest.json; `study` is the study whose folder or "
    f"tables hold the run, `{data.MISSING}` where a manifest gives no value (the group's wall time is on its first "
    "seed only: the seeds of a group train together as one batched model)."
)
HELP = {
    "study": "The study whose folder holds the run, or whose tables in the results folder hold its rows.",
    "final loss": "The last training step's loss. 0 exactly: fp32 rounds every answer's probability to 1 (the loss "
    f"curve reaches 0); {data.MISSING}: none was measured.",
    "group wall (s)": "The wall time of the group of seeds trained together as one batched model, on its first seed.",
}
st.dataframe(
    readable(table.drop(columns=["run", "folder"])), hide_index=True, width="stretch",
    column_config={name: st.column_config.TextColumn(name, help=text) for name, text in HELP.items()},
)  # fmt: skip
if table.empty:
    st.stop()

labels = {
    r.run: f"{r.folder + ' · ' if r.folder == jobs.WORKBENCH else ''}{r.study + ' · ' if r.study else ''}{r.task} · "
    f"{r.arch} · {r['trained boundary']} · seed {r.seed}"
    for _, r in table.iterrows()
}

st.header("Runs side by side")
# by default the first run listed and its twin trained with the other boundary (same study, task, arch and seed):
# the paper's comparison, with data from the first visit; else the first two listed
head = table.iloc[0]
twin = table[(table["folder"] == head["folder"]) & (table["task"] == head["task"]) & (table["arch"] == head["arch"])
             & (table["seed"] == head["seed"]) & (table["trained boundary"] != head["trained boundary"])]  # fmt: skip
first = [head["run"], twin["run"].iloc[0]] if len(twin) else list(labels)[:2]
picked = st.multiselect("compare", list(labels), default=first, format_func=lambda r: f"{r} · {labels[r]}",
                        max_selections=6, key="compare",
                        help="Up to six runs: their curves on one figure, their training losses, and the config "
                        "fields in which they differ.")  # fmt: skip
if picked:
    compare_metric = st.segmented_control("compare metric", ["accuracy", "choice_accuracy", "top_token_share"],
                                          default="accuracy", key="compare_metric") or "accuracy"  # fmt: skip
    curves, losses, differ = data.compare_runs({r: f"{r.rpartition('/')[2][:8]} · {labels[r]}" for r in picked},
                                               compare_metric)  # fmt: skip
    left, right = st.columns(2)
    with left:
        if len(curves):
            ui.figure(charts.compare_runs_chart(curves, views.METRIC_TITLES[compare_metric]), curves,
                      "compare-runs", f"{compare_metric.replace('_', ' ')} per n at the held-out mean (every "
                      "difficulty where a run has no held-out items), one seed each, no CI; solid: each run as "
                      "trained, dashed: the other run modes it was evaluated in (the tooltip names each).")  # fmt: skip
    with right:
        if len(losses):
            ui.figure(charts.compare_loss_chart(losses), losses, "compare-loss",
                      "Training loss from each manifest's curve (subsampled), one seed each.")  # fmt: skip
    if len(differ):
        st.caption("Where their configs differ (every other field is the same):")
        st.dataframe(differ, hide_index=True)
    elif len(picked) > 1:
        st.caption("Their configs are the same in every field, the seed included.")

refits, refit_problems = data.refits()
for problem in refit_problems:
    st.warning(f"Skipped a damaged refit: {redact(problem)}. `loopscope run e3` with its study redoes it.")
if len(refits):
    st.header("Refits")
    st.caption(
        "A refit (E3, the Readout refit page) retrains the readout, and a layer, of one run's model run without the "
        "norm: `refits run` is the run it starts from, in the table above (pick it under One run below); its final "
        f"loss is per target, `{data.MISSING}` where none was measured."
    )
    with st.expander(f"E3 refits: {len(refits)} stored, each with the run it refits", icon=":material/tune:"):
        st.dataframe(refits.map(shown), hide_index=True, width="stretch")
        st.page_link(Path(__file__).parent / "refit.py", label="Their curves and verdicts: Readout refit (E3)",
                     icon=":material/arrow_forward:")  # fmt: skip

st.header("One run")
key = ui.select(
    "run", list(labels), "run", help="The run key (a hash of the config and seed), `<study>/<key>` for a run in a "
    "study's own folder; see the table above."
)  # fmt: skip
st.markdown(f"`{key}`: {labels[key]}")
folder, _, run_key = key.rpartition("/")  # folder: the study's own folder it is in ("": the results folder)
if folder == jobs.WORKBENCH:
    st.caption(
        f"The workbench's copy of run `{run_key}`: what jobs started from the dashboard added to it is here, not in "
        "the published run, its study's tables or its verdicts (the Run page, Workbench)."
    )
manifest, rows, problem = data.run_detail(key)
if problem:
    st.error(f"{redact(problem)}. `loopscope train` with its config redoes it.")
    st.stop()

cfg = manifest.get("config", {})
model, train = cfg.get("model", {}), cfg.get("train", {})
facts = st.columns(4)
wall = manifest.get("wall_time_s")
facts[0].metric("trained budget T", shown(model.get("trained_loops")))
facts[1].metric("steps", shown(manifest.get("steps")))
facts[2].metric("final loss", data.loss_shown(manifest.get("final_loss"), manifest.get("loss_curve")),
                help="Exactly 0 where the loss curve reaches it: fp32 rounds each answer's chance to 1.")  # fmt: skip
facts[3].metric(
    "wall time",
    f"{wall:.1f} s" if isinstance(wall, int | float) else data.MISSING,
    help=f"Of the group of seeds {shown(manifest.get('group'))} trained together as one batched model.",
)
st.caption(
    f"width {shown(model.get('d_model'))}, {shown(model.get('layers_per_block'))} layer(s) per block, "
    f"{shown(model.get('n_heads'))} heads, trained boundary `{shown(model.get('boundary'))}`; batch "
    f"{shown(train.get('batch_size'))}, lr {shown(train.get('lr'))}; commit {commit_text(manifest)}, "
    f"{shown(manifest.get('device'))}, created {shown(manifest.get('created'))}"
)
gpu = data.gpu_facts(manifest)
if gpu:  # a GPU run: what its rounding rests on (engine.core.store.gpu_info) and how it trained
    st.markdown("**GPU provenance**  \n" + "  \n".join(f"{what}: `{value}`" for what, value in gpu))
for added in manifest.get("rows_added", []):  # evaluations added after training, each from its own commit
    st.caption(
        f"rows added {added.get('created', '?')}: {', '.join(f'`{b}`' for b in added.get('boundaries', []))} "
        f"({added.get('experiment') or '?'}), commit {commit_text(added)}"
    )

metric = ui.select("metric", ["accuracy", "choice_accuracy", "top_token_share"], "metric")
curves_col, loss_col = st.columns(2)
with curves_col:
    st.subheader(f"{metric.replace('_', ' ')} per n, by difficulty")
    picked = rows[rows["metric"] == metric].sort_values(["boundary", "difficulty", "eval_loops"])
    if picked.empty:
        st.info(f"This run has no `{metric}` rows.")
    else:
        chart = charts.run_chart(picked, int(model.get("trained_loops", 1)), views.METRIC_TITLES[metric])
        caption = (
            "One seed, no CI. Solid: evaluated in the trained mode; dashed and dotted: the surgeries (the legend "
            "below names each mode). "
            f"Chance level {charts.CHANCE:g} (dotted) for accuracy: labels are exactly balanced."
        )
        ui.figure(chart, picked, f"run-{run_key}-{metric}", caption)
with loss_col:
    st.subheader("Training loss")
    curve = data.loss_curve(manifest)
    if curve.empty:
        st.info("The manifest holds no loss curve.")
    else:
        scale = charts.loss_scale(curve)
        caption = f"Subsampled every {max(1, int(manifest.get('steps') or 1) // 100)} steps; one seed; {scale} scale"
        caption += "." if scale == "log" else " (a loss of exactly 0 has no place on a log scale)."
        ui.figure(charts.loss_chart(curve), curve, f"run-{run_key}-loss", caption)

why_no_weights = weights_not_kept(manifest)
if why_no_weights is not None:  # a state, not damage: the rows above are complete
    seconds = jobs.restore_seconds(manifest)
    took = f" (`loopscope restore` takes about {data.duration(seconds)} on the machine that made it)"
    st.info(f"This run's weights are not kept here ({redact(str(why_no_weights))}), so it cannot be evaluated "
            f"further; {how_to_get_weights(run_key)}{took if seconds else ''}.")  # fmt: skip
elif not jobs.read_only() and folder in ("", jobs.WORKBENCH):  # jobs read these; they write into the workbench
    with st.expander("Evaluate at more loop counts", icon=":material/add_chart:"):
        have, cap = int(rows["eval_loops"].max()) if len(rows) else 0, jobs.caps()["max_loops"]
        left, right = st.columns(2)
        loops = left.number_input("evaluate at n = 1..", 1, cap, max(1, min(2 * have, cap)), key="more_loops")
        mode = right.selectbox("run in mode", ["trained", "norm", "none"], key="more_mode")
        st.caption(
            f"Evaluated so far at n = 1..{have}. A background job loads this run's weights (no retraining) and "
            "evaluates a copy of the run in the workbench: the published run and tables stay as they are."
        )
        if st.button("Evaluate", key="more_submit", icon=":material/play_arrow:"):
            spec = jobs.EvalSpec(run_key, int(loops), None if mode == "trained" else mode)
            try:
                job = jobs.submit(spec, data.results_root())
                st.success(f"Job `{job}` submitted; the Run page shows its progress, its results the workbench.")
                st.page_link(
                    Path(__file__).parent / "run.py", label="Open the Run page", icon=":material/arrow_forward:"
                )
            except (jobs.Refused, ValueError) as e:
                st.error(str(e))

with st.expander("manifest.json"):
    st.code(json.dumps(manifest, indent=2, sort_keys=True), language="json")
