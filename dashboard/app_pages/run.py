"""Run: train seeds, run an experiment, or evaluate a run at more loop counts, in a background worker
(engine.runtime.jobs). Progress is read from the job files, so it survives reruns, closed tabs and other sessions;
finished results land in the workbench (<results>/workbench/), never in the published study: the page lists what
the workbench holds, with its seeds, and links each result to the pages that show it beside the study. The form
lives in the URL (every widget bound to a query parameter), so a reload keeps it; a lost or cancelled job has a
Resume button."""

import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data, ui
from engine.core.presets import OWN_FOLDER, PRESETS, preset, tasks_of
from engine.errors import UsageError
from engine.inputs import parse_seeds  # the CLI's own check of --seeds
from engine.runtime import jobs
from engine.runtime.settings import redact, shown_path

KINDS = {"train seeds": "train", "E2": "e2", "E3": "e3", "E4": "e4", "evaluate a run": "evaluate"}  # label: kind
URL = {"bind": "query-params"}  # every widget of the form is in the URL (its key is the parameter's name)
STATE_ICONS = {
    "queued": ":material/schedule:", "running": ":material/autorenew:", "done": ":material/check_circle:",
    "failed": ":material/error:", "cancelled": ":material/cancel:", "lost": ":material/help:",
    "corrupt": ":material/warning:", "missing": ":material/help:",
}  # fmt: skip
PAGES = Path(__file__).resolve().parent
BESIDE_TITLES = {"e2": "Accuracy vs depth", "e4": "Looped vs stacked"}  # data.BESIDE_PAGES' titles

root = data.results_root()
st.title("Run")
try:
    cap = jobs.caps()
except jobs.Refused as e:  # a cap that is not a number: run nothing rather than guess one
    st.error(str(e))
    st.stop()


def seeds_input() -> list[int] | None:
    text = st.text_input(
        "seeds", "0-1", key="run_seeds", help="A count (2 = seeds 0, 1), a range 0-3 or a list 0,5.", **URL
    )
    try:
        seeds = parse_seeds(text)
    except UsageError as e:  # the sentence quotes what was typed (or linked): shown as text
        st.error(ui.as_text(str(e).replace("--seeds", "seeds"), most=400))
        return None
    if len(seeds) > cap["max_seeds"]:
        st.error(f"{len(seeds)} seeds is over this deployment's cap of {cap['max_seeds']} (LOOPSCOPE_MAX_SEEDS).")
        return None
    return seeds


def train_spec() -> jobs.Spec | None:
    left, mid, right = st.columns(3)
    name = left.selectbox("preset", list(PRESETS), key="run_preset", **URL)
    task = mid.selectbox("task", list(tasks_of(name)), key="run_task", **URL)  # the GPU study's presets: parity
    boundary = right.selectbox("trained boundary", ["norm", "none"], key="run_boundary", **URL)
    cfg = preset(name, task, boundary, left.selectbox("arch", ["looped", "stacked"], key="run_arch", **URL))
    steps = mid.number_input(
        "steps", 1, cap["max_steps"], min(cfg.train.steps, cap["max_steps"]), key="run_steps", **URL
    )
    loops = right.number_input(
        "evaluate at n = 1..", 1, cap["max_loops"], min(cfg.max_eval_loops, cap["max_loops"]), key="run_loops", **URL
    )
    seeds = seeds_input()
    if seeds is None:
        return None
    cfg = replace(cfg, train=replace(cfg.train, steps=int(steps)), max_eval_loops=int(loops))
    return jobs.TrainSpec(cfg, tuple(seeds))


