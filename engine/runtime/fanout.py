"""Work a command needs, done ahead of it in parallel; the command then runs as usual and finds it cached.

`--backend ray` trains the seed groups and configurations as Ray tasks. A task trains and evaluates one
group and returns (run key, manifest, weights, rows) per seed; the driver writes them into its own store,
so workers need no shared folder. RAY_ADDRESS picks a running cluster; without it a local Ray is started
for the command's duration. Where the cluster has GPUs (and --device is not cpu) each task asks for
GPU_FRACTION of one, so four small trainings share a GPU. On the CPU each task asks for its group's estimated
peak memory (engine.core.memory) as Ray's `memory` resource, so a node runs only as many trainings as its memory
holds; a group larger than every node's memory is refused before anything is dispatched.

`--workers N` (the local backend) runs N processes on this machine, each with cores/N threads: on 2 cores,
two single-thread processes get more done than one process with two threads (docs/performance.md). The
workers write into the results folder themselves (atomic writes, one folder per run). E3's refits go
out one job per (seed group, target): a refit depends only on its group, target and config, so a worker
sends its arrays back and the driver stores the group (engine.experiments.e3) once all its targets are in. The seed
groups are the ones the command would train itself (a seed's rounding, and so its result, depends on
the size of its group, so RunConfig.group fixes it), so the results equal a one-process run's; the
parallelism is across groups, configurations and targets, the costliest first. Every writer holds the
lock of what it computes (engine.core.store), so two commands asking for the same work do it once.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from engine.core.flops import training_flops
from engine.core.presets import RunConfig
from engine.core.store import Store
from engine.core.train import resolve_device
from engine.experiments import REGISTRY, e3, seeds_for
from engine.experiments import refit as rf
from engine.experiments.runs import (
    group_id,
    load_models,
    missing_seeds,
    store_group,
    train_and_evaluate,
    train_and_store,
)

GPU_FRACTION = 0.25


def experiment_units(experiment: str, preset_name: str, tasks) -> list[tuple[RunConfig, str]]:
    """The trainings (config, experiment label) that `loopscope run <experiment>` starts: the experiment
    module's own list, the one its run() iterates over."""
    return REGISTRY[experiment].trainings(preset_name, tasks)


def _train_unit(cfg: RunConfig, group: list[int], experiment: str, device: str):

    return train_and_evaluate(cfg, group, experiment, resolve_device(device), progress=False)


