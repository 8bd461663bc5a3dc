"""Background jobs: a session submits, a worker process runs, every session reads the progress.

    <results>/jobs/<job_id>.json   spec, state, step / total, loss, the whole job's ETA, start and end, message
                                   (written atomically)
    <results>/jobs/<job_id>.log    the worker's output
    <results>/jobs/.lock           fcntl.flock'ed around every read-modify-write of a job file
    <results>/workbench/           what every job computes: a store of its own (runs/, refits/, e*-<preset>.parquet
                                   tables, locks/, jobs/ckpt/ for training checkpoints a resubmitted job resumes from)

A job never writes into the results folder's published runs, tables or verdicts: it reads them, copies the runs it
needs into the workbench (stage) and works there. Publishing into a study stays a command: `loopscope eval` on the
run, then `loopscope run <experiment> --preset <study>` to rebuild the study's table (docs/hosting.md, "Live runs").

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
import shutil
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
WORKBENCH = "workbench"  # the folder under the results folder that every job writes into


def workbench(root: Path) -> Store:
    """The store every job writes into, <root>/workbench/: runs, refits and tables of its own, beside the results
    folder's published ones, which jobs only read."""
    return Store(Path(root) / WORKBENCH)


def holder(results: Store, key: str) -> Store:
    """The store an evaluation job reads run `key` from: the workbench's copy where it has a valid one (earlier
    evaluations added to it), else the results folder's own."""
    bench = workbench(results.root)
    return bench if bench.status(key) == "ok" else results


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
        check_run_key(workbench(store.root).root, spec.run_key)
        source = holder(store, spec.run_key)
        if source.status(spec.run_key) != "ok":
            raise ValueError(f"run {spec.run_key} is not a valid cached run under {store.root}.")
        if weights_not_kept(source.manifest(spec.run_key)) is not None:  # a state, said before any work
            source.load_weights(spec.run_key)  # raises WeightsNotKept: its sentence says how to get them back
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
    eta_s: float | None = None  # the whole job's seconds left when `updated` was written (Reporter)
    message: str = ""
    pid: int | None = None
    host: str = ""
    launches: int = 0
    updated: float = 0.0
    stage: str = ""  # "training 2 of 4" (Reporter)
    eta_covers: str = ""  # what eta_s counts: "training and evaluation", "evaluation", ... (Reporter)
    unit: str = "step"  # what step / total count: a training's steps, an evaluation's difficulties (Reporter)
    started: float | None = None  # when its worker started (time.time()), this launch
    ended: float | None = None  # when it became done, failed or cancelled

    def took_s(self) -> float | None:
        """How long its last launch ran, for a job that ended; None otherwise."""
        return self.ended - self.started if self.started is not None and self.ended is not None else None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def left_s(self, now: float | None = None) -> float | None:
        """The seconds the job has left now: eta_s counted down since it was written (the worker writes nothing
        while it evaluates), 0 once past it; None when there is no estimate."""
        if not self.active or self.eta_s is None:
            return None
        return max(0.0, self.eta_s - ((time.time() if now is None else now) - self.updated))


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
    _update(root, jid, state="cancelled", eta_s=None, ended=time.time(),
            message="cancelled; submit again to resume from its checkpoint.")  # fmt: skip
    return status(jid, root)


def wait(jid: str, root: Path, timeout_s: float = 600, poll_s: float = 0.2) -> Job:
    """Block until the job is no longer queued or running (or the timeout passes); return it."""
    deadline = time.monotonic() + timeout_s
    while (job := status(jid, root)).active and time.monotonic() < deadline:
        time.sleep(poll_s)
    return job


# ---------------------------------------------------------------- the whole job's estimate

# A training step's cost beyond its model FLOPs, per member, in FLOPs of the same time: on the CPU a small model's step
# is mostly fixed work (data, optimizer, launches). Measured on the development VM, one thread, 2026-12-05: the cpu
# preset's steps run at 12-14 GFLOP/s, and a smoke step takes 17-28 ms for two members whether it is parity's 55 MFLOP
# or chain's 154 MFLOP: about 7 ms, or 1e8 FLOPs at that rate, per member and step.
STEP_OVERHEAD_FLOPS = 1e8
# A run stored, or loaded and evaluated again (a quarter of it: read into an experiment's table): files written, hashed
# and read. E2 at the smoke preset, same VM: 0.85 s a run re-evaluated beyond its evaluation, 0.25 s a run read for
# the table, where a step of its two members (2.6e8 units) took 84 ms: 2.6e9 and 0.8e9 units.
RUN_OVERHEAD_FLOPS = 2e9


