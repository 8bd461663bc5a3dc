"""Each claim of the paper as a card: the paper's figure, the measured one, the scale, a verdict, a link.

Every table is judged by its experiment's own claims (REGISTRY[e].claims: the README's verdict rules), under
both analyses, at the held-out mean and the hardest held-out difficulty (a table without held-out items, the
first study's or a smoke run's, on its in-range items). This page imports nothing heavy:
dashboard.results computes (and caches on disk) the verdicts, so a new server draws it at once."""

from pathlib import Path

import streamlit as st

from dashboard import results, ui
from engine import paper

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
BEYOND = {  # E5 goes beyond the paper: the claim is the paper's thesis, varied directly (README, "E5 predictions")
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
STUDY_NOTES = {
    "cpu-1layer": "The first CPU study, kept as an earlier design: one layer per block, in-range items mostly seen in "
    "training (no held-out split: judged by the second design's rules, its in-range items standing in for held-out "
    "ones), and a **parity-like control** for the chain (one ordered chain: the answer is the root bit XOR the parity "
    "of the `not`s). The second design (preset `cpu`) replaces it.",
    "gpu": "The GPU study, at the paper's scale (README, “The GPU study”): the second CPU study's parity (held-out "
    "lengths, T = 4) on the paper's 19M model, E2 and E3 with 16 seeds, and E5's ladder (412,288 parameters, the "
    "bridge also run on the CPU, to 19M) with the rescale surgery on every rung; judged by the second CPU study's "
    "rules, unchanged. No E4, no E5 parts 1–2. Its runs and tables live in `gpu/` under the results folder.",
    "gpu-smoke": "The GPU study's structure at a size the CPU runs in seconds (dry runs and tests): not a result.",
    "cpu": "The second CPU study: held-out in-range items, two layers per block, verdicts by the README's rules "
    "under the paper's analysis and the paired one. Its chain is the ordered single chain, a **parity-like "
    "control**: no chain that needs retrieval by name trained at this size within the search budget (held-out "
    "k = 1..4 at chance, dev/LOG.md). The retrieval chain runs at the paper preset.",
}


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
    st.header(prefix + spec["title"])
    tables = results.presets(experiment)
    if not tables:  # its page appears with its table (dashboard/app.py): no link yet
        card(spec["card"], spec["text"], spec["paper"], f"not run yet: `{spec['command']}`", "—", None, None)
        return
    chosen = preset if preset in tables else tables[0]
    with st.spinner(f"Computing the {experiment} verdicts (once per change of the table)…"):
        found = results.claims(experiment, chosen)
    for problem in found["problems"]:
        st.error(problem)
    grouped: dict[tuple, list[dict]] = {}
    for c in found["claims"]:
        grouped.setdefault((c["task"], c["claim"]), []).append(c)
    for i, ((task, claim), levels) in enumerate(grouped.items()):
        levels = sorted(levels, key=lambda c: results.LEVELS.index(c["level"]) if c["level"] in results.LEVELS else 9)
        if i % 2 == 0:
            columns = st.columns(2)
        with columns[i % 2], st.container(border=True):
            first = levels[0]
            st.markdown(
                f"**{spec['card']} · {claim} · {task}**  \n{first['text']}  \n**Predicted:** {first['criterion']}"
            )
            st.markdown(
                "  \n".join(f"{c['level']}: {results.badge(c['outcome'])} {c['measured']}" for c in levels)
                + f"  \n**Scale:** {found['scale']}"
            )
            query = {"task": task} | ({"preset": chosen} if len(tables) > 1 else {})
            st.page_link(spec["page"], label="Open the page", icon=":material/arrow_forward:", query_params=query)


def rule_card(title: str, experiment_claim: tuple[str, str], c: dict, scale: str, link: dict) -> None:
    """One claim under the README's verdict rules: each analysis' outcome at the held-out mean and at the
    hardest held-out difficulty, with what was measured, and at how many held-out difficulties it holds."""
    mean = results.LEVELS[0]  # the verdict is stated at the held-out mean (headline) and the hardest (below)
    headline = " ".join(
        results.badge(found["levels"][mean][0], f"{SHORT[analysis]}: ")
        for analysis, found in c["analyses"].items()
        if mean in found["levels"]
    )
    with st.container(border=True):
        st.markdown(
            f"**{title}** &nbsp; {headline}  \n{c['text']}  \n**Paper:** {c['paper']}  \n**Rule:** {c['criterion']}"
        )
        analyses = c["analyses"]
        if experiment_claim in results.SAME_RULE:  # the README reads these the same way under both analyses
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
    chosen = preset if preset in tables else tables[0]
    if chosen != preset and experiment != "e1":  # E1's tables are named by the probed model, not by a study
        why = f"{experiment.upper()} is not part of the `{preset}` study" if preset in results.OWN_FOLDER else ""
        st.caption(f"No `{experiment}-{preset}.parquet`{f' ({why})' if why else ''}: showing the `{chosen}` table.")
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
            f"the table exists; the engine has no verdict for it yet (`engine.{experiment}.claims`) — see the page"
        )
        link |= {"query_params": query}
        card(spec["card"], spec["text"], spec["paper"], measured, found["scale"], "pending", link)
        return
    for i, c in enumerate(cards):
        if i % 2 == 0:  # a new row of two cards, so neighbours line up
            columns = st.columns(2)
        page = NORMS if experiment == "e2" and c["claim"] == "d" else spec["page"]
        label = {NORMS: "Norm trajectories", ACCURACY: "Accuracy vs depth"}.get(page, "Open the page")
        params = query | {"task": c["task"]}
        if experiment in ("e2", "e4"):  # the level the verdict is stated at
            params["difficulty"] = results.LEVELS[0]
        to = {"page": page, "label": label, "icon": ":material/arrow_forward:", "query_params": params}
        title = f"{spec['card']} ({c['claim']}) · {c['task']}"
        with columns[i % 2]:
            rule_card(title, (experiment, c["claim"]), c, found["scale"], to)


