"""The verdict matrix: one row per claim, the paper's figure, then parity and chain, each cell the outcome per
analysis and the one number that decides it, linking to its page. The overview's first screen and the report's
first table are this one matrix (matrix_html), from dashboard.results.claims: the engine's one judge
(engine.experiments.verdicts.Claim). Cheap to import: no torch, no pandas, no Altair (the overview imports it)."""

from __future__ import annotations

import html
import re
import urllib.parse
from pathlib import Path

from dashboard import results
from engine import paper, studies

MEAN, HARDEST = results.LEVELS
TASKS = ("parity", "chain")  # parity first: the chain of the CPU studies is a parity-like control
SHORT = {"paper": "paper's", "paired": "paired"}
ROWS = (  # (experiment, claim (a prefix for E5's parts, one claim per distribution or rung), the row's words)
    ("e2", "a", "E2 (a) `none` never worse than `norm`"),
    ("e2", "b", "E2 (b) the two closest at n = T"),
    ("e2", "c", "E2 (c) separate on both sides, most beyond T"),
    ("e2", "d", "E2 (d) the surgery collapses at T"),
    ("e3", "a", "E3 (a) head refit: about a third, then a plateau"),
    ("e3", "b", "E3 (b) head + last layer: all of it"),
    ("e3", "last layer", "E3 the damage sits in the last layer"),
    ("e4", "equal n", "E4 looping helps at equal n"),
    ("e4", "matched", "E4 at matched overshoot: vanishes on one task, shrinks on the other"),
    ("e5", "train x run", "E5 1 · train mode × run mode"),
    (
        "e5",
        "contrast",
        "E5 · the train × run contrast at n = T: breaking agreement, the state bounded (none→norm), "
        "against removing the norm (norm→none)",
    ),
    ("e5", "agreement or growth", "E5 · agreement or state-norm growth: what the surgery breaks"),
    ("e5", "range", "E5 2 · training over a range of loop counts"),
    ("e5", "ladder", "E5 3 · the surgery's damage against scale"),
    ("e5", "rescale", "E5 4 · a zero-parameter rescale instead of the norm"),
)
# studies whose chain is the ordered single chain (docs/results.md): their entries say so
PARITY_LIKE_CHAIN = tuple(s.name for s in studies.STUDIES.values() if s.parity_like_chain)
PAGE = {"e2": "accuracy", "e3": "refit", "e4": "stacked", "e5": "agreement"}  # the URL path of each page
NUMBER = r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
# (experiment, claim, analysis or None for any) -> [(pattern, format)]: the number each rule reads, from `measured`
KEYS = {
    ("e2", "a", "paper"): [(rf"min delta ({NUMBER})", "min δ {}")],
    ("e2", "a", "paired"): [(rf"min mean d ({NUMBER})", "min d {}")],
    ("e2", "b", "paper"): [(rf"\|d\| ({NUMBER}) at n=T", "|d(T)| {}")],
    ("e2", "b", "paired"): [(rf"\|d\| ({NUMBER}) at n=T", "|d(T)| {}"), (rf"Wilcoxon p ({NUMBER})", "Wilcoxon p {}")],
    ("e2", "c", "paper"): [(rf"max delta below T ({NUMBER}), beyond ({NUMBER})", "δ {} below, {} beyond")],
    ("e2", "c", "paired"): [(rf"max mean d below T ({NUMBER}), beyond ({NUMBER})", "d {} below, {} beyond")],
    ("e2", "d", None): [
        (rf"^accuracy ({NUMBER})", "{} at T"),
        (rf"norm ratio ({NUMBER})x", "norm {}×"),
        (rf"top-token share ({NUMBER})", "share {}"),
    ],  # fmt: skip
    ("e3", "a", None): [
        (rf"^recovery ({NUMBER})", "recovery {}"),
        (r"plateau: (no|yes)", "plateau {}"),
        (r"only (\d+) seeds lost", "{} damaged seeds"),
    ],  # fmt: skip
    ("e3", "b", None): [(rf"^recovery ({NUMBER})", "recovery {}"), (r"only (\d+) seeds lost", "{} damaged seeds")],
    ("e3", "last layer", None): [(rf"minus head\+first ({NUMBER})", "{}"), (rf"Wilcoxon p ({NUMBER})", "p {}")],
    ("e4", "equal n", None): [(rf"mean gap ({NUMBER})", "gap {}")],
    ("e4", "matched", None): [
        (rf"matched gaps ({NUMBER}, {NUMBER}, {NUMBER}) \(o = 1, 2, 3\) vs ({NUMBER})", "gaps {} (o = 1–3) vs {}")
    ],  # fmt: skip
    ("e5", "range", None): [(rf"max \|mean\| ({NUMBER})", "max |none − norm| {}")],
    ("e5", "rescale", None): [
        (rf"^recovery ({NUMBER})", "recovers {}"),
        (r"only (\d+) seeds lost", "{} damaged seeds"),
    ],  # fmt: skip
    ("e5", "train x run", None): [
        (
            r"G significant and largest at (\d+%) of n below T, (\d+%) beyond",
            "agreement effect G largest at {} of n below T, {} beyond",
        )
    ],  # fmt: skip
    ("e5", "contrast", None): [
        (rf"D_fwd ({NUMBER}) \[[^\]]*\], D_rev ({NUMBER})", "norm→none loses {}, none→norm {}"),
        (r"\((\d+) of the design's (\d+) so far", "{} of {} seed pairs so far"),
        (r"would read (\w+)", "would read {}"),
    ],  # fmt: skip
}