@dataclass(frozen=True)
class Work:
    """One piece of a job, in the order it runs: a training, an evaluation or a refit; `training`: the name a piece
    that reports its progress reports under (a training's: engine.experiments.runs.train_and_store's `what`; an
    evaluation job's evaluation: describe(spec)), "" for the evaluations and refits of an experiment, which report
    nothing; `units`: its model FLOPs (engine.core.flops), a training step's fixed cost added."""

    units: float
    kind: str  # training, evaluation or refits
    training: str = ""


def training_name(cfg: RunConfig, group: list[int]) -> str:
    """The name a training reports its steps under (engine.experiments.runs.train_and_store's `what`)."""
    return f"train {cfg.task.name} {cfg.model.arch} {cfg.model.boundary}, seeds {group[0]}-{group[-1]}"


def training_units(cfg: RunConfig, members: int, steps: int | None = None) -> float:
    """A training of `members` seeds: its FLOPs, and a step's fixed cost for each member and step."""
    from engine.core.flops import training_flops

    steps = cfg.train.steps if steps is None else steps
    return training_flops(cfg, members, steps) + STEP_OVERHEAD_FLOPS * members * steps


def eval_units(cfg: RunConfig, members: int, loops: int | None = None) -> float:
    """An evaluation: its FLOPs, and a step's fixed cost for each forward (a member at a difficulty)."""
    from engine.core.flops import eval_flops

    forwards = members * len(cfg.task.eval_difficulties)
    return eval_flops(cfg, members, loops) + STEP_OVERHEAD_FLOPS * forwards


def _training(cfg: RunConfig, group: list[int]) -> list[Work]:
    """A group's training and the evaluation that follows it (runs.train_and_evaluate)."""
    training = Work(training_units(cfg, len(group)), "training", training_name(cfg, group))
    return [training, Work(eval_units(cfg, len(group)) + RUN_OVERHEAD_FLOPS * len(group), "evaluation")]


def _other_modes(spec: Spec, cfg: RunConfig) -> list[str]:
    """The labels of the evaluations in another mode that spec's experiment adds to every run of cfg, as its run()
    does (E2: the norm runs without it; E4: the stacked ones; E5: every run, and the rescale of the norm runs)."""
    experiment = spec.experiment if isinstance(spec, ExperimentSpec) else ""
    trained = cfg.model.boundary
    if experiment == "e2" and trained == "norm" or experiment == "e4" and cfg.model.arch == "stacked":
        return ["norm->none"]
    if experiment == "e5":
        from engine.experiments import e5
        from engine.experiments.runs import boundary_label

        other = [boundary_label(trained, "none" if trained == "norm" else "norm")]
        return other + (["norm->rescale"] if e5.rescaled(spec.preset, cfg) else [])
    return []


def _evaluated(store: Store, key: str, label: str, loops: int) -> bool:
    """Whether stored run `key` has rows of `label` up to n = loops."""
    try:
        rows = store.load_rows(key)
    except Exception:  # damaged or missing: the job evaluates it
        return False
    have = rows.loc[rows["boundary"] == label, "eval_loops"]
    return not have.empty and have.max() >= loops


