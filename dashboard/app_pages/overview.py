"""Each claim of the paper as a card: the paper's figure, the measured one, the scale, a verdict, a link.

Every table is judged by its experiment's own claims (REGISTRY[e].claims: docs/design.md's verdict rules), under
both analyses, at the held-out mean and the hardest held-out difficulty (a table without held-out items, the
first study's or a smoke run's, on its in-range items). This page imports nothing heavy:
dashboard.results computes (and caches on disk) the verdicts, so a new server draws it at once."""

from pathlib import Path

import streamlit as st

from dashboard import matrix, results, ui
from engine import paper, studies

PAGES = Path(__file__).resolve().parent
ACCURACY, NORMS = PAGES / "accuracy.py", PAGES / "norms.py"
SECTIONS = {  # each experiment's claim as the paper states it; once its table exists, the engine's verdicts
    "e2": {
        "title": "E2 · norm vs none, from scratch",
        "card": "E2",
        "text": "Trained from scratch, `none` is never worse than `norm`, the two are closest at n = T and separate "
        "on both sides of it; norm-trained models run without the norm collapse.",
        "paper": f"Cliff's δ up to {paper.MAX_DELTA_BEYOND} beyond the budget; surgery accuracy "
        f"{paper.SURGERY_ACCURACY_AT_T:.3f} at n = T",
        "command": "loopscope run e2 --preset cpu",
        "page": ACCURACY,
    },
    "e3": {
        "title": "E3 · readout refit",
        "card": "E3 · readout refit",
        "text": "Norm-trained models run without the norm lose accuracy; refitting the head alone recovers about "
        "a third and plateaus, refitting the head with the block's last layer recovers all of it.",
        "paper": "recovery: head ≈ 1/3 (plateau); head + last layer ≈ 1",
        "command": "loopscope run e3 --preset cpu",
        "page": PAGES / "refit.py",
    },
    "e4": {
        "title": "E4 · looped vs stacked",
        "card": "E4 · looped vs stacked",
        "text": "Against a stacked model of equal trained depth, compared at matched overshoot n / T, the advantage "
        "of looping vanishes on one task and shrinks on the other.",
        "paper": "at matched n / T: advantage gone on one task, smaller on the other",
        "command": "loopscope run e4 --preset cpu",
        "page": PAGES / "stacked.py",
    },
    "e1": {
        "title": "E1 · released Ouro weights",
        "card": "E1 · released Ouro weights",
        "text": f"Removing the boundary norm from Ouro-1.4B and Ouro-2.6B (T = {paper.TRAINED_LOOPS_OURO}) takes "
        f"accuracy to {paper.SURGERY_ACCURACY_AT_T:.3f} by n = T, while the state norm stays within a factor "
        f"{paper.SURGERY_NORM_RATIO} and the head commits to one token.",
        "paper": f"accuracy {paper.SURGERY_ACCURACY_AT_T:.3f} at n = T = {paper.TRAINED_LOOPS_OURO} (both models); "
        f"norm ratio ≤ {paper.SURGERY_NORM_RATIO}×",
        "command": "loopscope ouro --model ByteDance/Ouro-1.4B ...",
        "page": PAGES / "ouro.py",
    },
}
# E5 goes beyond the paper: the claim is the paper's thesis, varied directly (docs/design.md, "E5 predictions")
BEYOND = {
    "e5": {
        "title": "E5 · agreement tested directly (beyond the paper)",
        "card": "E5",
        "text": "The paper's thesis, that agreement between the loop a model is trained with and the one it is run "
        "with keeps depth reusable, not the normalisation, tested by varying agreement itself.",
        "paper": "inferred, never varied: “agreement rather than normalisation”",
        "command": "loopscope run e5 --preset cpu --seeds 16 --workers 2",
        "page": PAGES / "agreement.py",
    },
}
VERDICTS = {  # a card without a verdict (rule_card shows the verdicts)
    None: ("not run yet", "gray", ":material/hourglass_empty:"),
    "pending": ("no verdict yet", "blue", ":material/help:"),
}
SHORT = {"paper": "paper's", "paired": "paired"}  # the two analyses in a badge
LEGEND = (
    "At the held-out mean, by the rules written before each study ran (docs/design.md). One badge where the paper's "
    "unpaired analysis and the paired one agree, one each where they differ; *hardest:* where the hardest held-out "
    "difficulty reads otherwise. Each cell opens its page; every card is below."
)
NO_HELDOUT = " This study has no held-out items: its in-range items stand in for the held-out levels."
STUDY_NOTES = {s.name: s.note for s in studies.STUDIES.values()}  # each study's note is its entry's
LADDER_RULES = {s.name for s in studies.STUDIES.values() if s.ladder_rules}  # engine.experiments.ladder reads them


