"""The workbench (issue 60): a job started from the dashboard never rewrites the published study, the paired verdict
rules judge only the n where every paired seed has both members, and a job's estimate comes from its steady state.

The walk of the issue, evaluating the shipped run 54cb465fa855929b (E2 parity `norm`, seed 0) at n = 1..24 from the
Run page on a copy of cached_results, is the slow test at the end."""

import hashlib
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from engine.experiments import e2, e4, verdicts
from engine.runtime import jobs

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "cached_results"
APP = str(REPO / "dashboard" / "app.py")
WALKED = "54cb465fa855929b"  # the run: E2, parity, trained with the norm, seed 0, T = 4, evaluated to n = 12


def extended(rows: pd.DataFrame, changes: dict[tuple[str, str], float | None], upto: int = 24) -> pd.DataFrame:
    """rows with seed 0 of the given (arch, boundary) members evaluated further, n = 13..upto, as one run extended
    from the dashboard or `loopscope eval` would be: its n = 12 rows copied, the value set where one is given."""
    last = rows[(rows["seed"] == 0) & (rows["eval_loops"] == rows["eval_loops"].max())]
    more = []
    for (arch, boundary), value in changes.items():
        member = last[(last["arch"] == arch) & (last["boundary"] == boundary)]
        assert len(member), (arch, boundary)
        for n in range(int(rows["eval_loops"].max()) + 1, upto + 1):
            more.append(member.assign(eval_loops=n, **({} if value is None else {"value": value})))
    return pd.concat([rows, *more], ignore_index=True)


def hardest(rows: pd.DataFrame) -> pd.DataFrame:
    """A shipped table's parity rows at its hardest held-out difficulty alone (the rules' three levels are then
    that difficulty): the claims in a second, the same rules."""
    rows = rows[rows["task"] == "parity"]
    return rows[rows["difficulty"] == rows.loc[rows["split"] == "heldout", "difficulty"].max()].reset_index(drop=True)


@pytest.fixture(scope="module")
def parity_e4() -> pd.DataFrame:
    rows = hardest(pd.read_parquet(SHIPPED / "e4-cpu.parquet"))
    return rows[rows["metric"] == "accuracy"].reset_index(drop=True)


def test_e4_looping_helps_at_equal_n_does_not_flip_where_a_looped_seed_lacks_its_stacked_twin(parity_e4):
    """The issue's flip: seed 0's looped model evaluated to n = 24, its stacked twin (and every other seed) to 12;
    the equal-n claim read n = 13..24 as comparisons without a pair and went from holds to does NOT hold."""
    before = e4.claims(parity_e4, "cpu")
    assert {c.outcome for c in before if c.claim == "equal n"} == {"holds"}
    after = e4.claims(extended(parity_e4, {("looped", "norm"): None}), "cpu")
    assert [c.as_dict() for c in after] == [c.as_dict() for c in before]  # "mean gap ... over n = 2..12" included


def test_e2_rules_read_the_same_seeds_at_every_n():
    """One seed's two modes evaluated to n = 24 (none at accuracy 1, norm at 0): a pair of one at n = 13..24 is not
    the study's 16; today's rules read it as the largest separation beyond T."""
    rows = hardest(pd.read_parquet(SHIPPED / "e2-cpu.parquet"))
    before = e2.claims(rows, "cpu")
    grown = extended(rows[rows["metric"] == "accuracy"], {("looped", "none"): 1.0, ("looped", "norm"): 0.0})
    after = e2.claims(pd.concat([rows, grown[grown["eval_loops"] > 12]], ignore_index=True), "cpu")
    assert [c.as_dict() for c in after] == [c.as_dict() for c in before]


def test_complete_n_keeps_an_n_only_with_every_paired_seed():
    values = pd.DataFrame(
        [("t", seed, n, mode, 0.5) for seed in (0, 1) for n in (1, 2) for mode in ("a", "b")]
        + [("t", 0, 3, "a", 0.5), ("t", 0, 3, "b", 0.5), ("t", 1, 3, "a", 0.5)]  # seed 1 lacks b at n = 3
        + [("t", 2, n, "a", 0.5) for n in (1, 2, 3)],  # seed 2 has no b anywhere: not a paired seed
        columns=["task", "seed", "eval_loops", "mode", "value"],
    )
    kept = verdicts.complete_n(values, ["task"], "mode", "a", "b")
    assert sorted(kept["eval_loops"].unique()) == [1, 2] and set(kept["seed"]) == {0, 1, 2}


# ---------------------------------------------------------------- honest time


def reported(monkeypatch, reporter: jobs.Reporter) -> list[dict]:
    """What the reporter writes to its job file, captured instead of written."""
    written = []
    monkeypatch.setattr(jobs, "_update", lambda root, jid, **fields: written.append(fields))
    return written