def plan(spec: Spec, store: Store) -> list[Work]:
    """What job `spec` will compute, in order: each group's training (whole groups, RunConfig.group) and evaluation
    where a requested run is not stored, the evaluations in another mode its experiment adds (E2, E4, E5), E3's
    refits, or an evaluation job's evaluation. Stored work is left out, as the job skips it."""
    from engine.core.flops import refit_flops
    from engine.experiments import seeds_for
    from engine.experiments.runs import missing_seeds

    if isinstance(spec, EvalSpec):
        cfg = RunConfig.from_dict(store.manifest(spec.run_key)["config"])
        return [Work(eval_units(cfg, 1, spec.loops) + RUN_OVERHEAD_FLOPS, "evaluation", describe(spec))]
    if isinstance(spec, TrainSpec):
        units = [(spec.config, list(spec.seeds))]
    else:
        units = [(cfg, seeds_for(spec.experiment, spec.preset, cfg, spec.seeds))
                 for cfg, _ in REGISTRY[spec.experiment].trainings(spec.preset, spec.tasks)]  # fmt: skip
    out: list[Work] = []
    for cfg, seeds in units:
        if isinstance(spec, ExperimentSpec) and spec.experiment == "e3":  # e3.refit_runs: a group's refits
            from engine.experiments import e3
            from engine.experiments import refit as rf

            refit = e3.refit_config(spec.preset)
            targets = rf.distinct_targets(refit.targets, cfg.model.layers_per_block)
            for group in cfg.groups(seeds):
                if not e3.missing_refits([cfg.run_key(s) for s in group if s in seeds], refit, store):
                    continue
                out += _training(cfg, group) if missing_seeds(cfg, group, store, report=False) else []
                steps = refit.schedule[-1] * len(targets) * len(group)
                out.append(Work(refit_flops(cfg, targets, refit.schedule, len(group)) + STEP_OVERHEAD_FLOPS * steps,
                                "refits"))  # fmt: skip
            continue
        new: set[int] = set()
        for group in cfg.groups(seeds):
            if missing_seeds(cfg, [s for s in group if s in seeds], store, report=False):
                out += _training(cfg, group)
                new |= set(group)
        for label in _other_modes(spec, cfg):  # one run at a time (runs.extend_eval)
            for seed in seeds:
                if seed in new or not _evaluated(store, cfg.run_key(seed), label, cfg.max_eval_loops):
                    out.append(Work(eval_units(cfg, 1) + RUN_OVERHEAD_FLOPS, "evaluation"))
    if isinstance(spec, ExperimentSpec) and out:  # its table: every run's rows read and written again
        out.append(Work(RUN_OVERHEAD_FLOPS / 4 * sum(len(seeds) for _, seeds in units), "evaluation"))
    return out


def stored_rate(spec: Spec, store: Store) -> float | None:
    """Seconds a unit of work took on this device, as recorded by a stored run of the job (its manifest's training
    and evaluation walls; an evaluation job: its run's evaluation alone, or its training where the manifest predates
    eval_wall_s, as every shipped `cpu` run does), until the job measures its own."""
    if isinstance(spec, EvalSpec):
        keys = [spec.run_key]
    else:
        units = [(spec.config, spec.seeds)] if isinstance(spec, TrainSpec) else [
            (cfg, spec.seeds) for cfg, _ in REGISTRY[spec.experiment].trainings(spec.preset, spec.tasks)]  # fmt: skip
        keys = [cfg.run_key(s) for cfg, seeds in units for s in seeds]
    device = resolve_device(spec.device).split(":")[0]
    for key in keys:
        try:
            m = store.manifest(key)
            if str(m.get("device", "")).split(" ")[0].split(":")[0] != device:
                continue
            cfg, members = RunConfig.from_dict(m["config"]), len(m["group"])
            units = training_units(cfg, members, cfg.train.steps - int(m.get("resumed_from_step", 0)))
            if isinstance(spec, EvalSpec) and "eval_wall_s" not in m:
                return float(m["wall_time_s"]) / units
            evaluation = eval_units(cfg, members), float(m["eval_wall_s"])
            if isinstance(spec, EvalSpec):
                return evaluation[1] / evaluation[0]
            return (float(m["wall_time_s"]) + evaluation[1]) / (units + evaluation[0])
        except Exception:  # not stored, or from before eval_wall_s was recorded: the next one
            continue
    return None


def restore_seconds(m: dict) -> float | None:
    """What `loopscope restore` of a weightless run takes on the machine that made it: its group's training (all of
    its steps, from the manifest's wall time) and evaluation (eval_wall_s, or, where the manifest predates it, its
    units at the training's rate); None where the manifest does not say."""
    try:
        cfg, members = RunConfig.from_dict(m["config"]), len(m["group"])
        done = cfg.train.steps - int(m.get("resumed_from_step", 0))
        rate = float(m["wall_time_s"]) / training_units(cfg, members, done)
        evaluation = float(m["eval_wall_s"]) if "eval_wall_s" in m else eval_units(cfg, members) * rate
        return training_units(cfg, members) * rate + evaluation
    except Exception:  # an older or damaged manifest: no estimate
        return None


def covers(work: list[Work]) -> str:
    """What an estimate over `work` counts, for the Run page: "training and evaluation", "evaluation", ..."""
    kinds = list(dict.fromkeys(w.kind for w in work))
    return " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)