def card(title: str, text: str, paper: str, measured: str, scale: str, verdict, link: dict | None) -> None:
    label, color, icon = VERDICTS[verdict]
    with st.container(border=True):
        st.markdown(f"**{title}** &nbsp; :{color}-badge[{icon} {label}]  \n{text}")
        st.markdown(f"**Paper:** {paper}  \n**Measured:** {measured}  \n**Scale:** {scale}")
        if link:
            st.page_link(**link)


def beyond_section(experiment: str, preset: str | None, prefix: str = "") -> None:
    """E5's cards: per task and claim, the outcome its rules name at the held-out mean and the hardest held-out.
    prefix: before the title, where the section is another study's (gpu_study)."""
    spec = BEYOND[experiment]
    if prefix:  # another study's section; the chosen study's sits in an expander named by its title
        st.header(prefix + spec["title"])
    tables = results.presets(experiment)
    if not tables:  # its page appears with its table (dashboard/app.py): no link yet
        card(spec["card"], spec["text"], spec["paper"], f"not run yet: `{spec['command']}`", "—", None, None)
        return
    if preset not in tables:  # another study's cards are not this one's: say so (issue 43)
        st.caption(f"{experiment.upper()} is not part of the `{preset}` study (its table exists at "
                   f"{', '.join(f'`{t}`' for t in tables)}).")  # fmt: skip
        return
    chosen = preset
    with st.spinner(f"Computing the {experiment} verdicts (once per change of the table)…"):
        found = results.claims(experiment, chosen)
    for problem in found["problems"]:
        st.error(problem)
    grouped: dict[tuple, list[dict]] = {}
    for c in found["claims"]:
        grouped.setdefault((c["claim"], c["task"]), []).append(c)
    claims = list(dict.fromkeys(claim for claim, _ in grouped))
    for claim in claims:  # one row per claim: parity, then chain beside it (the row's two cells of the matrix)
        columns = st.columns(2)
        for column, task in zip(columns, matrix.TASKS, strict=True):
            if (claim, task) in grouped:
                with column:
                    levels = grouped[(claim, task)]
                    beyond_card(spec, claim, task, levels, found["scale"], chosen, len(tables) > 1, prefix)


def beyond_card(
    spec: dict, claim: str, task: str, levels: list[dict], scale: str, chosen: str, many: bool, prefix: str = ""
) -> None:
    """One E5 claim of one task: the outcome its rules name at each level, what was measured, a link; prefix: the
    study, where the card is another study's (gpu_study)."""
    levels = sorted(levels, key=lambda c: results.LEVELS.index(c["level"]) if c["level"] in results.LEVELS else 9)
    with st.container(border=True):
        first = levels[0]
        title = f"{prefix}{spec['card']} · {claim} · {task}"
        st.markdown(f"**{title}**  \n{first['text']}  \n**Predicted:** {first['criterion']}")
        st.markdown(
            "  \n".join(f"{c['level']}: {results.badge(c['outcome'])} {c['measured']}" for c in levels)
            + f"  \n**Scale:** {scale}"
        )
        query = {"task": task} | ({"preset": chosen} if many else {})
        st.page_link(spec["page"], label="Open the page", icon=":material/arrow_forward:", query_params=query)


