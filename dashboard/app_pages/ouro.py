"""E1: the released Ouro weights with and without the boundary norm (or, until then, the paper's figures)."""

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui, views
from engine import paper

COMMAND = "loopscope ouro --model ByteDance/Ouro-1.4B ..."
T_OURO = paper.TRAINED_LOOPS_OURO
PAPER_MARKS = pd.DataFrame(  # reported in the paper: references, never measurements
    {
        "x": [T_OURO, None],
        "y": [paper.SURGERY_ACCURACY_AT_T, charts.CHANCE],
        "label": [
            f"paper: Ouro-1.4B and Ouro-2.6B without the norm, {paper.SURGERY_ACCURACY_AT_T:.3f} at n = T = {T_OURO}",
            "chance 0.5 (balanced labels)",
        ],
    }
)

st.title("Ouro (E1)")
st.markdown(
    "The released Ouro-1.4B and Ouro-2.6B (trained budget T = 4) on balanced binary prompt tasks, in both "
    "boundary modes, n = 1..8. Paper: removing the norm takes both models to "
    f"**{paper.SURGERY_ACCURACY_AT_T:.3f}** accuracy by n = T, the state norm stays "
    f"**within {paper.SURGERY_NORM_RATIO}×**, and the head commits to one token."
)

preset = ui.pick_preset("e1", key="model")
table = data.table("e1", preset) if preset else None
if table is None or table.rows is None:
    for problem in table.problems if table else []:
        st.error(problem)
    st.warning(
        "**Demonstration placeholder — nothing on this page is a measurement.** E1 has not been run here "
        "(the released weights cannot be downloaded on this machine). The marks below are the figures the "
        "paper reports, drawn as labelled references. Run E1 where the weights are available:"
    )
    st.code(COMMAND, language="bash")
    empty = pd.DataFrame(columns=["series", "eval_loops", "mean", "ci_low", "ci_high", "n"])
    chart = charts.curves(
        empty,
        "eval_loops",
        charts.N_TITLE,
        views.METRIC_TITLES["accuracy"],
        budgets=charts.budget_rules(T_OURO),
        references=PAPER_MARKS,
        x_domain=(1, 2 * T_OURO),
    ).properties(title="The paper's reported figures (references, not measurements)")
    caption = (
        "Reference marks only (black): the paper's reported accuracy of Ouro-1.4B and Ouro-2.6B with the "
        "boundary norm removed, at n = T = 4, and the chance level 0.5 (labels balanced). The paper also "
        f"reports the state norm within a factor {paper.SURGERY_NORM_RATIO} over the steps. "
        "No seeds, no CI: not a measurement."
    )
    ui.figure(chart, PAPER_MARKS, "e1-paper-reference", caption, "E1 · the paper's reported figures (references)")
    st.stop()

manifest, problem = data.e1_manifest(table.preset)
if problem:
    st.warning(problem)
model = manifest.get("model", {})
size = f"{model['parameters']:,} parameters" if "parameters" in model else "size unknown"
training = model.get("training") or {}  # engine.experiments.e1.training_record, for a checkpoint trained here
held_out = bool(training.get("held_out"))  # the probe's prompts were kept out of its training
if "demo" in table.preset:
    trained = (
        f" It was trained in {training['wall_time_s'] / 60:.0f} min on a CPU with Ouro's stage-1 objective "
        "(the expected loss over the exit gate's distribution of the loop steps, minus an entropy bonus)."
        if "wall_time_s" in training
        else ""
    )
    asked = (training.get("probe") or {}).get("difficulty") or {}
    unit = {"chain": "hops", "parity": "bits"}
    where = (
        " It is probed where one loop step is not enough: "
        + ", ".join(f"{task} {value} {unit.get(task, '')}".rstrip() for task, value in asked.items())
        + (" (on prompts held out of training)" if held_out else "")
        + "."
        if asked
        else ""
    )
    st.info(
        f"**Demonstration, not the released weights:** `e1-{table.preset}.parquet` comes from a small "
        f"Ouro-architecture model trained here ({size}), saved and loaded through the same class.{trained}{where} "
        "What it shows is this toy's behaviour, not Ouro's."
    )
st.caption(
    f"Model `{model.get('spec', table.preset)}` ({size}, T = {model.get('trained_loops', '?')}); "
    f"`e1-{table.preset}.parquet`, {model.get('revision') or 'no Hub revision'}; "
    f"created {manifest.get('created', '?')}."
)
rows, task, difficulty = views.task_and_difficulty(table.rows, key=table.key)
items = (
    " Items: the probe's prompts, held out of the demonstration's training."
    if held_out
    else " Items: the probe's synthetic prompts; whether the model saw them in training is not recorded."
)
readout = manifest.get("tasks", {}).get(task, {}).get("settings", {}).get("readout", "final")
st.caption(
    f"Readout: **{readout}** — "
    + (
        "the answer at loop step n (the loop run n times, as the paper runs it)."
        if readout == "final"
        else "where the released forward's early exit stops within n steps (metric exit_step: the mean step read)."
    )
)
identity = manifest.get("tasks", {}).get(task, {}).get("n1_identity", {})
if identity:
    verdict = "passed" if identity.get("passed") else "FAILED"
    (st.success if identity.get("passed") else st.error)(
        f"n = 1 identity {verdict}: both modes' logits are bit-identical at one loop step (torch.equal)."
    )
left, right = st.columns(2)
with left:
    modes = views.modes_picker(rows)
with right:
    metric = ui.select("metric", ["accuracy", "choice_accuracy"], "metric")
picked = rows[rows["boundary"].isin(modes)]
if picked.empty:
    st.info("Nothing to draw: select at least one mode.")
    st.stop()
stats, per_seed = views.curves_of(picked, metric, difficulty)
T = int(picked["trained_loops"].max())
chart = charts.curves(
    stats,
    "eval_loops",
    charts.N_TITLE,
    views.METRIC_TITLES[metric],
    budgets=charts.budget_rules(T),
    chance=charts.CHANCE,
    references=PAPER_MARKS[PAPER_MARKS["x"].notna()] if metric == "accuracy" else None,
)
label = views.difficulty_label(rows, task, difficulty)
what = f"{table.preset}, {task}, {label}; one checkpoint, so one 'seed'. Black diamond: the paper's figure. "
caption = charts.caption(views.n_per_series(per_seed), stats["ci_method"], charts.CHANCE, what)
context = f"E1 · {table.preset} · {task} · {difficulty}"
name = f"e1-{table.preset}-{task}-{metric}-{difficulty}".replace(" ", "_")
ui.figure(chart, stats, name, caption + items, f"{metric.replace('_', ' ')} per n · {context}")

st.header("State norm and the head's commitment")
views.norms_section(
    rows, task, difficulty, modes, f"e1-{table.preset}", data.e1_top_tokens(manifest, task), items, context
)
