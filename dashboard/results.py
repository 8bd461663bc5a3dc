"""Which result tables exist, and the verdicts the overview shows: cheap to import (no torch, no scipy, no Altair).

The overview is the first page a reader sees, so it imports only this module (and Streamlit): the engine,
which pulls in torch, scipy and pandas, is imported only when a table's verdicts must be computed. Computed
verdicts are bound to the table they judge: each is keyed on the SHA-256 of the table's bytes and RULES_VERSION
(the rules' version, bumped by hand with any change to what a verdict reads or says; never the bytes of source
files, so reformatting a module leaves them current). They are found, in this order: in the table's folder's
`verdicts.json` (SHIPPED: written by `python -m dashboard.results ROOT --ship` when results are shipped; never
brought by `loopscope pull` or `merge`: what comes from elsewhere is judged here); in cache_dir() (JSON under the
same key), so a new server process shows unchanged results without recomputing them; else computed. A changed
table or rule version is never served stale: its key no longer matches.

Everything read from a file or a URL that a page puts into Markdown goes through as_text (a value, never a link).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from pathlib import Path

import streamlit as st

from engine import studies

if not st.runtime.exists():  # a command (loopscope report, --ship), not a server: the in-memory cache is expected
    logging.getLogger("streamlit.runtime.caching.cache_data_api").setLevel(logging.ERROR)

# A results table's file name: the experiment, then the study (or E1's model slug) in lowercase letters, digits, '.',
# '_' and '-', never a web address: pages and the report name a table and its study by it, so a file named otherwise
# (a pulled one, say) is no table of the dashboard's and cannot put markup or a link on a page
TABLE_NAME = re.compile(r"^(e\d+)-((?!.*www\.)[a-z0-9][a-z0-9._-]{0,63})\.parquet$")
RUN_KEY = re.compile(r"[0-9a-f]{16}")  # a run key as the store names its folders (engine.core.store)
# Each study's facts are its entry in engine.studies (torch-free, so the overview may import it). The default study:
# the largest present that has an E2 table (default_study), by the entries' order
SCALE_ORDER = tuple(studies.by_order())
# Studies whose runs and tables live in a folder of their own under the results folder. Only these subfolders are
# read: never an arbitrary folder under the results folder.
OWN_FOLDER = studies.own_folders()
GPU_STUDIES = tuple(s.name for s in studies.STUDIES.values() if s.device == "GPU")  # designed for a GPU
# A study's ladder that continues a lower study's, on the same task and budget T (docs/gpu-study.md: the bridge rung
# runs on both devices): the E5 ladder figure draws the two together, each point marked by its device
LADDER_PARTNER = {s.name: s.ladder_partner for s in studies.STUDIES.values() if s.ladder_partner}
# A study's recipe probe record, in its folder: engine.experiments.runs.RECIPE_PROBE_FILE (repeated here as
# OWN_FOLDER is; tests/test_cpu_ladder.py checks that the two agree)
RECIPE_PROBE_FILE = "recipe-probe.json"
# A study whose recipe a probe adopts (<study folder>/recipe-probe.json): the recipe its partner's rungs were trained
# with. The partner continues its ladder only if the probe adopted the same one; else the study trains those rungs
# itself (engine.experiments.e5.continues, which compares the configs; tests/test_cpu_ladder.py checks they agree)
PARTNER_RECIPE = {s.name: s.partner_recipe for s in studies.STUDIES.values() if s.partner_recipe}
# The verdict rules' version, with the table's SHA-256 the key of every stored verdict (SHIPPED, cache_dir). Bump it
# by hand in the commit that changes what any verdict reads or says (engine/paper.py's thresholds, engine/core/stats.py,
# engine/experiments/verdicts.py, an experiment's claims, scale_of here), and reship (`python -m dashboard.results
# cached_results --ship`): tests/test_untrusted.py fails where a shipped verdict differs from a fresh computation.
RULES_VERSION = 2  # 2: a test that cannot reach p < 0.05, or two refits both at the ceiling, read undecided
JOINER = "\u2060"  # WORD JOINER: invisible, breaks nothing a reader sees, and no autolink reads through it
# where a web or mail address would begin to be a link: before every ':' (https:, mailto:), between `www` and its
# dot, after every '@'
ADDRESS = re.compile(r"(?=:)|(?<=[wW]{3})(?=\.)|(?<=@)")


def as_text(value, most: int = 80) -> str:
    """A value that came from elsewhere (a URL's parameter, a text box, a manifest, a probe record, a file's name),
    for a Markdown body (st.markdown, st.caption, st.warning, ...): shown as the text it is, never as a link, an image,
    HTML, an icon or a formula. Every ASCII punctuation mark is escaped (CommonMark's backslash escapes), line breaks
    become spaces, and a web or mail address is broken by an invisible WORD JOINER (GitHub's autolinks, which
    Streamlit's Markdown finds in the text after the escapes are resolved, no longer match); at most `most`
    characters."""
    text = " ".join(str(value).split())
    text = text if len(text) <= most else text[: most - 1] + "…"
    text = ADDRESS.sub(JOINER, text)
    return "".join(f"\\{c}" if c.isascii() and not c.isalnum() and not c.isspace() else c for c in text)


def plain_name(name, most: int = 40) -> str:
    """A file's or folder's name for a label that a chart and Markdown both show (a legend, a heading, a caption):
    its letters, digits, spaces, '.', '_' and '-', any other character as '_', no web address (a WORD JOINER where
    one would begin): the same text in either."""
    return ADDRESS.sub(JOINER, re.sub(r"[^\w .-]", "_", str(name))[:most])


def results_root() -> Path:
    return Path(os.environ.get("LOOPSCOPE_RESULTS", "cached_results"))


def study_root(root: Path, preset_name: str) -> Path:
    """The store a study's runs and tables live in under the results folder (engine.core.presets.study_root)."""
    return Path(root) / OWN_FOLDER[preset_name] if preset_name in OWN_FOLDER else Path(root)


def table_path(root: Path, experiment: str, preset_name: str) -> Path:
    """Where the engine writes the table of `experiment` at `preset_name`: in the study's own folder, if it has one."""
    return study_root(root, preset_name) / f"{experiment}-{preset_name}.parquet"


def device_of(preset_name: str) -> str:
    """The device a study was designed for."""
    return "GPU" if preset_name in GPU_STUDIES else "CPU"


def run_on(preset_name: str, root: Path | None = None) -> str:
    """The device and precision a study's runs trained with, from the manifests of its tables' runs (a GPU trains
    under bf16 autocast; the CPU in the config's train.precision, fp32 where a config leaves it out); where none of
    its runs is stored, the study's design (a GPU study on a GPU, the others on the CPU in fp32)."""
    root = Path(root) if root is not None else results_root()
    named = ((t, TABLE_NAME.match(Path(t[0]).name)) for t in tables_state(root))
    tables = tuple(t for t, m in named if m and m.group(1) != "e1" and m.group(2) == preset_name)
    found = _run_on(str(study_root(root, preset_name)), str(root), tables)
    return found or ("GPU, bf16 autocast" if device_of(preset_name) == "GPU" else "CPU, fp32")


@st.cache_data(max_entries=16, show_spinner=False)
def _run_on(folder: str, root: str, tables: tuple) -> str:
    """run_on's reading: each device and precision among the runs of `tables` (paths under root) stored in folder,
    most runs first, joined by '; ' ('' where none is stored)."""
    import pyarrow.parquet as pq

    keys: set[str] = set()
    for name, *_ in tables:
        try:
            keys |= {k for k in pq.read_table(Path(root) / name, columns=["run_key"]).column(0).to_pylist() if k}
        except Exception:  # a damaged table: its page says so
            continue
    counts: dict[str, int] = {}
    for key in sorted(k for k in keys if isinstance(k, str) and re.fullmatch(r"[0-9a-f]{16}", k)):
        try:
            m = json.loads((Path(folder) / "runs" / key / "manifest.json").read_text())
            train = (m.get("config") or {}).get("train") or {}
            gpu = str(m.get("device", "")).startswith("cuda")
            precision = train.get("precision") or "fp32"  # a manifest's word, shown only where it is one of these
            how = "GPU, bf16 autocast" if gpu else f"CPU, {precision if precision in ('fp32', 'bf16') else '?'}"
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        counts[how] = counts.get(how, 0) + 1
    return "; ".join(sorted(counts, key=lambda h: -counts[h]))


def by_device(tables: dict) -> dict:
    """{study: its E5 rows} as {device ('cpu' or 'gpu'): the rows of that device's studies together}: one device's
    ladder may span studies (the `cpu` study's rungs to 412k and the `cpu-ladder` study's above)."""
    import pandas as pd

    out: dict[str, list] = {}
    for study, rows in tables.items():
        out.setdefault(device_of(study).lower(), []).append(rows)
    return {device: pd.concat(frames, ignore_index=True) for device, frames in out.items()}


def ladder_partners(preset_name: str) -> list[str]:
    """The studies on the other device whose E5 ladder continues this one's (LADDER_PARTNER, read both ways)."""
    return [LADDER_PARTNER[preset_name]] if preset_name in LADDER_PARTNER else [
        gpu for gpu, cpu in LADDER_PARTNER.items() if cpu == preset_name]  # fmt: skip


def reads_ladder_rules(preset_name: str, root: Path | None = None) -> bool:
    """Whether the GPU study's rules over the ladder are shown for this study (the E5 page and the report alike): its
    ladder continues another study's (its entry's ladder_partner), or another's continues it in this folder."""
    return preset_name in LADDER_PARTNER or ladder_partner(preset_name, root) is not None


def ladder_partner(preset_name: str, root: Path | None = None) -> str | None:
    """The first of ladder_partners whose E5 table the results folder holds (the largest first) and whose recipe
    agrees with this study's (PARTNER_RECIPE), or None."""
    found = presets("e5", root)
    return next((p for p in ladder_partners(preset_name) if p in found and same_recipe(preset_name, p, root)), None)


def same_recipe(study: str, partner: str, root: Path | None) -> bool:
    """False where either study's probe adopted another recipe than the one PARTNER_RECIPE says the other's rungs
    were trained with (an open probe, or none, leaves them partners)."""
    for own in (study, partner):
        adopted = (probe_record(own, root) or {}).get("adopted")
        if own in PARTNER_RECIPE and adopted and adopted != PARTNER_RECIPE[own]:
            return False
    return True


def partner_sentence(study: str, root: Path | None = None) -> str:
    """For a study whose ladder continues a partner's trained under another recipe (its entry's partner_recipe):
    whether the probe's recipe keeps the partner's rungs (same_recipe) or the study trained them itself; "" for
    any other study."""
    partner = LADDER_PARTNER.get(study)
    if study not in PARTNER_RECIPE or not partner:
        return ""
    if same_recipe(study, partner, root):
        return f"Its lower rungs are the `{partner}` study's; the rules read both."
    return (
        f"The probe adopted another recipe than the `{partner}` study's, so this study trained its lower rungs "
        "itself, under the adopted one; the rules read its own ladder alone."
    )


def tables_state(root: Path) -> tuple:
    """(path relative to root, size, mtime) of every experiment table in root and in its studies' own folders
    (OWN_FOLDER) where the engine writes it: the cache key that changes when they do."""
    if not root.is_dir():
        return ()
    found = []
    for folder in dict.fromkeys([Path(root), *(Path(root) / f for f in OWN_FOLDER.values())]):
        for p in folder.glob("e*-*.parquet") if folder.is_dir() else ():
            m = TABLE_NAME.match(p.name)
            if m and table_path(root, m.group(1), m.group(2)) == p:  # e.g. no gpu table outside gpu/
                found.append((p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns))
    return tuple(sorted(found))


def catalog(root: Path | None = None) -> dict[str, list[str]]:
    """{experiment: the presets (scales) at which its table exists under root, largest first}."""
    found: dict[str, list[str]] = {}
    for name, *_ in tables_state(Path(root) if root is not None else results_root()):
        if m := TABLE_NAME.match(Path(name).name):
            found.setdefault(m.group(1), []).append(m.group(2))
    order = {n: i for i, n in enumerate(SCALE_ORDER)}
    return {e: sorted(p, key=lambda n: (order.get(n, len(order)), n)) for e, p in sorted(found.items())}


def presets(experiment: str, root: Path | None = None) -> list[str]:
    return catalog(root).get(experiment, [])


def studies(root: Path | None = None) -> list[str]:
    """Every preset with at least one experiment table, largest first: the studies this folder holds (E1's
    tables are named by the probed model, not by a study)."""
    order = {n: i for i, n in enumerate(SCALE_ORDER)}
    found = {p for e, ps in catalog(root).items() if e != "e1" for p in ps}
    return sorted(found, key=lambda n: (order.get(n, len(order)), n))


def default_study(root: Path | None = None) -> str | None:
    """The study a reader sees first: the largest that has an E2 table (the paper's experiment, every claim card
    of the overview's first section), else the largest present."""
    found, with_e2 = studies(root), presets("e2", root)
    return next((s for s in found if s in with_e2), found[0] if found else None)


PROVENANCE = ("device", "GPU", "capability", "driver", "CUDA", "torch", "dtype policy")  # study_provenance's columns


def study_provenance(root: Path, preset_name: str) -> list[dict]:
    """Where a study's runs and refits were made, from their manifests (JSON only, no torch): one row per distinct
    PROVENANCE (GPU fields from the manifest's `gpu` and `dtype_policy` where it has them, else "—") with `runs`,
    the number of manifests, most first. Only a study with a folder of its own has runs of its own alone."""
    folder = study_root(root, preset_name)
    paths = sorted([*folder.glob("runs/*/manifest.json"), *folder.glob("refits/*/manifest.json")])
    state = []
    for path in paths:
        try:
            state.append((str(path), path.stat().st_mtime_ns))
        except OSError:  # removed while listed
            continue
    return _provenance(tuple(state))


@st.cache_data(max_entries=8, show_spinner=False)
def _provenance(state: tuple) -> list[dict]:
    counts: dict[tuple, int] = {}
    for path, _ in state:
        try:
            m = json.loads(Path(path).read_text())
            gpu = m.get("gpu") if isinstance(m.get("gpu"), dict) else {}
            torch = gpu.get("torch") or (m.get("versions") or {}).get("torch")
            row = (m.get("device"), gpu.get("name"), gpu.get("capability"), gpu.get("driver"), gpu.get("cuda"), torch,
                   m.get("dtype_policy"))  # fmt: skip
        except (OSError, ValueError, AttributeError, RecursionError):  # not a manifest of a run: not counted
            continue
        row = tuple(" ".join(str(v).split())[:160] if v not in (None, "") else "—" for v in row)
        counts[row] = counts.get(row, 0) + 1
    found = [dict(zip(PROVENANCE, row, strict=True), runs=n) for row, n in counts.items()]
    return sorted(found, key=lambda r: -r["runs"])


def provenance_text(rows: list[dict]) -> str:
    """study_provenance's rows in one line of Markdown for a reader: the GPU, its capability, driver, CUDA and torch,
    the dtype policy, and how many runs, each value as the manifests' text (as_text); '' where there are none."""
    parts = []
    for row in rows:
        r = {k: as_text(v, 160) if k != "runs" else v for k, v in row.items()}
        gpu = (f"{r['GPU']} (compute capability {r['capability']}), driver {r['driver']}, CUDA {r['CUDA']}"
               if row["GPU"] != "—" else r["device"])  # fmt: skip
        policy = f"; dtype policy: {r['dtype policy']}" if row["dtype policy"] != "—" else ""
        parts.append(f"{gpu}, torch {r['torch']}{policy} ({r['runs']} run{'s' if r['runs'] != 1 else ''})")
    return "; ".join(parts)


def scale_of(experiment: str, preset_name: str, rows) -> str:
    """The scale a verdict was measured at: table, preset, seeds (per mode for E2)."""
    seeds = sorted(int(s) for s in rows["seed"].unique())
    span = f"seeds {seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}" if seeds else "no seeds"
    stand_in = "" if experiment == "e1" or has_heldout(rows) else "; no held-out items: its in-range items stand in"
    if experiment == "e2":
        per_mode = rows[rows["boundary"].isin(["norm", "none"])].groupby("boundary")["seed"].nunique()
        return f"{preset_name} preset, {per_mode.min()} seeds per mode ({span}{stand_in})"
    count = f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"
    return f"`{experiment}-{preset_name}.parquet`: **{preset_name}** preset, {count} ({span}{stand_in})"


def probe_open(study: str, root: Path | None = None) -> str | None:
    """Where a study's recipe probe (engine.runtime.cpu_ladder: <study folder>/recipe-probe.json) has adopted no
    recipe yet: one sentence saying so, with each candidate's scores; None where it has one or the study has none.
    Until then the study's own rung is a rejected candidate's probe runs, not the ladder's: its figures leave the
    rung out and the ladder's rules wait."""
    probe = probe_record(study, root)
    if probe is None or probe["adopted"]:
        return None
    below = all(c["outcome"] == "rejected" for c in probe["candidates"].values())
    return (
        f"The `{study}` study's recipe probe has adopted no recipe yet (held-out accuracy at n = T per seed: "
        f"{_probe_scores(probe)}; the rule: {as_text(probe['rule'], 200)}). "
        + (
            "No candidate reached the bar, so the study is **recipe below the bar**: the rule adopts the best of them "
            "by the mean over seeds 0–3, once the seeds the early stop skipped are trained. "
            if below
            else ""
        )
        + "Its own rung here is a rejected candidate's probe runs, not the ladder's: the figures leave it out and the "
        "ladder's rules wait for the adopted recipe (docs/gpu-study.md)."
    )


def recipe_below_bar(study: str, root: Path | None = None) -> str | None:
    """Where a study's recipe probe adopted the best of its candidates because none reached the bar
    (engine.runtime.cpu_ladder.below_bar): the label every figure of it carries, with each candidate's scores;
    None elsewhere."""
    probe = probe_record(study, root)
    if probe is None or not probe["adopted"] or not probe["below_bar"]:
        return None
    return (
        f"**Recipe below the bar.** No candidate of the `{study}` study's recipe probe reached its bar ("
        f"{as_text(probe['rule'], 200)}; held-out accuracy at n = T per seed: {_probe_scores(probe)}), so the rule "
        f"adopted the best of them, {as_text(probe['adopted'])}, for every rung (docs/gpu-study.md)."
    )


def probe_rows(study: str, root: Path | None = None) -> list[dict]:
    """A study's recipe probe seed by seed, one row per candidate in the rule's order: its held-out accuracy at n = T
    per seed ("—" for a seed not run), the range its mean over the probe's seeds can still take (as the engine wrote
    it: the seeds not run at 0 and at 1.0, what the rule's early stops and its best of three read) and its outcome.
    Plain text for a table (st.dataframe, the report's HTML table); [] where it has none."""
    probe, out = probe_record(study, root), []
    if probe is None:
        return out
    # a record written before it carried `seeds` and `mean_range` (2026-12-06): its scores, and no range
    seeds = probe["seeds"] or max(len(c["scores"]) for c in probe["candidates"].values())
    for name, c in probe["candidates"].items():
        scores = c["scores"]
        row = {"candidate": name} | {f"seed {s}": f"{scores[s]:.4f}" if s < len(scores) else "—" for s in range(seeds)}
        low, high = c["mean_range"] or (None, None)
        mean = ("—" if low is None else f"{low:.3f}" if len(scores) == seeds
                else f"{low:.3f}–{high:.3f} ({len(scores)} of {seeds} seeds)")  # fmt: skip
        outcome = c["outcome"]
        if probe["adopted"] == name:
            outcome = f"{outcome}; adopted as the best (recipe below the bar)" if probe["below_bar"] else "adopted"
        out.append(row | {f"mean over seeds 0–{seeds - 1}": mean, "outcome": outcome})
    return out


PROBE_MOST = 64  # a probe record's candidates, and seeds a candidate: at most this many (the rule's are 3 and 4)


def probe_record(study: str, root: Path | None) -> dict | None:
    """A study's recipe-probe.json (engine.runtime.cpu_ladder) in the shape its readers use: {rule, seeds, adopted,
    below_bar, candidates: {name: {scores, mean_range, outcome, runs}}}, each field of its type (None, False, "?" or
    [] where an older record lacks it); None where the study has none or it is not one (probe_problem says why)."""
    return _probe(study, root)[0]


def probe_problem(study: str, root: Path | None = None) -> str | None:
    """One sentence where a study's recipe-probe.json exists and is not a probe record as the engine writes it (not
    JSON, nested too deep, a field of the wrong type): the pages show it and leave the probe out; `loopscope report`
    stops with it (exit 2). None where it reads, or where there is none."""
    return _probe(study, root)[1]


def _probe(study: str, root: Path | None) -> tuple[dict | None, str | None]:
    folder = OWN_FOLDER.get(study)
    path = (Path(root) if root is not None else results_root()) / folder / RECIPE_PROBE_FILE if folder else None
    if path is None or not path.is_file():
        return None, None
    where = f"{folder}/{RECIPE_PROBE_FILE}"
    try:
        with path.open("rb") as f:
            data = f.read(2**20 + 1)
        shaped, why = _probe_shape(json.loads(data)) if len(data) <= 2**20 else (None, "is larger than 1 MiB")
    except (OSError, ValueError, RecursionError) as e:
        shaped, why = None, "is nested too deep" if isinstance(e, RecursionError) else "is not readable JSON"
    if shaped is None:
        return None, (f"{where} {why}, not a recipe probe record as engine.runtime.cpu_ladder writes it, so the "
                      "study's probe is left out; restore the file (git checkout) or run the probe again.")  # fmt: skip
    return shaped, None


def _real(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _probe_shape(probe) -> tuple[dict | None, str]:
    """(the record in probe_record's shape, "") or (None, what is wrong with it)."""
    if not isinstance(probe, dict):
        return None, f"is a JSON {type(probe).__name__}, not an object"
    given = probe.get("candidates")
    if not isinstance(given, dict) or not 0 < len(given) <= PROBE_MOST:
        return None, f"names no candidates (or more than {PROBE_MOST})"
    candidates = {}
    for name, c in given.items():
        scores = c.get("scores") if isinstance(c, dict) else None
        if not isinstance(scores, list) or len(scores) > PROBE_MOST or not all(_real(x) for x in scores):
            return None, "has a candidate without a list of scores"
        spread = c.get("mean_range")
        if spread is not None and not (isinstance(spread, list) and len(spread) == 2 and all(map(_real, spread))):
            return None, "has a candidate whose mean_range is not two numbers"
        if not isinstance(c.get("outcome", "?"), str):
            return None, "has a candidate whose outcome is not text"
        runs = c.get("runs", [])  # the run keys of its seeds, in seed order (data.probe_losses reads their curves)
        if not (isinstance(runs, list) and len(runs) <= PROBE_MOST and all(RUN_KEY.fullmatch(str(k)) for k in runs)):
            return None, "has a candidate whose runs are not run keys"
        candidates[name] = dict(scores=scores, mean_range=spread, outcome=c.get("outcome", "?"), runs=runs)
    seeds, adopted = probe.get("seeds"), probe.get("adopted")
    if seeds is not None and not (isinstance(seeds, int) and not isinstance(seeds, bool) and 0 < seeds <= PROBE_MOST):
        return None, "has a number of seeds that is not a count"
    if adopted is not None and not (isinstance(adopted, str) and adopted in candidates):
        return None, "adopts a recipe that is not one of its candidates"
    if not isinstance(probe.get("below_bar", False), bool) or not isinstance(probe.get("rule", "?"), str):
        return None, "has a below_bar or rule of the wrong type"
    return dict(rule=probe.get("rule", "?"), seeds=seeds, adopted=adopted, below_bar=probe.get("below_bar", False),
                candidates=candidates), ""  # fmt: skip


def _probe_scores(probe: dict) -> str:
    """Each candidate's scores per seed and outcome, with its mean once all the probe's seeds are in (Markdown: the
    record's words as text)."""
    said = []
    for name, c in probe["candidates"].items():
        scores = c["scores"]
        mean = f", mean {sum(scores) / len(scores):.2f}" if scores and len(scores) == probe["seeds"] else ""
        said.append(f"{as_text(name)}: {', '.join(f'{x:.2f}' for x in scores)} ({as_text(c['outcome'])}{mean})")
    return "; ".join(said)


def has_heldout(rows) -> bool:
    """A table of the second design: rows carry `split` and some items are held out."""
    return "split" in rows and bool((rows["split"] == "heldout").any())


def claims_of(experiment: str, rows, preset_name: str) -> tuple[str | None, list[dict]]:
    """(rules, claims) for one table: REGISTRY[experiment].claims(rows, preset), the experiment's one judge, as
    dicts (engine.experiments.verdicts.Claim's fields); rules "verdicts" (docs/design.md's rules, cards per analysis and
    level: E2-E4) or "e5" (E5's own rules), else (None, []) for an experiment without verdicts (E1)."""
    from engine.experiments import NAMES

    if experiment not in NAMES:  # E1: no verdicts, and no reason to import the experiments (torch)
        return None, []
    from engine.experiments import REGISTRY  # the experiment modules (and torch): only where claims are computed

    found = [c.as_dict() for c in REGISTRY[experiment].claims(rows, preset_name)]
    return ("e5" if experiment == "e5" else "verdicts"), found


def _compute_claims(path: Path, experiment: str, preset_name: str) -> dict:
    import pandas as pd

    found = {"rules": None, "claims": [], "problems": [], "scale": "—"}
    try:
        rows = pd.read_parquet(path)
        found["scale"] = scale_of(experiment, preset_name, rows)
    except Exception as e:  # any damage: the pages say the same
        found["problems"].append(
            f"`{path.name}` could not be read ({type(e).__name__}); "
            f"rerun `loopscope run {experiment} --preset {preset_name}` to rewrite it."
        )
        return found
    try:
        found["rules"], found["claims"] = claims_of(experiment, rows, preset_name)
    except Exception as e:  # a table too small or too odd to summarise is a message, not a crash
        found["problems"].append(f"`{path.name}` could not be summarised ({type(e).__name__}: {e}).")
    return found


def cache_dir() -> Path:
    """Where computed verdicts are kept between server processes: $LOOPSCOPE_CACHE, else ~/.cache/loopscope."""
    return Path(os.environ.get("LOOPSCOPE_CACHE") or Path.home() / ".cache" / "loopscope")


@st.cache_data(max_entries=32, show_spinner=False)
def _claims(path: str, experiment: str, preset_name: str, state: tuple, rules: int) -> dict:
    """In memory per process (keyed on the table file's size and mtime and the rules' version), and on disk
    (_disk_claims) across processes."""
    return _disk_claims(path, experiment, preset_name)


SHIPPED = "verdicts.json"  # beside the tables: their verdicts as computed when the results were shipped


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shipped(path: Path, sha: str) -> dict | None:
    """The table's verdicts from the folder's SHIPPED file, if its entry is for these bytes (sha) and these rules."""
    try:
        entry = json.loads((path.parent / SHIPPED).read_text())["tables"][path.name]
        if entry["rules"] == RULES_VERSION and entry["sha256"] == sha and isinstance(entry["found"], dict):
            return entry["found"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    return None


def ship(root: Path) -> Path:
    """Compute every table's verdicts under root afresh and write them to SHIPPED beside the tables, atomically: root's
    (returned), and a study's own folder's (OWN_FOLDER: each folder ships whole), so a server on a fresh copy of the
    folder draws the overview without computing them; run when results ship."""
    root = Path(root)
    folders: dict[Path, dict] = {root: {}}
    for experiment, names in catalog(root).items():
        for preset_name in names:
            path = table_path(root, experiment, preset_name)
            found = _compute_claims(path, experiment, preset_name)
            if found["problems"]:
                raise ValueError(f"{path.name}: {' '.join(found['problems'])}")
            folders.setdefault(path.parent, {})[path.name] = {"sha256": _sha256(path), "rules": RULES_VERSION,
                                                              "found": found}  # fmt: skip
    for folder, tables in folders.items():
        _write_json(folder / SHIPPED, {"tables": tables}, indent=1, sort_keys=True)
    return root / SHIPPED


def _write_json(path: Path, value, **how) -> None:
    """Verdicts as JSON (numpy scalars as Python's), atomically: a reader sees the old file or the new one."""
    part = path.with_suffix(f".{os.getpid()}.part")
    part.write_text(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v), **how) + "\n")
    os.replace(part, path)


def _disk_claims(path: str, experiment: str, preset_name: str) -> dict:
    """The shipped verdicts (_shipped) if they are current; else on disk (cache_dir) across processes, keyed on
    the table's SHA-256, its experiment and study and RULES_VERSION; a folder that cannot be written only costs the
    recomputation."""
    try:
        sha = _sha256(Path(path))
    except OSError:  # gone or unreadable since it was listed: _compute_claims says so
        return _compute_claims(Path(path), experiment, preset_name)
    if (found := _shipped(Path(path), sha)) is not None:
        return found
    key = hashlib.sha256(json.dumps([sha, experiment, preset_name, RULES_VERSION]).encode()).hexdigest()[:24]
    cached = cache_dir() / f"claims-{key}.json"
    try:
        return json.loads(cached.read_text())
    except (OSError, ValueError):
        pass
    found = _compute_claims(Path(path), experiment, preset_name)
    if not found["problems"]:  # a damaged table is read again next time, not remembered
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            _write_json(cached, found)
        except OSError:
            pass
    return found


def _table_key(root: Path, experiment: str, preset_name: str) -> tuple | None:
    path = table_path(root, experiment, preset_name)
    if not path.is_file():
        return None
    return str(path.resolve()), experiment, preset_name, [path.stat().st_size, path.stat().st_mtime_ns]


def warm(root: Path | None = None) -> int:
    """Compute (or find) every table's verdicts under root into the disk cache, as the overview would; returns
    how many tables. `loopscope dashboard` runs this beside the server, so a first visit finds them ready."""
    root = Path(root) if root is not None else results_root()
    done = 0
    for experiment, names in catalog(root).items():
        for preset_name in names:
            if key := _table_key(root, experiment, preset_name):
                _disk_claims(*key[:3])
                done += 1
    return done


def claims(experiment: str, preset_name: str, root: Path | None = None) -> dict:
    """The verdicts for one table: {"rules": "verdicts" (docs/design.md's rules, both analyses: E2-E4), "e5" or None
    (no verdicts, e.g. E1), "claims": [dict] (claims_of), "problems": [str], "scale": str}; E5 of a study whose
    recipe probe is open (probe_open): no claims, and the ones its probe runs would give under "withheld"."""
    key = _table_key(Path(root) if root is not None else results_root(), experiment, preset_name)
    if key is None:
        return {"rules": None, "claims": [], "problems": [], "scale": "—"}
    found = _claims(*key, RULES_VERSION)
    if experiment == "e5" and probe_open(preset_name, root):  # its own rung is a rejected candidate's: no verdict
        return found | {"claims": [], "withheld": found["claims"]}
    return found


# ---------------------------------------------------------------- the second design's verdicts as cards

SAME_RULE = {("e2", "d"), ("e3", "a"), ("e3", "b")}  # claims docs/design.md's rules judge alike under both analyses
ANALYSES = {"paper": "The paper's analysis (Cliff's δ, Mann–Whitney, unpaired)",
            "paired": "Paired analysis (per-seed differences, Wilcoxon, Holm)",
            "both": "Both analyses (the rules read this claim the same way)"}  # fmt: skip
OUTCOME_COLORS = {
    "holds": "green",
    "does NOT hold": "red",
    "undecided": "gray",  # docs/design.md's rules
    "agreement": "green",
    "normalisation": "red",
    "mixed": "orange",
}  # E5's; other outcomes: blue


def badge(outcome: str, prefix: str = "") -> str:
    """A verdict's outcome as a coloured Streamlit badge (the overview's cards, the E5 page)."""
    return f":{OUTCOME_COLORS.get(outcome, 'blue')}-badge[{prefix}{outcome}]"


LEVELS = ("held-out mean", "hardest held-out")  # engine.experiments.verdicts.MEAN, HARDEST: the judged levels


def rule_cards(experiment: str, found: list[dict]) -> list[dict]:
    """An experiment's claims (claims_of) grouped into one card per (task, claim): {task, claim, text, paper,
    criterion, analyses: {analysis: {"levels": {level: (outcome, measured)}, "difficulties": "k/N" or ""}}}."""
    cards: dict[tuple, dict] = {}
    for c in found:
        card = cards.setdefault(
            (c["task"], c["claim"]), {"task": c["task"], "claim": c["claim"], "text": c["text"], "paper": c["paper"],
                                      "criterion": c["criterion"], "analyses": {}})  # fmt: skip
        analysis = card["analyses"].setdefault(c["analysis"], {"levels": {}, "difficulties": ""})
        analysis["levels"][c["level"]] = (c["outcome"], c["measured"])
        analysis["difficulties"] = c.get("difficulties") or analysis["difficulties"]
    return sorted(cards.values(), key=lambda card: (card["claim"], card["task"]))


if __name__ == "__main__":  # python -m dashboard.results [RESULTS] [--ship]: fill the verdict cache (loopscope
    import sys  # dashboard does), or with --ship write RESULTS/verdicts.json for shipping

    args = [a for a in sys.argv[1:] if a != "--ship"]
    where = Path(args[0]) if args else None
    if "--ship" in sys.argv:
        print(f"wrote {ship(where if where is not None else results_root())}")
    else:
        warm(where)