def rule_card(title: str, experiment_claim: tuple[str, str], c: dict, scale: str, link: dict) -> None:
    """One claim under docs/design.md's verdict rules: each analysis' outcome at the held-out mean and at the
    hardest held-out difficulty, with what was measured, and at how many held-out difficulties it holds."""
    mean = results.LEVELS[0]  # the verdict is stated at the held-out mean (headline) and the hardest (below)
    both = experiment_claim in results.SAME_RULE  # one badge, as the matrix and the report show it
    headline = " ".join(
        results.badge(found["levels"][mean][0], "both: " if both else f"{SHORT[analysis]}: ")
        for analysis, found in list(c["analyses"].items())[: 1 if both else None]
        if mean in found["levels"]
    )
    with st.container(border=True):
        st.markdown(
            f"**{title}** &nbsp; {headline}  \n{c['text']}  \n**Paper:** {c['paper']}  \n**Rule:** {c['criterion']}"
        )
        analyses = c["analyses"]
        if experiment_claim in results.SAME_RULE:  # the rules read these the same way under both analyses
            analyses = {"both": analyses["paper"]}
        for analysis, found in analyses.items():
            lines = [f"**{results.ANALYSES[analysis]}**"]
            for level in results.LEVELS:
                if level in found["levels"]:
                    outcome, measured = found["levels"][level]
                    lines.append(f"{level}: {results.badge(outcome)} {measured}")
            if found["difficulties"]:
                lines.append(f"holds at {found['difficulties']} held-out difficulties")
            st.markdown("  \n".join(lines))
        st.markdown(f"**Scale:** {scale}")
        st.page_link(**link)


def section(experiment: str, preset: str | None, prefix: str = "") -> None:
    """One experiment's cards at the chosen study (or the largest study that has its table). prefix: before the
    title, where the section is another study's (gpu_study)."""
    spec = SECTIONS[experiment]
    if prefix:  # another study's section; the chosen study's sits in an expander named by its title
        st.header(prefix + spec["title"])
    link = {"page": spec["page"], "label": "Open the page", "icon": ":material/arrow_forward:"}
    tables = results.presets(experiment)
    if not tables:
        if experiment == "e2":
            ui.not_run_yet("E2 trains both boundary modes from scratch over many seeds.", spec["command"])
        else:
            measured = f"not run yet: `{spec['command']}`"
            card(spec["card"], spec["text"], spec["paper"], measured, "—", None, link)
        return
    if preset not in tables and experiment != "e1":  # E1's tables are named by the probed model, not by a study
        st.caption(f"{experiment.upper()} is not part of the `{preset}` study (its table exists at "
                   f"{', '.join(f'`{t}`' for t in tables)}).")  # fmt: skip
        return
    chosen = preset if preset in tables else tables[0]
    with st.spinner(f"Computing the {experiment} verdicts (once per change of the table)…"):
        found = results.claims(experiment, chosen)
    for problem in found["problems"]:
        st.error(problem)
    query = {"preset": chosen} if len(tables) > 1 else {}
    cards = results.rule_cards(experiment, found["claims"])
    if not cards:
        if found["problems"] and experiment == "e2":
            ui.not_run_yet("E2 trains both boundary modes from scratch over many seeds.", spec["command"])
            return
        measured = "; ".join(found["problems"]) or (
            f"the table exists and no verdict rule reads it (`engine.experiments.{experiment}` has none) — see the page"
        )
        link |= {"query_params": query}
        card(spec["card"], spec["text"], spec["paper"], measured, found["scale"], "pending", link)
        return
    rows: dict[str, dict] = {}  # one row per claim: parity, then chain beside it (the matrix's two cells)
    for c in cards:
        rows.setdefault(c["claim"], {})[c["task"]] = c
    for by_task in rows.values():
        columns = st.columns(2)
        tasks = [t for t in matrix.TASKS if t in by_task] + [t for t in by_task if t not in matrix.TASKS]
        for i, task in enumerate(tasks[:2]):
            with columns[i]:
                task_card(experiment, spec, by_task[task], found["scale"], query)