class Reporter:
    """Writes a job's progress to the job file at most twice a second, with the whole job's estimate: the units of
    its plan not done yet, at the rate of its steady state (rate), or a stored run's (stored_rate) until it has
    measured its own."""

    def __init__(self, root: Path, jid: str, work: list[Work] | None = None, prior_s: float | None = None):
        self.root, self.jid, self.what, self.last = root, jid, "", 0.0
        self.work, self.prior_s, self.at = list(work or []), prior_s, -1
        self.units = sum(w.units for w in self.work)
        self.pieces = [i for i, w in enumerate(self.work) if w.training]  # the pieces that report their progress
        self.trainings = [i for i in self.pieces if self.work[i].kind == "training"]
        self.seen: list[tuple[float, float]] = []  # (time, units done) of every report written

    def begin(self) -> None:
        """The estimate before any step: the stored rate's, if any (a job without training reports nothing else)."""
        eta = self.units * self.prior_s if self.work and self.prior_s is not None else None
        _update(self.root, self.jid, eta_s=eta, eta_covers=covers(self.work) if self.work else "")

    def rate(self, now: float, done: float) -> float | None:
        """Seconds a unit in the job's steady state: over the later half of the time since its second report (the
        first one's steps carry the warm-up: allocations, threads starting, a machine still busy with the page that
        submitted it), so a slow start weighs less the longer the job runs, and the evaluations between trainings
        count once they fall in that half; the stored rate until two reports apart."""
        if len(self.seen) < 2:
            return self.prior_s
        since = (self.seen[1][0] + now) / 2
        at, base = next(((t, d) for t, d in self.seen[1:] if t >= since), self.seen[1])
        return (now - at) / (done - base) if done > base and now > at else self.prior_s

    def _advance(self, what: str) -> None:
        """A new piece reports: the next one of the plan with its name (the ones before it are done), else the
        next piece of the plan that reports."""
        later = [i for i in self.pieces if i > self.at]
        self.at = next((i for i in later if self.work[i].training == what), later[0] if later else self.at)

    def __call__(self, what: str, step: int, total: int, loss: float) -> None:
        now = time.monotonic()
        if what != self.what:
            self.what, self.last = what, 0.0
            self._advance(what)
        if now - self.last < 0.5 and step < total:
            return
        self.last = now
        done, piece = 0.0, self.work[self.at] if 0 <= self.at < len(self.work) else None
        if piece is not None:
            share = min(step, total) / max(total, 1)  # of the piece at hand
            done = sum(w.units for w in self.work[: self.at]) + piece.units * share
        rate = self.rate(now, done)
        self.seen.append((now, done))
        eta = max(0.0, self.units - done) * rate if self.work and rate is not None else None
        training = piece is not None and piece.kind == "training"
        stage = f"training {self.trainings.index(self.at) + 1} of {len(self.trainings)}" if training else ""
        loss = loss if math.isfinite(loss) else None  # NaN is not JSON
        _update(self.root, self.jid, state="running", message=what, step=step, total=total, loss=loss, eta_s=eta,
                stage=stage, unit="step" if piece is None or training else "difficulty")  # fmt: skip


# ---------------------------------------------------------------- the worker


def needed_runs(spec: Spec) -> list[tuple[str, str]]:
    """(folder, key) of what job spec reads if it is stored: the run an evaluation extends; the runs of a training's
    or an experiment's whole groups (runs/) and E3's refits of them (refits/)."""
    if isinstance(spec, EvalSpec):
        return [("runs", spec.run_key)]
    from engine.experiments import seeds_for

    units = [(spec.config, list(spec.seeds))] if isinstance(spec, TrainSpec) else [
        (cfg, seeds_for(spec.experiment, spec.preset, cfg, spec.seeds))
        for cfg, _ in REGISTRY[spec.experiment].trainings(spec.preset, spec.tasks)]  # fmt: skip
    keys = [cfg.run_key(s) for cfg, seeds in units for group in cfg.groups(seeds) for s in group]
    found = [("runs", key) for key in keys]
    if isinstance(spec, ExperimentSpec) and spec.experiment == "e3":
        from engine.experiments import e3

        found += [("refits", e3.refit_key(key, e3.refit_config(spec.preset))) for key in keys]
    return list(dict.fromkeys(found))