def experiment_spec(experiment: str) -> jobs.Spec | None:
    left, right = st.columns(2)
    # the GPU study's presets run as its pieces on a GPU machine (docs/gpu-study.md, "How to run it"), not here
    name = left.selectbox("preset", [p for p in PRESETS if p not in OWN_FOLDER], key="run_preset", **URL)
    tasks = right.pills(
        "tasks", list(tasks_of(name)), selection_mode="multi", default=["parity"], key="run_tasks", **URL
    )
    cfg = preset(name)
    st.caption(f"The {name} preset: {cfg.train.steps} steps per training, evaluated at n = 1..{cfg.max_eval_loops}.")
    seeds = seeds_input()
    if cfg.train.steps > cap["max_steps"] or cfg.max_eval_loops > cap["max_loops"]:
        st.error(f"The {name} preset is over this deployment's caps (LOOPSCOPE_MAX_STEPS, LOOPSCOPE_MAX_LOOPS).")
        return None
    if not tasks:
        st.error("Pick at least one task.")
        return None
    return None if seeds is None else jobs.ExperimentSpec(experiment, name, tuple(seeds), tuple(tasks))


def evaluable_runs() -> pd.DataFrame:
    """The runs an evaluation job can read: the results folder's own and the workbench's (a workbench copy
    replaces its published run: it holds what earlier jobs added), those with their weights first."""
    table, _ = data.runs()
    if table.empty:
        return table
    table = table[table["folder"].isin(["", jobs.WORKBENCH])]
    table = table.sort_values("folder", key=lambda s: s != jobs.WORKBENCH, kind="stable").drop_duplicates("run_key")
    return pd.concat([table[table["weights"] == "kept"], table[table["weights"] != "kept"]])


def restore_hint(run: dict) -> None:
    """A weightless run, said before Submit: what restoring it takes, and the command."""
    manifest, _, _ = data.run_detail(run["run"])
    seconds, made = jobs.restore_seconds(manifest), manifest.get("machine")
    where = f"{made.get('cpu', '?')}, {made.get('threads', '?')} thread(s)" if isinstance(made, dict) else "unrecorded"
    took = f": about {data.duration(seconds)} on the machine that made it ({ui.as_text(where)})" if seconds else ""
    group = len(manifest.get("group") or [run["seed"]])
    st.warning(
        f"Run `{run['run_key']}` is stored without its weights, so it cannot be evaluated yet. Restoring them "
        f"retrains its group of {group} seed{'s' if group > 1 else ''}{took}, on the command line:"
    )
    st.code(f"loopscope restore {run['run_key']} --results {root}", language="bash")


def eval_spec() -> jobs.Spec | None:
    table = evaluable_runs()
    if table.empty:
        st.info("No runs to evaluate yet: train some first.")
        return None
    labels = {
        r.run_key: f"{r.study + ' · ' if r.study else ''}{r.experiment} · {r.task} · {r.arch} · "
        f"{r['trained boundary']} · seed {r.seed}" + (" · the workbench's copy" if r.folder else "")
        for _, r in table.iterrows()
    }  # the option is the key itself: a bound widget writes what it displays into the URL
    kept = int((table["weights"] == "kept").sum())
    key = st.selectbox(
        "run", list(labels), key="run_key", **URL,
        help=f"The run key: the {kept} runs with their weights first, then the {len(table) - kept} without (each "
        "with the command that restores it). The job evaluates a copy in the workbench; the published run and "
        "tables stay as they are.",
    )  # fmt: skip
    run = table.set_index("run_key").loc[key].to_dict() | {"run_key": key}
    weights = "weights kept" if run["weights"] == "kept" else "no weights here"
    st.caption(f"`{key}`: {labels[key]} · {weights}")
    if run["weights"] != "kept":
        restore_hint(run)
        return None
    left, right = st.columns(2)
    default = min(4 * int(run["T"]), cap["max_loops"])
    loops = left.number_input("evaluate at n = 1..", 1, cap["max_loops"], default, key="eval_loops", **URL)
    mode = right.selectbox("run in mode", ["trained", "norm", "none"], key="eval_mode", **URL)
    return jobs.EvalSpec(key, int(loops), None if mode == "trained" else mode)