def fan_out(units: list[tuple[RunConfig, list[int], str]], store: Store, device: str) -> int:
    """Train every missing (config, seed group) as a Ray task and store the results; return the task count.
    The driver holds each dispatched group's lock until it is stored."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    try:
        gpus = GPU_FRACTION if device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0 else 0
        task = ray.remote(num_cpus=1, num_gpus=gpus)(_train_unit)
        memory = node_memory_needs(units, store, device, ray.nodes())
        with ExitStack() as locks:
            pending = {}
            for cfg, seeds, experiment in units:
                for group in cfg.groups(seeds):
                    wanted = [s for s in group if s in seeds]
                    if not missing_seeds(cfg, wanted, store, report=False):
                        continue
                    locks.enter_context(store.lock(group_id(cfg, group), f"training seeds {group} of {cfg.task.name}"))
                    if missing_seeds(cfg, wanted, store):
                        options = {"memory": memory[cfg]} if memory.get(cfg) else {}
                        pending[task.options(**options).remote(cfg, group, experiment, device)] = cfg
            total, t0 = len(pending), time.perf_counter()
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                store_group(store, pending.pop(done[0]), ray.get(done[0]))
                print(f"ray: {total - len(pending)}/{total} groups stored ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr)  # fmt: skip
        return total
    finally:
        if started:
            ray.shutdown()


def node_memory_needs(units, store: Store, device: str, nodes: list[dict]) -> dict[RunConfig, int]:
    """{config: bytes of a group's estimated peak} for the CPU trainings still to do (a GPU's memory is not a Ray
    resource: the device's own check runs in the task); UsageError if a group needs more than every live node of
    the cluster has (Ray would otherwise leave its task pending for ever)."""
    if device != "cpu":
        return {}
    from engine.core.memory import GIB, estimate
    from engine.errors import UsageError

    largest = max((n.get("Resources", {}).get("memory", 0) for n in nodes if n.get("Alive")), default=0)
    needs = {}
    for cfg, seeds, _ in units:
        if cfg not in needs and missing_seeds(cfg, seeds, store, report=False):
            needs[cfg] = estimate(cfg, cfg.train.group_size, "cpu").peak_bytes
            if needs[cfg] > largest:
                raise UsageError(
                    f"{cfg.task.name} {cfg.model.arch} {cfg.model.boundary}: a group of {cfg.train.group_size} seed(s) "
                    f"needs about {needs[cfg] / GIB:.1f} GiB and the largest node of the Ray cluster offers "
                    f"{largest / GIB:.1f} GiB; use a smaller train.group_size, train.batch_size or model, or a node "
                    "with more memory."
                )
    return needs


# ---------------------------------------------------------------- the local backend: a process pool


def _init_worker(threads: int, parent: int) -> None:
    import threading

    import torch

    torch.set_num_threads(threads)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int, every_s: float = 1.0) -> None:
    """End this worker once the command that started it is gone: a killed `loopscope run` leaves no
    training behind (its locks would keep a rerun waiting). A group cut short stores nothing."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


@contextmanager
def local_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """`workers` fresh processes (spawned: no state copied from this one), each with cores/workers threads."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    init = dict(initializer=_init_worker, initargs=(threads, os.getpid()))
    with ProcessPoolExecutor(workers, mp_context=context, **init) as pool:
        yield pool


def _train_and_store(cfg: RunConfig, group: list[int], experiment: str, device: str, root: str) -> int:

    return int(train_and_store(cfg, group, Store(Path(root)), experiment, resolve_device(device), progress=False))


def _refit_target(keys: list[str], target: str, preset_name: str, device: str, root: str) -> dict:
    """One target's refit of one group of stored runs, as numpy arrays (exact) for the driver, which
    stores the group once all its targets are in: a refit depends only on the group, target and config."""

    model, run, seeds = load_models(Store(Path(root)), keys)
    res = rf.refit(model, run, seeds, target, e3.refit_config(preset_name), run.max_eval_loops, device)
    arrays = lambda d: {k: v.numpy() for k, v in d.items()}  # noqa: E731
    grids, losses = arrays(res.grids), res.losses.numpy()
    return dict(state=arrays(res.state), names=res.names, grids=grids, losses=losses, wall_s=res.wall_s)


def _refit_result(d: dict):

    tensors = lambda a: {k: torch.from_numpy(v) for k, v in a.items()}  # noqa: E731
    state, grids, losses = tensors(d["state"]), tensors(d["grids"]), torch.from_numpy(d["losses"])
    return rf.RefitResult(state, d["names"], grids, losses, d["wall_s"])


def _refit_jobs(preset_name: str, tasks, seeds: list[int], store: Store, device: str, locks: ExitStack):
    """(cost, function, args, (keys, target)) per training group and distinct target of E3's missing refits;
    the group's refit lock is taken into `locks`, so the group is refit once whoever else asks for it."""

    cfg, jobs = e3.refit_config(preset_name), []
    for run, _ in experiment_units("e3", preset_name, tasks):
        cost = training_flops(run, 1) * cfg.schedule[-1] / run.train.steps
        for group in run.groups(seeds):
            wanted = [run.run_key(s) for s in group if s in seeds]
            if not e3.missing_refits(wanted, cfg, store):
                continue
            locks.enter_context(
                store.lock(e3.refit_lock(run, group, cfg), f"refitting seeds {group} of {run.task.name}")
            )
            if not e3.missing_refits(wanted, cfg, store, report=True):
                continue
            keys = tuple(run.run_key(s) for s in group)
            for target in rf.distinct_targets(cfg.targets, run.model.layers_per_block):
                jobs.append((cost * len(group), _refit_target, (list(keys), target, preset_name, device,
                                                                 str(store.root)), (keys, target)))  # fmt: skip
    return jobs


def _run_jobs(pool: ProcessPoolExecutor, jobs: list[tuple], what: str, done_fn: Callable | None = None) -> None:
    """Submit (cost, function, args[, tag]) jobs, the costliest first, and report each as it finishes;
    done_fn(tag, result) is called in this process as each finishes."""
    t0 = time.perf_counter()
    futures = {pool.submit(job[1], *job[2]): job for job in sorted(jobs, key=lambda j: -j[0])}
    for done, future in enumerate(as_completed(futures), 1):
        result = future.result()  # a worker's exception is raised here
        if done_fn:
            done_fn(futures[future][3], result)
        print(f"local: {done}/{len(futures)} {what} done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)


def local_fan_out(experiment: str, preset_name: str, tasks, seeds: list[int], store: Store, device: str,
                  workers: int) -> int:  # fmt: skip
    """Train (and for E3 refit, one job per group and target) what `loopscope run <experiment>` needs in
    `workers` local processes; return the number of jobs."""

    jobs, root = [], str(store.root)
    for cfg, label in experiment_units(experiment, preset_name, tasks):
        use = seeds_for(experiment, preset_name, cfg, seeds)  # E5's ladder: fewer seeds
        for group in cfg.groups(use):
            if missing_seeds(cfg, [s for s in group if s in use], store, report=False):
                jobs.append((training_flops(cfg, len(group)), _train_and_store, (cfg, group, label, device, root)))
    refits = []
    with local_pool(workers) as pool, ExitStack() as locks:
        if jobs:
            _run_jobs(pool, jobs, "training groups")
        if experiment == "e3":
            refits = _refit_jobs(preset_name, tasks, seeds, store, device, locks)
            _run_jobs(pool, refits, "refits (group x target)", _collector(refits, store, preset_name, device))
    return len(jobs) + len(refits)


def _collector(jobs: list[tuple], store: Store, preset_name: str, device: str) -> Callable:
    """done_fn for refit jobs: once every target of a group is in, store the group (engine.experiments.e3)."""

    waiting: dict[tuple, set] = {}
    for *_, (keys, target) in jobs:
        waiting.setdefault(keys, set()).add(target)
    results: dict[tuple, dict] = {}

    def done(tag, result):
        keys, target = tag
        results.setdefault(keys, {})[target] = _refit_result(result)
        if set(results[keys]) == waiting[keys]:
            e3.refit_and_store(store, list(keys), e3.refit_config(preset_name), device, False, results.pop(keys))

    return done
