"""Each claim of the paper as a card: the paper's figure, the measured one, the scale, a verdict, a link."""

from pathlib import Path

import streamlit as st

from dashboard import data, ui
from engine import paper

PAGES = Path(__file__).resolve().parent
ACCURACY, NORMS = PAGES / "accuracy.py", PAGES / "norms.py"
PENDING = [  # each experiment's claim as the paper states it; once its table exists, the engine's verdicts
    {
        "experiment": "e3",
        "title": "E3 · readout refit",
        "text": "Norm-trained models run without the norm lose accuracy; refitting the head alone recovers about "
        "a third and plateaus, refitting the head with the block's last layer recovers all of it.",
        "paper": "recovery: head ≈ 1/3 (plateau); head + last layer ≈ 1",
        "command": "loopscope run e3 --preset cpu",
        "page": PAGES / "refit.py",
    },
    {
        "experiment": "e4",
        "title": "E4 · looped vs stacked",
        "text": "Against a stacked model of equal trained depth, compared at matched overshoot n / T, the advantage "
        "of looping vanishes on one task and shrinks on the other.",
        "paper": "at matched n / T: advantage gone on one task, smaller on the other",
        "command": "loopscope run e4 --preset cpu",
        "page": PAGES / "stacked.py",
    },
    {
        "experiment": "e1",
        "title": "E1 · released Ouro weights",
        "text": f"Removing the boundary norm from Ouro-1.4B and Ouro-2.6B (T = {paper.TRAINED_LOOPS_OURO}) takes "
        f"accuracy to {paper.SURGERY_ACCURACY_AT_T:.3f} by n = T, while the state norm stays within a factor "
        f"{paper.SURGERY_NORM_RATIO} and the head commits to one token.",
        "paper": f"accuracy {paper.SURGERY_ACCURACY_AT_T:.3f} at n = T = {paper.TRAINED_LOOPS_OURO} (both models); "
        f"norm ratio ≤ {paper.SURGERY_NORM_RATIO}×",
        "command": "loopscope ouro --model ByteDance/Ouro-1.4B ...",
        "page": PAGES / "ouro.py",
    },
]
VERDICTS = {
    True: ("reproduced", "green", ":material/check_circle:"),
    False: ("not reproduced", "red", ":material/cancel:"),
    None: ("not run yet", "gray", ":material/hourglass_empty:"),
    "pending": ("no verdict yet", "blue", ":material/help:"),
}


def card(title: str, text: str, paper: str, measured: str, scale: str, verdict, link: dict) -> None:
    label, color, icon = VERDICTS[verdict]
    with st.container(border=True):
        st.markdown(f"**{title}** &nbsp; :{color}-badge[{icon} {label}]  \n{text}")
        st.markdown(f"**Paper:** {paper}  \n**Measured:** {measured}  \n**Scale:** {scale}")
        st.page_link(**link)


def e2_scale(table: data.Table) -> str:
    rows = table.rows
    per_mode = rows[rows["boundary"].isin(["norm", "none"])].groupby("boundary")["seed"].nunique()
    seeds = table.seeds
    return f"{table.preset} preset, {per_mode.min()} seeds per mode (seeds {seeds[0]}–{seeds[-1]})"


st.title("loopscope: does depth stay reusable?")
st.markdown(
    "*Agreement rather than normalisation keeps depth reusable in looped language models.* Each card is one "
    "claim of the paper: its figure, ours from the cached results, the scale it was measured at, and a verdict."
)

if data.catalog():
    st.download_button(
        "Download report",
        data=lambda: data.report_html(),
        file_name="loopscope-report.html",
        mime="text/html",
        key="report",
        on_click="ignore",
        icon=":material/download:",
        help="One self-contained HTML page: these claim cards, every figure (SVG), provenance and the commands "
        "that reproduce it; the same page as `loopscope report --out DIR`.",
    )

st.header("E2 · norm vs none, from scratch")
preset = ui.pick_preset("e2")
if preset == "cpu-1layer":
    st.caption(
        "The first CPU study, kept as an earlier design: one layer per block, in-range items mostly seen in "
        "training (no held-out split), and a **parity-like control** for the chain (one ordered chain: the answer "
        "is the root bit XOR the parity of the `not`s). The second design (preset `cpu`) replaces it."
    )
elif preset == "cpu":
    st.caption(
        "The second CPU study: held-out in-range items, two layers per block. Its chain is the ordered single "
        "chain, a **parity-like control**: no chain that needs retrieval by name trained at this size within the "
        "search budget (held-out k = 1..4 at chance, dev/LOG.md). The retrieval chain runs at the paper preset."
    )
found, problems = data.claims("e2", preset) if preset else ([], [])
for problem in problems:
    st.error(problem)
if not found:
    ui.not_run_yet("E2 trains both boundary modes from scratch over many seeds.", "loopscope run e2 --preset cpu")
else:
    scale = e2_scale(data.table("e2", preset))
    for i, claim in enumerate(found):
        if i % 2 == 0:  # a new row of two cards, so neighbours line up
            columns = st.columns(2)
        page = NORMS if claim["claim"] == "d" else ACCURACY
        link = {
            "page": page,
            "label": "Norm trajectories" if page == NORMS else "Accuracy vs depth",
            "icon": ":material/arrow_forward:",
            "query_params": {"task": claim["task"], **({"preset": preset} if len(data.presets("e2")) > 1 else {})},
        }
        with columns[i % 2]:
            card(
                f"E2 ({claim['claim']}) · {claim['task']}",
                claim["text"],
                claim["paper"],
                claim["measured"],
                scale,
                bool(claim["reproduced"]),
                link,
            )

st.header("E3, E4, E1")
columns = st.columns(len(PENDING))
for column, claim in zip(columns, PENDING, strict=True):
    presets = data.presets(claim["experiment"])
    link = {"page": claim["page"], "label": "Open the page", "icon": ":material/arrow_forward:"}
    with column:
        if not presets:
            card(claim["title"], claim["text"], claim["paper"], f"not run yet: `{claim['command']}`", "—", None, link)
            continue
        found, problems = data.claims(claim["experiment"], presets[0])
        table = data.table(claim["experiment"], presets[0])
        scale = ui.scale_note(table) if table.rows is not None else "—"
        if found:  # the engine reports this experiment's claims: one card each
            for c in found:
                title = f"{claim['title']} ({c['claim']}) · {c['task']}"
                card(title, c["text"], c["paper"], c["measured"], scale, bool(c["reproduced"]), link)
            continue
        measured = "; ".join(problems) or (
            "the table exists; the engine has no verdict for it yet (`engine."
            f"{claim['experiment']}.claims`) — see the page"
        )
        card(claim["title"], claim["text"], claim["paper"], measured, scale, "pending", link)
