"""`--backend ray`: train the seed groups and configurations a command needs as Ray tasks, then let the
command run as usual, finding them cached (the surgery, refits and tables then run here).

A task trains and evaluates one group and returns (run key, manifest, weights, rows) per seed; the driver
writes them into its own store, so workers need no shared folder. RAY_ADDRESS picks a running cluster;
without it a local Ray is started for the command's duration. Where the cluster has GPUs (and --device is
not cpu) each task asks for GPU_FRACTION of one, so four small trainings share a GPU.
"""

from __future__ import annotations

import os
import sys
import time

from engine.presets import RunConfig
from engine.store import Store

GPU_FRACTION = 0.25


def experiment_units(experiment: str, preset_name: str, tasks) -> list[tuple[RunConfig, str]]:
    """The trainings (config, experiment label) that `loopscope run <experiment>` starts: the experiment
    module's own list, the one its run() iterates over."""
    import importlib

    return importlib.import_module(f"engine.{experiment}").trainings(preset_name, tasks)


def _train_unit(cfg: RunConfig, group: list[int], experiment: str, device: str):
    from engine.experiments import train_and_evaluate
    from engine.train import resolve_device

    return train_and_evaluate(cfg, group, experiment, resolve_device(device), progress=False)


def fan_out(units: list[tuple[RunConfig, list[int], str]], store: Store, device: str, group_size: int) -> int:
    """Train every missing (config, seed group) as a Ray task and store the results; return the task count."""
    import ray

    from engine.experiments import missing_seeds

    started = not ray.is_initialized()
    if started:
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    try:
        gpus = GPU_FRACTION if device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0 else 0
        task = ray.remote(num_cpus=1, num_gpus=gpus)(_train_unit)
        pending = []
        for cfg, seeds, experiment in units:
            todo = missing_seeds(cfg, seeds, store)
            groups = [todo[i : i + group_size] for i in range(0, len(todo), group_size)]
            pending += [task.remote(cfg, group, experiment, device) for group in groups]
        total, t0 = len(pending), time.perf_counter()
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for key, manifest, state, rows in ray.get(done[0]):
                store.save_run(key, manifest, state, rows)
            print(
                f"ray: {total - len(pending)}/{total} groups stored ({time.perf_counter() - t0:.1f} s)", file=sys.stderr
            )
        return total
    finally:
        if started:
            ray.shutdown()