def key_number(experiment: str, claim: str, analysis: str, measured: str) -> str:
    """The number the rule reads, from the claim's own `measured` text (never computed here): KEYS' patterns, joined;
    for E5's ladder the span of the damage at T over its rungs; else the text's first clause."""
    claim = next((c for c in GROUPED if claim.startswith(c + " ")), claim)
    if experiment == "e5" and claim == "ladder":
        at_t = re.findall(rf"params(?: \([^)]*\))?: n=\d+ ({NUMBER})", measured.split(" Post hoc")[0])
        if at_t:
            values = sorted(at_t, key=float)
            many = f"at T {values[0]} … {values[-1]} over {len(values)} rungs"
            return f"at T {values[0]}" if len(values) == 1 else many
    patterns = KEYS.get((experiment, claim, analysis)) or KEYS.get((experiment, claim, None)) or []
    found = []
    for pattern, form in patterns:
        if m := re.search(pattern, measured):
            found.append(form.format(*m.groups()))
    if found:
        return ", ".join(found)
    first = re.split(r";|\. | \(", measured)[0].strip()
    return first if len(first) <= 48 else first[:47] + "…"


GROUPED = ("range", "rescale", "ladder", "contrast")  # E5 rows whose claims are one per distribution, rung or metric


def _of_row(found: list[dict], claim: str) -> list[dict]:
    return [c for c in found if c["claim"] == claim or (claim in GROUPED and c["claim"].startswith(claim + " "))]


def _badges(experiment: str, claims: list[dict]) -> list[dict]:
    """One claim's cell entries at the held-out mean: one badge where every analysis gives the same outcome (the
    paper's number), else one per analysis (SHORT) with its own number; `hardest`: the hardest held-out level's
    outcome where it differs. E5's claims of one part (a distribution, a rung) each an entry, named by it."""
    out = []
    names = list(dict.fromkeys(c["claim"] for c in claims))
    for name in names:
        mine = [c for c in claims if c["claim"] == name]
        label = name.split(" ", 1)[1] if experiment == "e5" and " " in name and len(names) > 1 else ""
        at = {lvl: {c["analysis"]: c for c in mine if c["level"] == lvl} for lvl in (MEAN, HARDEST)}
        mean, hardest = at[MEAN] or at[HARDEST], at[HARDEST]
        if not mean:
            continue
        outcomes = {c["outcome"] for c in mean.values()}
        hard = {c["outcome"] for c in hardest.values()}
        note = f"hardest: {' / '.join(sorted(hard))}" if hard and hard != outcomes else ""
        if len(outcomes) == 1:
            first = mean.get("paper") or next(iter(mean.values()))
            number = key_number(experiment, name, first["analysis"], first["measured"])
            out.append({"prefix": label, "outcome": first["outcome"], "number": number, "hardest": note})
        else:
            said = ""
            for analysis, c in mean.items():
                number = key_number(experiment, name, analysis, c["measured"])
                prefix = f"{label} {SHORT.get(analysis, analysis)}".strip()
                shown = number.replace(said, "").strip(", ") if said else number  # a number once per cell
                out.append({"prefix": prefix, "outcome": c["outcome"], "number": shown, "hardest": ""})
                said = said or number
            if note:
                out[-1]["hardest"] = note
    return out