def task_card(experiment: str, spec: dict, c: dict, scale: str, query: dict) -> None:
    """One claim of one task under the verdict rules, with the link to its page at the level it is stated at."""
    page = NORMS if experiment == "e2" and c["claim"] == "d" else spec["page"]
    label = {NORMS: "Norm trajectories", ACCURACY: "Accuracy vs depth"}.get(page, "Open the page")
    params = query | {"task": c["task"]}
    if experiment in ("e2", "e4"):  # the level the verdict is stated at
        params["difficulty"] = results.LEVELS[0]
    to = {"page": page, "label": label, "icon": ":material/arrow_forward:", "query_params": params}
    title = f"{spec['card']} ({c['claim']}) · {c['task']}"
    rule_card(title, (experiment, c["claim"]), c, scale, to)


def study_note(study: str) -> None:
    """The study's note and, for a study with a folder of its own, where its runs were made (the GPU, its driver,
    CUDA and torch, the dtype policy: from the runs' manifests)."""
    if study in STUDY_NOTES:
        st.caption(" ".join(filter(None, (STUDY_NOTES[study], results.partner_sentence(study)))))
    if problem := results.probe_problem(study):  # a record that is not one: said, and left out
        st.error(problem)
    if probing := results.probe_open(study):
        st.warning(probing)
    elif below_bar := results.recipe_below_bar(study):
        st.info(below_bar)
    if study in results.OWN_FOLDER and (made := results.study_provenance(results.results_root(), study)):
        st.caption(f"**Provenance** (the runs' manifests): {results.provenance_text(made)}.")


def gpu_study(gpu: str) -> None:
    """A study with a folder of its own (the GPU study, the ladder on the CPU) beside the chosen one: its note,
    provenance and matrix, its cards on expand, from its own tables only."""
    st.divider()
    name = "The GPU study's ladder on the CPU" if gpu == "cpu-ladder" else "The GPU study"
    st.header(f"{name} (`{gpu}`), beside it")
    study_note(gpu)
    st.html(matrix.matrix_html([r for r in matrix.rows(gpu) if not r["note"]], gpu))
    st.page_link(PAGES / "overview.py", label=f"Show the `{gpu}` study alone", icon=":material/arrow_forward:",
                 query_params={"study": gpu})  # fmt: skip
    with st.expander(f"`{gpu}`: every card"):
        for experiment in SECTIONS:
            if gpu in results.presets(experiment):
                section(experiment, gpu, f"{gpu} · ")
        for experiment in BEYOND:
            if gpu in results.presets(experiment):
                beyond_section(experiment, gpu, f"{gpu} · ")


def headline_figure(study: str) -> None:
    """The claims' first figure beside the matrix: accuracy per n on parity at the level the verdicts read, both
    modes and the surgery (imports the engine: drawn after the matrix, which needs nothing heavy)."""
    if study not in results.presets("e2"):
        return
    from dashboard import caching, charts, data, views

    table = data.table("e2", study)
    if table.rows is None:
        return
    looped = table.rows[table.rows["arch"] == "looped"]
    task = "parity" if (looped["task"] == "parity").any() else sorted(looped["task"].unique())[0]
    rows = looped[looped["task"] == task]
    level = data.difficulty_options(rows)[0]  # the held-out mean where there are held-out items
    key = (*table.key, "headline", task, level)
    stats, per_seed = caching.derived(key, lambda: views.curves_of(rows, "accuracy", level))
    chart = charts.curves(stats, "eval_loops", "inference loop count n", "accuracy", budgets=views.budgets_of(rows),
                          chance=charts.CHANCE)  # fmt: skip
    st.markdown(f"**Accuracy per loop count n** · {task}, {level}")
    st.vega_lite_chart(dict(caching.vega_spec(chart)), width="stretch")
    seeds = views.n_per_series(per_seed)
    st.caption(f"Mean over {seeds} seeds per mode with its 95% bootstrap CI; `norm->none`: the norm-trained models "
               "run without the norm (claim (d)).")  # fmt: skip
    st.page_link(ACCURACY, label="Accuracy vs depth", icon=":material/arrow_forward:",
                 query_params={"preset": study, "task": task, "difficulty": level})  # fmt: skip


