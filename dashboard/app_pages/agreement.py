"""E5, beyond the paper: agreement between training and running put to the test (docs/design.md §8).

Every number here is engine.experiments.e5.summarize's (cached in dashboard.data) and every verdict
e5.claims', the "E5 predictions" rules of docs/design.md, written before E5 ran."""

import re

import pandas as pd
import streamlit as st

from dashboard import charts, data, results, ui, views
from engine import paper
from engine.experiments import e5

COMMAND = "loopscope run e5 --preset cpu --seeds 16 --workers 2"
EFFECTS = (  # part 1's three effects in words (engine.experiments.e5.decompose), where the verdicts first name them
    "**G**, the agreement effect: accuracy run the way a model was trained minus run the other way. **R**, the "
    "run-mode effect: run without the norm minus run with it, whichever way the model was trained. **M**, the "
    "train-mode effect: trained without the norm minus trained with it, whichever way it is run. Each per seed pair, "
    "at each loop count n; part 1 below draws them. The verdicts:"
)

st.title("Agreement tested directly (E5, beyond the paper)")
st.markdown(
    "The paper infers that *agreement* between the loop a model is trained with and the loop it is run with, "
    "not the normalisation, keeps depth reusable; it never varies agreement itself. E5 does, on the second "
    "design's models: (1) each model run in both modes, (2) both modes trained over a range of loop counts, "
    "(3) the surgery across model scales, (4) the boundary norm replaced by a fixed per-step rescale. The "
    "docs/design.md's *E5 predictions* say what each reading predicts and the rule that decides, written before E5 ran."
)
table = views.load("e5", "E5 varies agreement itself on the second design's models.", COMMAND)
if table is None:
    st.stop()
st.caption(ui.scale_note(table))
summary, problem = data.e5_summary(table.preset)
if problem:
    st.error(problem)
    st.stop()

left, right = st.columns(2)
with left:
    task = views.pick_task(table.rows)
with right:
    level = ui.one_of(
        "level", list(e5.LEVELS), "level", help="The verdict rules' levels: the held-out mean and the hardest held-out."
    )
s = summary[(summary["task"] == task) & (summary["level"] == level)]
T = int(s["trained_loops"].iloc[0]) if len(s) else 0
at_scale = e5.own_scale(s)  # parts 1, 2, 4: E2's model size
held = "" if results.has_heldout(table.rows) else " (no held-out items at this preset: in-range items)"
name = f"e5-{table.preset}-{task}-{level}".replace(" ", "_")
context = f"E5 · study {table.preset} · {task} · {level}"

verdicts = [c for c in results.claims("e5", table.preset)["claims"] if c["task"] == task and c["level"] == level]
probing = results.probe_open(table.preset)  # no recipe adopted yet: the study's own rung is a probe's
if problem := results.probe_problem(table.preset):  # a record that is not one: said, and left out
    st.error(problem)
if probing:
    st.warning(probing)
elif below_bar := results.recipe_below_bar(table.preset):
    st.info(below_bar)
if probe := results.probe_rows(table.preset):
    with st.expander("The recipe probe, seed by seed", expanded=bool(probing)):
        st.caption(
            "The 19M rung's held-out accuracy at n = T per seed (run as trained), each candidate in the rule's "
            "order; where seeds are missing, the range the mean over seeds 0–3 can still take (docs/gpu-study.md)."
        )
        st.dataframe(probe, hide_index=True)
        curves = data.probe_losses(table.preset)
        if len(curves):
            what = (
                "Training loss of each probe seed (the manifests' curves, every 1/100 of training), one colour a "
                "candidate, one dash a seed; dotted: ln 2, a model that cannot tell the two answers apart."
            )
            title = f"Recipe probe · training loss · {table.preset}"
            ui.figure(charts.probe_loss_chart(curves), curves, f"{table.preset}-probe-loss", what, title)
if verdicts:
    if any(re.search(r"\b[GRM] ", c["measured"]) for c in verdicts):  # the letters in words, before their first use
        st.caption(EFFECTS)
    st.markdown("  \n".join(f"**{c['claim']}** {results.badge(c['outcome'])} {c['measured']}" for c in verdicts))


fixed = f"fixed:{T}"


def trained_alike(points: pd.DataFrame) -> str:
    """The ladder figure's sentence for a single training length (its legend of one entry is left out)."""
    steps = points["steps"].unique() if "steps" in points and "device" not in points else []
    return f" Every rung trained {int(steps[0]):,} steps." if len(steps) == 1 else ""