def href(experiment: str, claim: str, task: str, study: str) -> str:
    """The page a cell opens, at the study, the task and the level the verdict is stated at."""
    page = "norms" if (experiment, claim) == ("e2", "d") else PAGE[experiment]
    query = {"preset": study, "task": task}
    if experiment in ("e2", "e4"):
        query["difficulty"] = MEAN
    if experiment == "e4":
        query["axis"] = "ratio" if claim == "matched" else "n"
    return f"{page}?{urllib.parse.urlencode(query)}"


def rows(study: str, root: Path | None = None) -> list[dict]:
    """The matrix of one study: [{experiment, claim, label, paper, cells: {task: [entry] or None}, note}], the rows
    of ROWS whose experiment the study ran (a row whose experiment it did not run says so in `note`)."""
    out = []
    for experiment, claim, label in ROWS:
        tables = results.presets(experiment, root)
        if study not in tables:
            note = f"not part of the `{study}` study" if tables else "not run yet"
            out.append({"experiment": experiment, "claim": claim, "label": label, "paper": "", "cells": {},
                        "note": note})  # fmt: skip
            continue
        verdicts = results.claims(experiment, study, root)
        if _of_row(verdicts.get("withheld", []), claim):  # E5 while the study's recipe probe is open
            out.append({"experiment": experiment, "claim": claim, "label": label, "paper": "— (beyond the paper)",
                        "cells": {}, "note": "waits for the recipe probe (no recipe adopted yet)"})  # fmt: skip
            continue
        found = _of_row(verdicts["claims"], claim)
        if not found:
            continue
        cells = {}
        for task in TASKS:
            mine = [c for c in found if c["task"] == task]
            cells[task] = _badges(experiment, mine) if mine else None
        paper = "— (beyond the paper)" if experiment == "e5" else found[0]["paper"]
        out.append({"experiment": experiment, "claim": claim, "label": label, "paper": paper, "cells": cells,
                    "note": ""})  # fmt: skip
    return out


ELSEWHERE = "not part of the `"  # the note of a row whose experiment the study did not run (rows)


def apart(found: list[dict]) -> tuple[list[dict], list[dict]]:
    """rows' rows split: the study's own (judged, waiting or not run yet) and those of experiments it did not run,
    which the overview shows after its own, folded (issue 60: nine of them came first on the ladder study's)."""
    own = [r for r in found if not r["note"].startswith(ELSEWHERE)]
    return own, [r for r in found if r["note"].startswith(ELSEWHERE)]


def compact(row: dict, most: int = 3) -> dict:
    """An E5 row of more than `most` rungs, each one outcome, as one entry a cell: `8 of 8 rungs` with the outcome and
    the span of its number (`recovers 0.797 … 0.998`); rows of mixed outcomes, or fewer rungs, as they are."""
    cells = {}
    for task, entries in row["cells"].items():
        rungs = entries or []
        alike = len({e["outcome"] for e in rungs}) == 1 and not any(e["hardest"] for e in rungs)
        values = [re.search(NUMBER, e["number"]) for e in rungs]
        if len(rungs) <= most or not alike or not all(e["prefix"].endswith(" params") for e in rungs) or None in values:
            cells[task] = entries
            continue
        word = rungs[0]["number"][: values[0].start()].strip()
        low, high = sorted((v[0] for v in values), key=float)[:: len(values) - 1]
        cells[task] = [{"prefix": f"{len(rungs)} of {len(rungs)} rungs", "outcome": rungs[0]["outcome"],
                        "number": f"{word} {low} … {high}".strip(), "hardest": ""}]  # fmt: skip
    return row | {"cells": cells}