def ladder_study(study: str) -> bool:
    """A study of the ladder alone (no E2 table; its rules read its E5 ladder, no recipe probe open): its overview
    opens on the ladder rules' outcomes and the ladder's figure (issue 60, item 4)."""
    return (study in LADDER_RULES and study in results.presets("e5") and study not in results.presets("e2")
            and not results.probe_open(study))  # fmt: skip


def ladder_rules(study: str) -> list[dict]:
    """engine.experiments.ladder.rules over the study's ladder (dashboard.data: the engine, cached per table)."""
    from dashboard import data

    return data.ladder_rules(study).to_dict("records")


def ladder_figure(study: str) -> None:
    """The ladder's figure beside the matrix: the surgery's damage per rung at n = T and 3T against parameters, the
    one the E5 page draws (charts.ladder_chart), on parity at the held-out mean."""
    from dashboard import caching, charts, data

    level = results.LEVELS[0]
    points = data.rungs(study, "parity", level)
    if points.empty:
        return
    points = points if points["device"].nunique() > 1 else points.drop(columns=["device", "study"])
    st.markdown(f"**The surgery's damage against scale** · parity, {level}")
    chart = charts.ladder_chart(points, paper.PAPER_PARAMS)
    st.vega_lite_chart(dict(caching.vega_spec(chart)), width="stretch")
    seeds = int(points["n"].min()), int(points["n"].max())
    many = f"{seeds[0]}" if seeds[0] == seeds[1] else f"{seeds[0]}–{seeds[1]}"
    st.caption(f"Accuracy lost when a norm-trained model runs without its norm (norm − norm→none), mean over {many} "
               f"seeds per rung with its 95% bootstrap CI, at n = T and 3T; ▼: the paper's "
               f"{paper.PAPER_PARAMS / 1e6:.0f}M. The trend and collapse rows of the matrix read it.")  # fmt: skip
    st.page_link(PAGES / "agreement.py", label="E5 · every rule over the ladder", icon=":material/arrow_forward:",
                 query_params={"preset": study, "task": "parity"})  # fmt: skip


def open_verdict(study: str) -> None:
    """A verdict opened: its rule as written, what it measured, and the per-seed, per-n values of its table at its
    task and level (data.verdict_values), with the metric the rule names chosen below. ?verdict=e2:a:parity (the
    experiment, the claim and the task) opens that one."""
    from dashboard import data  # pandas and the table: only once a reader opens a verdict

    found = [c for e in data.DRILL_EXPERIMENTS for c in results.claims(e, study)["claims"]]
    if not found:
        st.caption("No verdict of this study reads a table of runs by seed and n (E3's refits: the Refits page).")
        return
    labels = [f"{c['experiment'].upper()} ({c['claim']}) · {c['task']} · {c['level']} · {c['analysis']}: "
              f"{c['outcome']}" for c in found]  # fmt: skip
    asked = str(st.query_params.get("verdict", "")).split(":")
    first = next((i for i, c in enumerate(found) if len(asked) == 3 and c["experiment"] == asked[0] and c["task"] ==
                  asked[2] and (c["claim"] == asked[1] or c["claim"].startswith(asked[1] + " "))), 0)  # fmt: skip
    i = st.selectbox("verdict", range(len(found)), index=first, format_func=labels.__getitem__, key="verdict_pick")
    c = found[i]
    st.markdown(
        f"**Claim:** {c['text']}  \n**Rule:** {c['criterion']}  \n**Measured:** {c['measured']}  \n"
        f"**Outcome:** {results.badge(c['outcome'])} ({c['analysis']} analysis, {c['level']})"
    )
    rows = data.table(c["experiment"], study).rows
    metrics = sorted(rows["metric"].unique()) if rows is not None else ["accuracy"]
    usual = metrics.index("accuracy") if "accuracy" in metrics else 0
    metric = st.selectbox("metric", metrics, index=usual, key="verdict_metric",
                          help="the metric the rule above names; accuracy for most rules")  # fmt: skip
    values, read = data.verdict_values(c["experiment"], study, c["task"], c["level"], metric)
    if values.empty:
        st.caption(f"The table holds no {metric} rows at {c['task']}, {c['level']}.")
        return
    stand_in = f" (standing in for {c['level']}: this study has no held-out items)" if read != c["level"] else ""
    st.caption(f"{metric} per seed (rows) and loop step n (columns), {c['task']}, {read}{stand_in}: the values the "
               f"rule reads, before it pairs seeds or averages them ({values['seed'].nunique()} seeds).")  # fmt: skip
    st.dataframe(values, hide_index=True)
    st.download_button("Download these values (CSV)", values.to_csv(index=False), file_name=f"{study}-{c['experiment']}"
                       f"-{c['claim']}-{c['task']}-{metric}.csv", mime="text/csv", key="verdict_csv")  # fmt: skip