def part1() -> None:
    """Part 1: each model run in both modes, the run-mode, train-mode and agreement effects per n."""
    specs = list(dict.fromkeys(at_scale.loc[at_scale["part"] == "effects", "train_loops"]))
    spec = ui.select("trained with", [fixed, *[x for x in specs if x != fixed]], "train_loops", help="fixed:T is E2's.")
    effects = at_scale[(at_scale["part"] == "effects") & (at_scale["train_loops"] == spec)].sort_values("eval_loops")
    if effects.empty:
        st.info(f"No seed pair of `{spec}` has all four cells (trained norm/none × run norm/none).")
    else:
        chart, stats = charts.e5_effects(effects, T)
        what = (
            f"{task}, {level}{held}, trained `{spec}`. Per seed pair, with A(train, run) the accuracy: "
            "R = ½[A(norm,none) + A(none,none) − A(norm,norm) − A(none,norm)], M = ½[A(none,norm) + A(none,none) − "
            "A(norm,norm) − A(norm,none)], G = ½[A(norm,norm) + A(none,none) − A(norm,none) − A(none,norm)]: run as "
            "trained minus run the other way (engine.experiments.e5.decompose). "
        )
        caption = charts.caption(int(stats["n"].min()), stats["ci_method"], None, what)
        spec_name = spec.replace(":", "_")  # each training distribution its own file
        title = f"Train × run effects · {context} · trained {spec}"
        ui.figure(chart, effects, f"{name}-effects-{spec_name}", caption, title)


def part2() -> None:
    """Part 2: both modes trained over a range of loop counts, each run as trained."""
    acc = at_scale[(at_scale["part"] == "accuracy") & at_scale["quantity"].isin(["norm", "none"])]
    acc = acc.sort_values("eval_loops")
    chosen = ui.some_of("distributions", list(dict.fromkeys(acc["train_loops"])), "dists")
    acc = acc[acc["train_loops"].isin(chosen)]
    if acc.empty:
        st.info("Choose at least one distribution.")
    else:
        chart, stats = charts.e5_range(acc, T)
        what = (
            f"{task}, {level}{held}: each model run as trained; colour: the training distribution, solid `norm`, "
            "dashed `none`. Dashed rule: n = T of the fixed budget. "
        )
        caption = charts.caption(int(stats["n"].min()), stats["ci_method"], charts.CHANCE, what)
        dists = "_".join(c.replace(":", "_") for c in chosen)
        title = f"Accuracy run as trained · {context} · trained {', '.join(chosen)}"
        ui.figure(chart, acc, f"{name}-range-{dists}", caption, title)
    gap = at_scale[(at_scale["part"] == "range") & at_scale["train_loops"].isin(chosen)]  # the pills choose rows too
    gap = gap.sort_values(["train_loops", "eval_loops"])
    st.dataframe(
        gap[["train_loops", "eval_loops", "in_range", "mean", "ci_low", "ci_high", "n", "wilcoxon_p",
             "wilcoxon_p_holm"]],
        hide_index=True,
        height="content",  # all of it: both distributions, every n
        column_config={"train_loops": "trained with", "eval_loops": "n", "in_range": "in the trained range",
                       "mean": st.column_config.NumberColumn("none − norm", format="%+.3f"),
                       "ci_low": st.column_config.NumberColumn("95% CI low", format="%+.3f"),
                       "ci_high": st.column_config.NumberColumn("95% CI high", format="%+.3f"), "n": "seed pairs",
                       "wilcoxon_p": st.column_config.NumberColumn("Wilcoxon p", format="%.3g"),
                       "wilcoxon_p_holm": st.column_config.NumberColumn("Holm p", format="%.3g")},
    )  # fmt: skip
    st.caption(
        "none − norm of the same seed, each run as trained; in the trained range: drawn at ≥ "
        f"{e5.IN_RANGE_SHARE:.0%} of training steps (e5.trained_range). Holm within each side of T."
    )


# a study may run only some parts (the GPU study: the ladder and the rescale surgery, norm-trained models only)
not_here = (f"The `{table.preset}` study does not run it: its E5 is the ladder and the rescale surgery "
            "(docs/gpu-study.md); choose another study above for parts 1 and 2.")  # fmt: skip
st.header("1 · Train mode × run mode")
if (at_scale["part"] == "effects").any():
    part1()
else:
    ui.not_run_yet(not_here, None)
st.header("2 · Training over a range of loop counts")
if (at_scale["train_loops"] != fixed).any():
    part2()
else:
    ui.not_run_yet(not_here, None)

st.header("3 · Where the surgery bites")
ladder = s[(s["part"] == "ladder") & s["eval_loops"].isin([T, 3 * T])]
points = data.rungs(table.preset, task, level)  # this study's ladder and its partner's on the other device
if probing:  # its own rung left out (the notice above)
    points = points[points["study"] != table.preset]
devices = points["device"].nunique()
if len(ladder[["params", "train_steps"]].drop_duplicates()) < 2 and devices < 2 and not probing:  # E2's model alone
    at = {int(r.eval_loops): f"{r.mean:+.3f}" for r in ladder.itertuples()}
    own = f" E2's model alone loses {at.get(T, '–')} at T and {at.get(3 * T, '–')} at 3T." if at else ""
    st.info(f"No ladder for {task} in this table (at `cpu` it covers parity only: e5.LADDER_TASKS).{own}")