def copy_run(source: Store, bench: Store, key: str) -> bool:
    """Copy run (or refit) `key` whole from source into bench where bench has no valid one and source has one inside
    its folder (no symbolic link out of it); the copy is verified against its manifest, then put in place by one
    rename, so a reader sees all of it or nothing. Returns whether it copied."""
    inside = source.run_dir(key).resolve().is_relative_to(source.root.resolve())
    if not inside or bench.status(key) == "ok" or source.status(key) != "ok":
        return False
    with bench.lock(f"run-{key}", f"copying run {key} into the workbench"):
        if bench.status(key) == "ok":
            return False
        staged = Store(bench.root / ".staging" / str(os.getpid()), bench.folder)
        shutil.rmtree(staged.root, ignore_errors=True)
        try:
            shutil.copytree(source.run_dir(key), staged.run_dir(key))
            if staged.status(key) != "ok":
                raise ValueError(f"run {key} changed while it was copied into the workbench; submit the job again.")
            shutil.rmtree(bench.run_dir(key), ignore_errors=True)  # a damaged copy from before
            bench.run_dir(key).parent.mkdir(parents=True, exist_ok=True)
            os.rename(staged.run_dir(key), bench.run_dir(key))
        finally:
            shutil.rmtree(staged.root, ignore_errors=True)
    return True


def stage(spec: Spec, results: Store) -> Store:
    """The workbench (workbench()) holding what job spec reads of the results folder's own store (needed_runs),
    copied (copy_run): the job then finds it cached and works on the copies. The results folder is only read."""
    bench = workbench(results.root)
    for folder, key in needed_runs(spec):
        copy_run(Store(results.root, folder), Store(bench.root, folder), key)
    return bench


def execute(spec: Spec, results: Store, report) -> str:
    """Run one spec in this process, in the workbench (stage); return a sentence for the job's final message."""
    bench = stage(spec, results)
    every = int(os.environ.get("LOOPSCOPE_CHECKPOINT_EVERY", 100))
    device = resolve_device(spec.device)
    with experiments.live(experiments.Live(checkpoint_every=every, report=report)):
        if isinstance(spec, TrainSpec):
            keys = experiments.ensure_runs(spec.config, spec.seeds, bench, "train", device, progress=False)
            return f"done: runs {', '.join(keys)} in the workbench."
        if isinstance(spec, ExperimentSpec):
            REGISTRY[spec.experiment].run(spec.preset, list(spec.seeds), bench, device, spec.tasks, progress=False)
            return f"done: {WORKBENCH}/{spec.experiment}-{spec.preset}.parquet written."
        experiment = bench.manifest(spec.run_key).get("experiment", "train")
        loops = list(range(1, spec.loops + 1))
        step = lambda done, total: report(describe(spec), done, total, float("nan"))  # noqa: E731
        rows = experiments.extend_eval(bench, [spec.run_key], loops, spec.boundary, experiment, device, False,
                                       on_step=step)  # fmt: skip
        tables = experiments.merge_into_tables(bench, rows, results.root)
        where = f" and to {', '.join(f'{WORKBENCH}/{t}' for t in tables)}" if tables else ""
        return (f"done: {len(rows)} rows added to the workbench's copy of run {spec.run_key}{where}; "
                "the published runs and tables are unchanged.")  # fmt: skip


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
    _update(root, jid, state="running", pid=os.getpid(), host=platform.node(), message="starting",
            started=time.time(), ended=None)  # fmt: skip
    results = Store(root)
    try:
        bench = stage(spec, results)  # what it reads, copied first: its plan skips what is cached there
        try:  # an estimate never fails a job: without a plan there is none
            reporter = Reporter(root, jid, plan(spec, bench), stored_rate(spec, bench))
        except Exception as e:
            print(f"engine.runtime.jobs: no estimate ({type(e).__name__}: {e})", file=sys.stderr)
            reporter = Reporter(root, jid)
        reporter.begin()
        message = execute(spec, results, reporter)
    except Exception as e:  # a known failure in its sentence (engine.errors.explain), else the exception's line
        reason = explain(e) or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _update(root, jid, state="failed", eta_s=None, ended=time.time(), message=f"failed: {reason}")
        raise
    _update(root, jid, state="done", eta_s=0, ended=time.time(), message=message)
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