def study_note(study: str) -> None:
    """The study's note and, for a study with a folder of its own, where its runs were made (the GPU, its driver,
    CUDA and torch, the dtype policy: from the runs' manifests)."""
    if study in STUDY_NOTES:
        st.caption(STUDY_NOTES[study])
    if study in results.OWN_FOLDER and (made := results.study_provenance(results.results_root(), study)):
        st.caption(f"**Provenance** (the runs' manifests): {results.provenance_text(made)}.")


def gpu_study(gpu: str) -> None:
    """The GPU study's own section beside a CPU study: its note, provenance and cards, from its own tables only."""
    st.divider()
    st.header(f"The GPU study (`{gpu}`), beside it")
    study_note(gpu)
    st.page_link(PAGES / "overview.py", label=f"Show the `{gpu}` study alone", icon=":material/arrow_forward:",
                 query_params={"study": gpu})  # fmt: skip
    for experiment in SECTIONS:
        if gpu in results.presets(experiment):
            section(experiment, gpu, f"{gpu} · ")
    for experiment in BEYOND:
        if gpu in results.presets(experiment):
            beyond_section(experiment, gpu, f"{gpu} · ")


def report_html(study: str | None) -> bytes:
    """The static report, built on click (dashboard.report imports the engine: not on this page's way)."""
    from dashboard import report

    return report.html_bytes(study)


st.title("loopscope: does depth stay reusable?")
st.markdown(
    "*Agreement rather than normalisation keeps depth reusable in looped language models.* Each card is one "
    "claim of the paper: its figure, ours from the cached results, the scale it was measured at, and a verdict."
)
studies = results.studies()
study = ui.pick_study(studies, key="study")  # not `preset`: Streamlit drops a link's parameter bound on this page
if studies:
    st.download_button(
        "Download report",
        data=lambda: report_html(study),
        file_name="loopscope-report.html",
        mime="text/html",
        key="report",
        on_click="ignore",
        icon=":material/download:",
        help="One self-contained HTML page: these claim cards, every figure (SVG), provenance and the commands "
        "that reproduce it; the same page as `loopscope report --out DIR --preset STUDY`.",
    )
if study:
    study_note(study)
for experiment in SECTIONS:
    section(experiment, study)
for experiment in BEYOND:
    beyond_section(experiment, study)
if study not in results.OWN_FOLDER:  # a GPU study present: its own section below the CPU study's
    for gpu in [s for s in studies if s in results.OWN_FOLDER][:1]:
        gpu_study(gpu)