else:
    points = points if devices > 1 else points.drop(columns=["device", "study"])
    what = (
        f"{task}, {level}{held}: accuracy lost when a norm-trained model is run without its norm (norm − norm→none "
        f"per seed, mean with its 95% bootstrap CI), at n = T and 3T, against parameters; ▼ above the points: the "
        f"paper's {paper.PAPER_PARAMS / 1e6:.0f}M. Reported, not judged."
    )
    what += trained_alike(points)
    what += charts.devices_note(points, T)
    ladder_title = f"Surgery damage against scale · {context}"
    ui.figure(charts.ladder_chart(points, paper.PAPER_PARAMS), points, f"{name}-ladder", what, ladder_title)
gpu_ladder = results.reads_ladder_rules(table.preset)
if task == "parity" and gpu_ladder and not probing:  # the GPU study's rules over both devices' ladders
    st.subheader("The GPU study's rules over the ladder")
    st.caption(
        "Written before any GPU run (docs/gpu-study.md, “Predictions and rules”): the slope of per-seed damage "
        "against log10(parameters) over every rung, its 95% CI from a bootstrap that resamples seeds 0–3 jointly "
        "across rungs (grows above 0, shrinks below, flat otherwise; the bridge counted once, with the CPU's "
        "seeds); collapse per rung by E2 (d)'s criteria at n = T, the median seed deciding; the bridge's GPU "
        "seeds against the CPU's (Mann–Whitney per n; reported, not judged). Held-out mean."
    )
    rules = data.ladder_rules(table.preset)[["claim", "outcome", "measured"]]
    st.dataframe(rules, hide_index=True, height=36 * (len(rules) + 1) + 4,  # every rule in view, none scrolled away
                 column_config={"measured": st.column_config.TextColumn(width="large")})  # fmt: skip
    st.markdown(f"**What it says about the paper's collapse.** {data.ladder_reading(table.preset)}")

st.header("4 · The rescale surgery")
rescale = at_scale[(at_scale["part"] == "rescale") & (at_scale["train_loops"] == fixed)].sort_values("eval_loops")
rescale = rescale[rescale["eval_loops"] >= T]
per_rung = data.rungs(table.preset, task, level, "rescale")  # at T and 3T, every rung of both devices that has it
per_rung = per_rung[per_rung["study"] != table.preset] if probing else per_rung
one_model = len(rescale[["params", "train_steps"]].drop_duplicates()) <= 1  # else per rung only (the GPU study)
nothing = f"No seed lost ≥ {paper.MIN_REFIT_GAP} to the surgery at this level: nothing to recover."
if one_model and not probing and (rescale.empty or rescale["mean"].isna().all()):
    st.info(nothing)
elif one_model and not probing:
    references = None
    if table.preset in results.presets("e3"):
        refit_level = data.e3_levels(data.table("e3", table.preset).rows, "recovery")[0]  # E3's stored mean
        refits, _ = data.e3_curves(table.preset, "recovery", refit_level)
        if refits is not None and len(refits):
            references = charts.e3_references(refits, task, T)
            last = refits[(refits["task"] == task) & (refits["eval_loops"] == T)]
            refit_steps = f"{int(last['refit_steps'].max()):,}" if len(last) else ""
    chart, stats = charts.e5_rescale(rescale, T, references)
    what = (
        f"{task}, {level}{held}: (A(norm→rescale) − A(norm→none)) / (A(norm) − A(norm→none)) per seed, over the "
        f"seeds the surgery cost ≥ {paper.MIN_REFIT_GAP} at that n; the boundary norm replaced by g · Block(h) / s_t, "
        "s_t the model's mean state RMS at step t on training items (no parameter added). "
    )
    if references is not None:
        what += (f"Diamonds at n = T, labelled at their left: E3's refits' recovery at n = T ({refit_level}, after "
                 f"{refit_steps} refit steps, the last). ")  # fmt: skip
    caption = charts.point_caption(stats, None, what)  # damaged seeds vary by n
    ui.figure(chart, rescale, f"{name}-rescale", caption, f"Rescale surgery recovery · {context} · trained {fixed}")
if len(per_rung[["params", "steps", "device"]].drop_duplicates()) < 2:
    if probing:
        st.info("Its own rung's rescale is left out while the recipe probe is open (the notice above).")
    elif not one_model:  # a study of rungs alone, none damaged
        st.info(nothing)
else:
    per_rung = per_rung if per_rung["device"].nunique() > 1 else per_rung.drop(columns=["device", "study"])
    what = (
        f"{task}, {level}{held}: the rescale surgery's recovery per rung (mean with its 95% bootstrap CI over the "
        f"seeds the surgery cost ≥ {paper.MIN_REFIT_GAP}), at n = T and 3T, against parameters; ▼ above the points: "
        f"the paper's {paper.PAPER_PARAMS / 1e6:.0f}M. docs/gpu-study.md's rule per rung: agreement (scale) if the "
        "mean at T ≥ 0.5 with its CI above 0.25."
    )
    what += trained_alike(per_rung)
    what += charts.devices_note(per_rung, T)
    chart = charts.ladder_chart(per_rung, paper.PAPER_PARAMS, "recovery (fraction regained)")
    ui.figure(chart, per_rung, f"{name}-rescale-rungs", what, f"Rescale surgery recovery per rung · {context}")