def folded(elsewhere: list[dict], study: str) -> list[dict]:
    """The rows of experiments the study did not run as one row after its own: their claims named short (`E2 (a),
    (b); E4 equal n`), its note theirs."""
    if not elsewhere:
        return []
    by: dict[str, list[str]] = {}
    for r in elsewhere:
        by.setdefault(r["experiment"].upper(), []).append(f"({r['claim']})" if len(r["claim"]) == 1 else r["claim"])
    names = "; ".join(f"{e} {', '.join(claims)}" for e, claims in by.items())
    where = sorted({t for r in elsewhere for t in results.presets(r["experiment"]) if t != study})
    note = f"{ELSEWHERE}{study}` study" + (f" (run in {', '.join(f'`{t}`' for t in where)})" if where else "")
    return [{"experiment": "", "claim": "", "label": names, "paper": "", "cells": {}, "note": note}]


_SLOPE = re.compile(rf"b = ({NUMBER}) per decade \[({NUMBER}), ({NUMBER})\]")
COLLAPSE_ORDER = ("collapses", "undecided", "no collapse")


def ladder_rows(rules: list[dict]) -> list[dict]:
    """The ladder rules' decisive readings (engine.experiments.ladder.rules, as mappings: claim, outcome, measured) as
    matrix rows on parity: the trend of the surgery's damage with scale at T and 3T, and the collapse per rung by E2
    (d)'s criteria, counted over the rungs (the E5 page lists every rule). Read, never judged, here: the outcomes and
    numbers are the rules' own."""
    trends = [r for r in rules if r["claim"].startswith("ladder trend at n=")]  # T, then 3T
    falls = [r for r in rules if r["claim"].startswith("collapse ")]
    out = []
    if trends:
        cells = []
        for name, r in zip(("at T", "at 3T"), trends, strict=False):
            slope = _SLOPE.search(r["measured"])
            said = r["measured"].split("so far ")[-1]  # a part-trained ladder's slope so far
            number = f"b = {slope[1]} per decade [{slope[2]}, {slope[3]}]" if slope else key_number("e5", "", "", said)
            cells.append({"prefix": name, "outcome": r["outcome"], "number": number, "hardest": ""})
        out.append({"experiment": "e5", "claim": "ladder trend", "label": "E5 3 · the damage's trend with scale "
                    "(grows: as normalisation predicts; flat: as agreement does)", "paper": "— (beyond the paper)",
                    "cells": {"parity": cells, "chain": None}, "note": "", "drill": False})  # fmt: skip
    if falls:
        by: dict[str, list[str]] = {}
        for r in falls:
            found = re.search(r"([\d,]+) params", r["claim"])
            by.setdefault(r["outcome"], []).append(found[1] if found else r["claim"])
        cells = []
        for outcome in sorted(by, key=lambda o: COLLAPSE_ORDER.index(o) if o in COLLAPSE_ORDER else 9):
            rungs = by[outcome]
            which = "" if len(rungs) == len(falls) or outcome == "no collapse" else f" ({', '.join(rungs)} params)"
            cells.append({"prefix": "", "outcome": outcome, "number": f"{len(rungs)} of {len(falls)} rungs{which}",
                          "hardest": ""})  # fmt: skip
        out.append({"experiment": "e5", "claim": "ladder collapse", "label": "E2 (d) the surgery collapses at T: per "
                    "rung, by E2 (d)'s criteria (median seed)", "paper": f"{paper.SURGERY_ACCURACY_AT_T:.3f}, norm ≤ "
                    f"{paper.SURGERY_NORM_RATIO}×, one token (Ouro)", "cells": {"parity": cells, "chain": None},
                    "note": "", "drill": False})  # fmt: skip
    return out


def with_ladder(own: list[dict], elsewhere: list[dict], rules: list[dict]) -> tuple[list[dict], list[dict]]:
    """apart's two lists with ladder_rows placed after E5 3's row (the damage it reads) and E2 (d)'s row, whose
    criteria the collapse row applies per rung, no longer among the rows the study did not run."""
    added = ladder_rows(rules)
    if not added:
        return own, elsewhere
    at = next((i + 1 for i, r in enumerate(own) if (r["experiment"], r["claim"]) == ("e5", "ladder")), 0)
    collapse = any(r["claim"] == "ladder collapse" for r in added)
    kept = [r for r in elsewhere if not (collapse and (r["experiment"], r["claim"]) == ("e2", "d"))]
    return own[:at] + added + own[at:], kept