def test_the_rate_comes_from_the_steady_state_not_the_warm_up(monkeypatch):
    """Two trainings of 300 steps and their evaluations: 0.01 s a unit in steady state, the first 8 steps 0.5 s each
    (a warm-up: 4 s, where the steady state takes 0.8 s). After a tenth of the job, and after a fifth, the estimate
    is within 1.2x of what is left; a rate taken from the first step on said 1.51x and 1.20x."""
    work = [jobs.Work(3000, "training", "a"), jobs.Work(1000, "evaluation"),
            jobs.Work(3000, "training", "b"), jobs.Work(1000, "evaluation")]  # fmt: skip
    clock = [0.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    reporter = jobs.Reporter(Path("."), "0" * 16, work)
    written = reported(monkeypatch, reporter)
    timeline = []  # (time, the estimate written then)
    for training in ("a", "b"):
        for step in range(1, 301):
            clock[0] += 0.5 if training == "a" and step <= 8 else 0.1
            reporter(training, step, 300, 0.5)
            if written and written[-1].get("eta_s") is not None and (not timeline or timeline[-1][0] != clock[0]):
                timeline.append((clock[0], written.pop()["eta_s"]))
        clock[0] += 10.0  # its evaluation: unreported
    end = clock[0]
    for share in (0.1, 0.2):
        at, eta = next((t, e) for t, e in timeline if t >= end * share)
        assert (end - at) / 1.2 <= eta <= (end - at) * 1.2, (share, at, eta, end)


def test_an_evaluation_job_reports_its_difficulties_with_an_estimate(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    reporter = jobs.Reporter(Path("."), "0" * 16, [jobs.Work(1000, "evaluation", "evaluate run x")], prior_s=None)
    written = reported(monkeypatch, reporter)
    for done in range(1, 11):
        clock[0] += 3.0
        reporter("evaluate run x", done, 10, float("nan"))
    first, third = written[0], written[2]
    assert first["unit"] == "difficulty" and first["stage"] == "" and first["eta_s"] is None  # no rate yet
    assert third["eta_s"] == pytest.approx(7 * 3.0)  # 7 difficulties left at 3 s each
    assert written[-1]["eta_s"] == 0 and written[-1]["step"] == 10


def test_the_restore_estimate_is_the_groups_training_and_evaluation():
    from engine.core.store import Store

    m = Store(SHIPPED).manifest(WALKED)  # the shipped cpu runs predate eval_wall_s: evaluation at the training's rate
    seconds = jobs.restore_seconds(m)
    assert m["wall_time_s"] < seconds < 1.2 * m["wall_time_s"]
    assert jobs.restore_seconds(m | {"eval_wall_s": 30.0}) == pytest.approx(m["wall_time_s"] + 30.0)
    assert jobs.restore_seconds({"config": "damaged"}) is None


# ---------------------------------------------------------------- the walk of the issue


def published(root: Path) -> dict[str, str]:
    """SHA-256 of every file under root but the workbench and the job files: the published runs, tables, verdicts."""
    skip = (f"{jobs.WORKBENCH}/", "jobs/", "locks/")
    files = {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}
    return {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in files.items() if not name.startswith(skip)}


def page(monkeypatch, root: Path, name: str, **query) -> AppTest:
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    at = AppTest.from_file(APP, default_timeout=240)
    at.query_params.update(query)
    at.run()
    if name != "overview":
        at.switch_page(f"app_pages/{name}.py").run()
    assert not at.exception, (name, [e.value for e in at.exception])
    assert not at.error, (name, [e.value for e in at.error])
    return at


@pytest.mark.slow  # evaluates a 16-seed cpu run at n = 1..24 in a worker process and renders every page
def test_evaluating_a_shipped_run_from_the_run_page_changes_no_published_byte(monkeypatch, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(SHIPPED, root, ignore=shutil.ignore_patterns("jobs", "locks", jobs.WORKBENCH))
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the worker inherits it
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "verdict-cache"))
    before = published(root)

    at = page(monkeypatch, root, "run", run_kind="evaluate a run", run_key=WALKED, eval_loops="24")
    assert at.selectbox(key="run_key").value == WALKED and at.number_input(key="eval_loops").value == 24
    at.button(key="submit").click().run()
    assert "submitted" in at.success[0].value and "workbench" in at.success[0].value
    (job,) = jobs.list_jobs(root)
    seen, start = [], time.monotonic()
    while (now := jobs.status(job.job_id, root)).active and time.monotonic() - start < 1500:
        seen.append(now)
        time.sleep(0.5)
    assert now.state == "done", now.message
    running = [j for j in seen if j.state == "running" and j.total]
    assert running and {j.unit for j in running} == {"difficulty"} and running[-1].total == 10
    assert all(j.eta_s is not None for j in running), "an evaluation job shows an estimate throughout"
    assert now.took_s() > 0 and "unchanged" in now.message

    assert published(root) == before  # every published run, table and verdict, byte for byte
    bench = jobs.workbench(root)
    assert bench.load_rows(WALKED)["eval_loops"].max() == 24
    held = {p.name for p in bench.root.glob("e*-*.parquet")}  # the tables that hold the run, E3's refits not
    assert {"e2-cpu.parquet", "e4-cpu.parquet", "e5-cpu.parquet"} <= held and "e3-cpu.parquet" not in held, held
    assert set(pd.read_parquet(bench.root / "e2-cpu.parquet")["seed"]) == {0}

    at = page(monkeypatch, root, "run")  # the finished job: its duration, its run and its tables beside the study
    card = " ".join(c.value for c in at.caption)
    assert "took" in card and "started" in card
    links = {link.proto.label: link.proto.query_string for link in at.get("page_link")}
    assert f"Run {jobs.WORKBENCH}/{WALKED} on the Runs page" in links
    beside = links["Accuracy vs depth: the workbench's e2-cpu beside the study"]
    assert "vs=cpu" in beside and "preset=cpu" in beside
    for name in ("overview", "accuracy", "norms", "stacked", "agreement", "refit", "runs"):
        page(monkeypatch, root, name)  # every page of the study still draws
    at = page(monkeypatch, root, "accuracy", preset="cpu", vs_root=str(bench.root.resolve()), vs="cpu")
    assert any("cpu @ workbench" in h.value for h in at.header), [h.value for h in at.header]
    at = page(monkeypatch, root, "runs", run=f"{jobs.WORKBENCH}/{WALKED}")
    assert any("workbench's copy" in c.value for c in at.caption)
    assert published(root) == before