def submit_form() -> None:
    label = st.segmented_control("what", list(KINDS), default="train seeds", required=True, key="run_kind", **URL)
    kind = KINDS[label]
    spec = {"train": train_spec, "evaluate": eval_spec}.get(kind, lambda: experiment_spec(kind))()
    if st.button("Submit", type="primary", disabled=spec is None, key="submit", icon=":material/play_arrow:"):
        try:
            job = jobs.submit(spec, root)
        except (jobs.Refused, ValueError) as e:
            st.error(str(e))
        else:
            st.success(f"Job `{job}` submitted: {jobs.describe(spec)}. Its progress is below; its results go to the "
                       "workbench.")  # fmt: skip


def show_job(job: jobs.Job) -> None:
    with st.container(border=True):
        st.markdown(f"{STATE_ICONS.get(job.state, '')} **{job.state}** · {job.what or 'job'} · `{job.job_id}`")
        if job.state == "corrupt":
            st.warning(job.message)
            return
        bar = job.active and job.total
        if bar:
            loss = f" · loss {job.loss:.4f}" if job.loss is not None else ""
            stage = f"{job.stage}: " if job.stage else ""
            text = f"{stage}{job.unit} {job.step} of {job.total}{loss}{time_left(job)}"
            st.progress(min(1.0, job.step / job.total), text=text)
        resumed = f" (started {job.launches} times: resumed)" if job.launches > 1 else ""
        st.caption(redact(job.message) + resumed + ("" if bar else time_left(job)) + when(job))
        if job.state == "done":
            result_links(job)
        elif job.state in ("failed", "lost") and not jobs.read_only():  # a read-only copy: the message only
            tail = data.log_tail(root, job.job_id)
            st.caption(f"The last lines of `{jobs.job_file(root, job.job_id, '.log')}`:" if tail else "No log.")
            if tail:
                st.code(tail, language="text")
        if jobs.read_only():
            return
        if job.active:
            st.button("Cancel", key=f"cancel-{job.job_id}", on_click=jobs.cancel, args=(job.job_id, root))
        elif job.state in ("lost", "cancelled") and job.spec:
            st.button(
                "Resume", key=f"resume-{job.job_id}", on_click=resume, args=(job.job_id,), icon=":material/replay:",
                help="Submit this job's own spec again: it continues from its last checkpoint.",
            )  # fmt: skip


def when(job: jobs.Job) -> str:
    """When the job's worker started (this launch) and how long it ran: to the end for a job that ended."""
    if job.started is None:
        return ""
    took = job.took_s()
    running = time.time() - job.started
    ran = f", took {data.duration(took)}" if took is not None else f", running {data.duration(running)}"
    ran = "" if job.state in ("lost", "corrupt", "missing") else ran
    return f" · started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(job.started))}{ran}"


def time_left(job: jobs.Job) -> str:
    """The worker's estimate of the whole job (its trainings, the evaluations after them, surgery and refits: what
    `eta_covers` names), counted down since it was written: the worker writes nothing while it evaluates."""
    left = job.left_s()
    if left is None:
        return ""
    covers = job.eta_covers or "the whole job"
    if left < 1:
        return f" · taking longer than estimated ({covers})"
    return f" · about {data.duration(left)} left ({covers})"


def resume(jid: str) -> None:
    """The Resume button: the job's own spec, submitted again (same spec, same job id)."""
    try:
        jobs.resume(jid, root)
    except (jobs.Refused, ValueError) as e:
        st.session_state["resume_error"] = str(e)


def beside_link(experiment: str, preset_name: str) -> dict | None:
    """A link to the page that shows the workbench's table of experiment at preset_name beside the published study
    (data.BESIDE_PAGES: its compare box, `vs_root` the workbench); None where no page overlays that experiment."""
    if experiment not in data.BESIDE_PAGES:
        return None
    params = {"vs_root": str(data.workbench_root().resolve()), "vs": preset_name}
    if preset_name in data.presets(experiment):  # the published study of the same preset, the workbench beside it
        params["preset"] = preset_name
    label = f"{BESIDE_TITLES[experiment]}: the workbench's {experiment}-{preset_name} beside the study"
    return {"page": PAGES / data.BESIDE_PAGES[experiment], "label": label, "query_params": params}