DRILL = ("e2", "e4", "e5")  # verdicts over runs by seed and n (E3's refits: its page; E1: Ouro's): a cell opens them
KIND = {"green": "yes", "red": "no", "orange": "mixed", "gray": "none", "blue": "other"}
STYLE = """<style>
table.verdicts{border-collapse:collapse;width:100%;font-size:.8rem;line-height:1.25;table-layout:fixed}
.verdicts th{text-align:left;font-weight:600;border-bottom:2px solid #ccc;padding:3px 6px}
.verdicts td{border-bottom:1px solid #e4e4e4;padding:3px 6px;vertical-align:top}
.verdicts th.claim{width:25%}.verdicts th.paper{width:15%}.verdicts td.paper{color:#555}
.verdicts a{color:inherit;text-decoration:none;display:block}.verdicts a:hover{background:#f3f6fa}
.verdicts .b{display:inline-block;border-radius:8px;padding:0 7px;font-weight:600;font-size:.82rem;white-space:nowrap}
.verdicts .yes{background:#d8f0dc;color:#145a23}.verdicts .no{background:#f8d7d5;color:#7c1d16}
.verdicts .mixed{background:#fde6c8;color:#7a4300}.verdicts .none{background:#e6e6e6;color:#333}
.verdicts .other{background:#dbe8f8;color:#123f73}.verdicts .num{color:#333}.verdicts .hard{color:#777;font-size:.78rem}
.verdicts td.skip{color:#888;font-style:italic}
.verdicts a.vals{color:#1f5fa8;font-size:.72rem;display:inline}.verdicts .pre{color:#555;font-size:.76rem}
</style>"""


def _md(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def cell_html(entries: list[dict]) -> str:
    parts = []
    for e in entries:
        kind = KIND[results.OUTCOME_COLORS.get(e["outcome"], "blue")]
        prefix = f'<span class="pre">{html.escape(e["prefix"])}</span> ' if e["prefix"] else ""
        hard = f' <span class="hard">({html.escape(e["hardest"])})</span>' if e["hardest"] else ""
        parts.append(f'{prefix}<span class="b {kind}">{html.escape(e["outcome"])}</span> '
                     f'<span class="num">{html.escape(e["number"])}</span>{hard}')  # fmt: skip
    return "<br>".join(parts)


def tasks_run(found: list[dict]) -> tuple[str, ...]:
    """The tasks of TASKS some row of the matrix has a cell for (a study of parity alone: parity)."""
    return tuple(t for t in TASKS if any(r["cells"].get(t) for r in found)) or TASKS


def matrix_html(found: list[dict], study: str, links: bool = True, tasks: tuple[str, ...] = TASKS) -> str:
    """The matrix as one HTML table (the overview's st.html and the report alike); links: each cell opens its page;
    tasks: its columns (the overview leaves out a task no row has: tasks_run)."""
    body = []
    for row in found:
        head = f'<td class="claim">{_md(row["label"])}</td><td class="paper">{_md(row["paper"])}</td>'
        if row["note"]:
            body.append(f'<tr>{head}<td class="skip" colspan="{len(tasks)}">{_md(row["note"])}</td></tr>')
            continue
        cells = []
        for task in tasks:
            entries = row["cells"].get(task)
            if not entries:
                cells.append('<td class="skip">not run</td>')
                continue
            inner = cell_html(entries)
            if links:
                to = html.escape(href(row["experiment"], row["claim"], task, study))
                inner = f'<a href="{to}" target="_self">{inner}</a>'
                if row["experiment"] in DRILL and row.get("drill", True):  # the values the rule read, on the overview
                    which = f"{row['experiment']}:{row['claim']}:{task}"
                    opened = urllib.parse.urlencode({"study": study, "verdict": which})
                    inner += f'<a class="vals" href="./?{html.escape(opened)}" target="_self">values ↓</a>'
            cells.append(f'<td class="{task}">{inner}</td>')
        body.append(f"<tr>{head}{''.join(cells)}</tr>")
    names = {"chain": "chain (parity-like control)"} if study in PARITY_LIKE_CHAIN else {}
    columns = "".join(f"<th>{names.get(t, t)}</th>" for t in tasks)
    header = f'<tr><th class="claim">claim</th><th class="paper">paper</th>{columns}</tr>'
    return f'{STYLE}<table class="verdicts"><thead>{header}</thead><tbody>{"".join(body)}</tbody></table>'
