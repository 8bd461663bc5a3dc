"""Background jobs: a session submits, a worker process runs, every session reads the progress.

    <results>/jobs/<job_id>.json   spec, state, step / total, loss, ETA, message (written atomically)
    <results>/jobs/<job_id>.log    the worker's output
    <results>/jobs/.lock           fcntl.flock'ed around every read-modify-write of a job file
    <results>/jobs/ckpt/           training checkpoints; a resubmitted job resumes from them

A job's id hashes its spec, so identical specs share one job, across sessions and processes. A worker
is its own process group (`python -m engine.runtime.jobs ROOT JOB_ID`), so it outlives Streamlit reruns and
sessions, and cancel ends it with everything it started. States: queued, running, done, failed,
cancelled; readers add `lost` (the worker died without a word, e.g. kill -9) and `corrupt`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.core.presets import OWN_FOLDER, PRESETS, RunConfig, preset
from engine.core.store import KEY, REPO, Store, atomic_write, check_run_key, weights_not_kept
from engine.core.train import resolve_device
from engine.errors import explain
from engine.experiments import REGISTRY
from engine.experiments import runs as experiments
from engine.runtime.settings import (  # noqa: F401  (what a deployment allows, re-exported: jobs.read_only, ...)
    CAPS,
    NO,
    YES,
    Refused,
    adopt_settings,
    caps,
    read_only,
    read_only_setting,
    refuse_writes,
)

ACTIVE, FINAL = ("queued", "running"), ("done", "failed", "cancelled")


@dataclass(frozen=True)
class TrainSpec:
    config: RunConfig
    seeds: tuple[int, ...]
    device: str = "auto"


@dataclass(frozen=True)
class ExperimentSpec:
    experiment: str  # e2, e3 or e4
    preset: str
    seeds: tuple[int, ...]
    tasks: tuple[str, ...] = ("parity", "chain")
    device: str = "auto"


@dataclass(frozen=True)
class EvalSpec:
    run_key: str
    loops: int  # evaluate at n = 1..loops from the run's checkpoint
    boundary: str | None = None  # None: the mode it was trained with
    device: str = "auto"


Spec = TrainSpec | ExperimentSpec | EvalSpec
KINDS: dict[str, type] = {"train": TrainSpec, "experiment": ExperimentSpec, "eval": EvalSpec}


def spec_dict(spec: Spec) -> dict:
    return {"kind": next(k for k, cls in KINDS.items() if isinstance(spec, cls)), **asdict(spec)}


def spec_from_dict(d: dict) -> Spec:
    d = dict(d)
    cls = KINDS[d.pop("kind")]
    if cls is TrainSpec:
        d["config"] = RunConfig.from_dict(d["config"])
    for k in ("seeds", "tasks"):
        if k in d:
            d[k] = tuple(d[k])
    return cls(**d)


def job_id(spec: Spec) -> str:
    return hashlib.sha256(json.dumps(spec_dict(spec), sort_keys=True).encode()).hexdigest()[:16]


def describe(spec: Spec) -> str:
    seeds = lambda s: f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))}"
    if isinstance(spec, TrainSpec):
        c = spec.config
        return f"train {c.task.name} {c.model.arch} {c.model.boundary}, {seeds(spec.seeds)}, {c.train.steps} steps"
    if isinstance(spec, ExperimentSpec):
        return f"{spec.experiment} at the {spec.preset} preset, {', '.join(spec.tasks)}, {seeds(spec.seeds)}"
    return f"evaluate run {spec.run_key} at n = 1..{spec.loops} ({spec.boundary or 'trained mode'})"


# ---------------------------------------------------------------- what a deployment allows (engine.runtime.settings)


def check(spec: Spec, store: Store) -> None:
    """Raise Refused (read-only, over a cap) or ValueError (nonsense) before anything is started."""
    refuse_writes()
    cap = caps()
    if isinstance(spec, TrainSpec):
        seeds, steps, loops = spec.seeds, spec.config.train.steps, spec.config.max_eval_loops
    elif isinstance(spec, ExperimentSpec):
        if spec.experiment not in REGISTRY or spec.preset not in PRESETS or not spec.tasks:
            raise ValueError(f"unknown experiment {spec.experiment!r} or preset {spec.preset!r}, or no task.")
        if spec.preset in OWN_FOLDER:  # a study of its own folder, run piece by piece on a GPU machine
            raise ValueError(f"the {spec.preset} preset runs as the GPU study's pieces "
                             "(dev/studies/gpu-study/gpu-study.sh on a GPU machine, then loopscope merge), "
                             "not as a job here.")  # fmt: skip
        cfg = [preset(spec.preset, task) for task in spec.tasks][0]  # an unknown task raises here
        seeds, steps, loops = spec.seeds, cfg.train.steps, cfg.max_eval_loops
    else:
        check_run_key(store.root, spec.run_key)
        if store.status(spec.run_key) != "ok":
            raise ValueError(f"run {spec.run_key} is not a valid cached run under {store.root}.")
        if weights_not_kept(store.manifest(spec.run_key)) is not None:  # a state, said before any work
            store.load_weights(spec.run_key)  # raises WeightsNotKept: its sentence says how to get them back
        seeds, steps, loops = (), 0, spec.loops
    if isinstance(spec, TrainSpec | ExperimentSpec) and not seeds:
        raise ValueError("give at least one seed.")
    for what, value, limit in (("seeds", len(seeds), "max_seeds"), ("steps", steps, "max_steps")):
        if value > cap[limit]:
            raise Refused(f"{value} {what} is over this deployment's cap of {cap[limit]} (LOOPSCOPE_{limit.upper()}).")
    if not 1 <= loops <= cap["max_loops"]:
        raise Refused(f"loop counts run 1..{cap['max_loops']} here (LOOPSCOPE_MAX_LOOPS); {loops} is outside.")
    if isinstance(spec, TrainSpec | ExperimentSpec):  # a group that cannot fit in memory: refused before it starts
        from engine.errors import UsageError
        from engine.experiments import seeds_for
        from engine.inputs import check_memory

        units = [(spec.config, seeds)] if isinstance(spec, TrainSpec) else [
            (cfg, seeds_for(spec.experiment, spec.preset, cfg, seeds))
            for cfg, _ in REGISTRY[spec.experiment].trainings(spec.preset, spec.tasks)
        ]  # fmt: skip
        try:
            check_memory(units, resolve_device(spec.device), store)
        except UsageError as e:
            raise ValueError(str(e)) from None


# ---------------------------------------------------------------- job files


@dataclass
class Job:
    job_id: str
    state: str
    what: str = ""
    spec: dict | None = None
    step: int = 0
    total: int = 0
    loss: float | None = None
    eta_s: float | None = None
    message: str = ""
    pid: int | None = None
    host: str = ""
    launches: int = 0
    updated: float = 0.0

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def jobs_dir(root: Path) -> Path:
    return Path(root) / "jobs"


def job_file(root: Path, jid: str, suffix: str = ".json") -> Path:
    if not KEY.fullmatch(jid):  # job ids become file names: no '..'
        raise ValueError(f"{jid!r} is not a job id (16 hex digits)")
    return jobs_dir(root) / f"{jid}{suffix}"


@contextmanager
def _locked(root: Path):
    refuse_writes()  # every write of a job file (and of the lock file) comes through here
    folder = jobs_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or when its holder dies
        yield


def _read(root: Path, jid: str) -> dict | None:
    """The job file as a dict; None if absent; ValueError if it is not a job file."""
    path = job_file(root, jid)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"jobs/{jid}.json is not a job file ({type(e).__name__})") from None
    if not isinstance(record, dict) or record.get("state") not in ACTIVE + FINAL:
        raise ValueError(f"jobs/{jid}.json is not a job file (no valid state)")
    return record


def _update(root: Path, jid: str, **fields) -> dict:
    with _locked(root):
        try:
            record = _read(root, jid) or {}
        except ValueError:
            record = {}
        return _write(root, record | fields | {"job_id": jid})


def _write(root: Path, record: dict) -> dict:
    record["updated"] = time.time()
    atomic_write(job_file(root, record["job_id"]), json.dumps(record, indent=1).encode())
    return record


def _alive(pid: int | None, host: str = "") -> bool:
    if not pid:
        return False
    if host and host != platform.node():
        return True  # another machine's worker (a shared folder): trust its file
    try:  # a zombie (killed, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def status(jid: str, root: Path) -> Job:
    """A job as any session sees it; a damaged file or a vanished worker is a state with a message."""
    try:
        record = _read(root, jid)
    except ValueError as e:
        return Job(jid, "corrupt", message=f"{e}; submit the job again to replace it.")
    if record is None:
        return Job(jid, "missing", message=f"no job {jid} under {jobs_dir(root)}.")
    known = {k: record[k] for k in Job.__dataclass_fields__ if k in record}
    job = Job(**known)
    if job.active and job.pid and not _alive(job.pid, job.host):
        job.state, job.eta_s = "lost", None
        job.message = (
            f"the worker stopped without finishing (killed? see jobs/{jid}.log); "
            "press Resume (or submit it again) to resume from its checkpoint."
        )
    return job


def list_jobs(root: Path) -> list[Job]:
    """Every job under <root>/jobs, newest first."""
    folder = jobs_dir(root)
    found = [status(p.stem, root) for p in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(found, key=lambda j: j.updated, reverse=True)


# ---------------------------------------------------------------- submit, cancel, wait


def submit(spec: Spec, root: Path) -> str:
    """Start a worker for spec unless one is already running it; return the job id (shared by identical specs)."""
    root = Path(root)
    check(spec, Store(root))
    jid = job_id(spec)
    with _locked(root):  # the check-then-start is atomic across sessions and processes
        current = status(jid, root)
        if current.active and _alive(current.pid, current.host):
            return jid
        record = {
            "state": "queued", "what": describe(spec), "spec": spec_dict(spec), "step": 0, "total": 0,
            "loss": None, "eta_s": None, "message": "starting a worker", "pid": None, "host": platform.node(),
            "launches": current.launches + 1, "job_id": jid,
        }  # fmt: skip
        _write(root, record)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        with open(job_file(root, jid, ".log"), "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "engine.runtime.jobs", str(root.resolve()), jid],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        threading.Thread(target=proc.wait, name=f"reap-{jid}", daemon=True).start()  # no zombie when it ends
        _write(root, record | {"pid": proc.pid})
    return jid


def resume(jid: str, root: Path) -> str:
    """Submit job jid's own spec again (a lost or cancelled job continues from its checkpoint); its id is the same.
    ValueError where the job file holds no spec that can run."""
    job = status(jid, root)
    if job.active:
        return jid
    try:
        spec = spec_from_dict(job.spec or {})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"job {jid} holds no spec to resume ({type(e).__name__}); submit it from the form.") from None
    return submit(spec, root)


def cancel(jid: str, root: Path, grace_s: float = 5.0) -> Job:
    """Terminate the worker's process group (SIGKILL after grace_s) and mark the job cancelled."""
    refuse_writes()  # a read-only copy ends nothing either
    job = status(jid, root)
    if not job.active:
        return job
    if job.pid and _alive(job.pid, job.host):
        try:
            os.killpg(job.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _alive(job.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(job.pid):
                os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _update(root, jid, state="cancelled", eta_s=None, message="cancelled; submit again to resume from its checkpoint.")
    return status(jid, root)


def wait(jid: str, root: Path, timeout_s: float = 600, poll_s: float = 0.2) -> Job:
    """Block until the job is no longer queued or running (or the timeout passes); return it."""
    deadline = time.monotonic() + timeout_s
    while (job := status(jid, root)).active and time.monotonic() < deadline:
        time.sleep(poll_s)
    return job


# ---------------------------------------------------------------- the worker


class Reporter:
    """Writes a training's progress to the job file at most twice a second, with an ETA per phase."""

    def __init__(self, root: Path, jid: str):
        self.root, self.jid, self.what, self.t0, self.step0, self.last = root, jid, "", 0.0, 0, 0.0

    def __call__(self, what: str, step: int, total: int, loss: float) -> None:
        now = time.monotonic()
        if what != self.what:
            self.what, self.t0, self.step0, self.last = what, now, step, 0.0  # a new phase (or resumed at step k)
        if now - self.last < 0.5 and step < total:
            return
        self.last = now
        eta = (total - step) * (now - self.t0) / (step - self.step0) if step > self.step0 else None
        loss = loss if math.isfinite(loss) else None  # NaN is not JSON
        _update(self.root, self.jid, state="running", message=what, step=step, total=total, loss=loss, eta_s=eta)


def execute(spec: Spec, store: Store, report) -> str:
    """Run one spec in this process; return a sentence for the job's final message."""

    every = int(os.environ.get("LOOPSCOPE_CHECKPOINT_EVERY", 100))
    device = resolve_device(spec.device)
    with experiments.live(experiments.Live(checkpoint_every=every, report=report)):
        if isinstance(spec, TrainSpec):
            keys = experiments.ensure_runs(spec.config, spec.seeds, store, "train", device, progress=False)
            return f"done: runs {', '.join(keys)}."
        if isinstance(spec, ExperimentSpec):
            REGISTRY[spec.experiment].run(spec.preset, list(spec.seeds), store, device, spec.tasks, progress=False)
            return f"done: {spec.experiment}-{spec.preset}.parquet written."
        report(describe(spec), 0, 1, float("nan"))
        experiment = store.manifest(spec.run_key).get("experiment", "train")
        loops = list(range(1, spec.loops + 1))
        rows = experiments.extend_eval(store, [spec.run_key], loops, spec.boundary, experiment, device, False)
        tables = experiments.merge_into_tables(store, rows)
        return f"done: {len(rows)} rows added to run {spec.run_key} and to {', '.join(tables) or 'no table'}."


def job_spec(root: Path, jid: str) -> Spec:
    """The spec of job jid, for a worker about to run it: Refused on a read-only deployment, ValueError if
    jid is not a job id or names no job file; either before anything is written."""
    refuse_writes()
    record = _read(root, jid)
    if record is None:
        raise ValueError(f"no job {jid} under {jobs_dir(root)}; submit() writes it before starting a worker")
    return spec_from_dict(record["spec"])


def work(root: Path, jid: str, spec: Spec | None = None) -> int:
    """Run job jid in this process (the worker)."""
    spec = spec or job_spec(root, jid)
    _update(root, jid, state="running", pid=os.getpid(), host=platform.node(), message="starting")
    try:
        message = execute(spec, Store(root), Reporter(root, jid))
    except Exception as e:  # a known failure in its sentence (engine.errors.explain), else the exception's line
        reason = explain(e) or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _update(root, jid, state="failed", eta_s=None, message=f"failed: {reason}")
        raise
    _update(root, jid, state="done", eta_s=0, message=message)
    return 0


def main(argv: list[str]) -> int:
    """`python -m engine.runtime.jobs RESULTS JOB_ID`, as submit() starts it: a refusal is one line in the job's log
    and exit 2; an error while running is the job's `failed` message (and a traceback in the log)."""
    try:
        if len(argv) != 2:
            raise ValueError("usage: python -m engine.runtime.jobs RESULTS_DIR JOB_ID (submit() starts it)")
        root, jid = Path(argv[0]), argv[1]
        spec = job_spec(root, jid)
    except (Refused, ValueError) as e:
        print(f"engine.runtime.jobs: {e}", file=sys.stderr)
        return 2
    return work(root, jid, spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