def result_links(job: jobs.Job) -> None:
    """A finished job's results, all in the workbench: its runs on the Runs page (the run id in the URL) and the
    pages that show its tables beside the published study."""
    found = data.job_results(job.spec)
    links = [
        {"page": PAGES / "runs.py", "label": f"Run {run} on the Runs page", "query_params": {"run": run}}
        for run in found["runs"][:8]
    ]
    if found["experiment"]:  # an experiment job: all the workbench's runs of it, filtered on the Runs page
        query = {"studies": jobs.WORKBENCH, "experiments": found["experiment"]}
        links.append({"page": PAGES / "runs.py", "label": f"{found['experiment']}'s runs in the workbench",
                      "query_params": query})  # fmt: skip
    links += [link for experiment, name in found["tables"] if (link := beside_link(experiment, name))]
    for link in links:
        st.page_link(**link, icon=":material/arrow_forward:")


def workbench() -> None:
    """What the workbench holds: its tables with their seeds (each linked beside the study where a page overlays
    it) and how many runs; and how a result becomes part of a study (a command, never this page)."""
    folder = data.workbench_root()
    tables, runs = data.workbench_tables(), data.runs()[0]
    runs = runs[runs["folder"] == jobs.WORKBENCH] if len(runs) else runs
    st.caption(
        f"Every job here writes into `{shown_path(folder)}`, a store of its own: its runs, tables and checkpoints. "
        "The published study's runs, tables, figures and verdicts never change from this page; the pages show a "
        "workbench result beside the study, labelled `@ workbench`, never in its means. To publish a result, run it "
        "on the command line into the results folder (`loopscope eval RUN_KEY --loops 1-24`, then `loopscope run "
        "e2 --preset cpu` to rebuild the study's table; each run's manifest records what was added and from which "
        "commit)."
    )
    if tables.empty and runs.empty:
        st.caption("The workbench is empty.")
        return
    st.markdown(f"**{len(runs)} run{'s' if len(runs) != 1 else ''}** in the workbench (the Runs page lists them as "
                f"`{jobs.WORKBENCH}`).")  # fmt: skip
    if len(tables):
        st.dataframe(tables.drop(columns="run_keys"), hide_index=True, width="stretch")
        for experiment, name in zip(tables["experiment"], tables["preset"], strict=True):
            if link := beside_link(experiment, name):
                st.page_link(**link, icon=":material/compare_arrows:")


def job_list() -> None:
    found = jobs.list_jobs(root)
    if not found:
        st.caption(f"No jobs under `{shown_path(jobs.jobs_dir(root))}` yet.")
    for job in found[:20]:
        show_job(job)
    if st.session_state.get("jobs_were_active") and not any(j.active for j in found):
        st.session_state["jobs_were_active"] = False
        st.rerun()  # the last job ended: redraw the page once and stop polling
    st.session_state["jobs_were_active"] = any(j.active for j in found)


if jobs.read_only():
    st.info(
        "**Read-only.** This copy of the dashboard shows the shipped results and runs nothing. "
        "To train or extend runs, run loopscope on your own machine:"
    )
    st.code("pip install -e .\nloopscope run e2 --preset smoke --seeds 2 --tasks parity\nloopscope dashboard")
else:
    st.caption(
        f"Jobs run in their own processes and keep running if you close this tab. Caps here: "
        f"{cap['max_seeds']} seeds, {cap['max_steps']} steps, n up to {cap['max_loops']}."
    )
    submit_form()
st.header("Jobs")
if problem := st.session_state.pop("resume_error", None):
    st.error(problem)
polling = any(j.active for j in jobs.list_jobs(root))  # decided after a submit above, so a new job is polled
st.fragment(run_every=2.0 if polling else None)(job_list)()
if not jobs.read_only() or data.workbench_root().is_dir():  # a read-only copy runs no jobs: its workbench if any
    st.header("Workbench")
    workbench()