def report_html(study: str | None) -> bytes:
    """The static report, built on click (dashboard.report imports the engine: not on this page's way)."""
    from dashboard import report

    return report.html_bytes(study)


st.html("<style>[data-testid=stMainBlockContainer] h1 { font-size: 2.1rem; }</style>")  # the title on one line
heading, pick, get = st.columns([4.6, 2, 1.7], vertical_alignment="bottom")
heading.title("loopscope: does depth stay reusable?")
studies = results.studies()
with pick:
    study = ui.pick_study(studies, key="study")  # not `preset`: Streamlit drops a link's parameter bound on this page
if studies:
    get.download_button(
        "Download report",
        data=lambda: report_html(study),
        file_name="loopscope-report.html",
        mime="text/html",
        key="report",
        on_click="ignore",
        icon=":material/download:",
        help="One self-contained HTML page: this matrix, every card and figure (SVG), provenance and the commands "
        "that reproduce it; the same page as `loopscope report --out DIR --preset STUDY`.",
    )
if study:
    ladder = ladder_study(study)
    left, right = st.columns([2, 1]) if study in results.presets("e2") or ladder else (st.container(), None)
    with left:
        with st.spinner("Reading the verdicts…"):
            own, elsewhere = matrix.apart(matrix.rows(study))  # the study's rows first, the others folded after
        own = [matrix.compact(r) for r in own]  # a row of 8 rungs alike: one entry, its span
        slot, tasks = st.empty(), matrix.tasks_run(own)  # a study of parity alone: no chain column
        slot.html(matrix.matrix_html(own + matrix.folded(elsewhere, study), study, tasks=tasks))
        if ladder:  # its decisive rules (trend, collapse) in the matrix: they need the engine, so drawn second
            with st.spinner("Reading the ladder's rules…"):
                own, elsewhere = matrix.with_ladder(own, elsewhere, ladder_rules(study))
            slot.html(matrix.matrix_html(own + matrix.folded(elsewhere, study), study, tasks=tasks))
        stand_in = "no held-out items" in results.claims("e2", study)["scale"]  # the first design (cpu-1layer)
        st.caption(LEGEND + (NO_HELDOUT if stand_in else ""))
        st.session_state[ui.READ].add("verdict")  # ?verdict=... is this page's (open_verdict reads it)
        if st.toggle("Open a verdict: the per-seed values its rule read", value="verdict" in st.query_params,
                     key="open_verdict"):  # fmt: skip
            open_verdict(study)
    if right is not None:
        with right:
            if study in results.presets("e2"):
                headline_figure(study)
            else:
                ladder_figure(study)
    study_note(study)
for experiment in SECTIONS:
    with st.expander(f"{SECTIONS[experiment]['title']}: every card"):
        section(experiment, study)
for experiment in BEYOND:
    with st.expander(f"{BEYOND[experiment]['title']}: every card"):
        beyond_section(experiment, study)
if study not in results.OWN_FOLDER:  # a GPU study present: its own section below the CPU study's
    for gpu in [s for s in studies if s in results.OWN_FOLDER][:1]:
        gpu_study(gpu)
