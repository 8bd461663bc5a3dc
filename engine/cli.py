"""`loopscope` (also `python -m engine`): train, evaluate, list and check runs; open the dashboard.

Bad input ends with one sentence on stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from engine.core.presets import OWN_FOLDER, PRESETS, RunConfig, preset, study_root, tasks_of
from engine.errors import UsageError, explain
from engine.experiments import PAPER, REGISTRY, seeds_for
from engine.inputs import (  # noqa: F401  (MAX_SEED: read by the tests)
    MAX_LOOPS,
    MAX_SEED,
    MAX_SEEDS,
    MAX_WORKERS,
    check_memory,
    check_repo,
    check_runs,
    parse_loops,
    parse_seeds,
)

DEFAULT_RESULTS = "cached_results"
REPO = Path(__file__).resolve().parents[1]  # the checkout: the dashboard's processes start here
BACKEND_HELP = "local (default): this process; ray: seed groups as Ray tasks ($RAY_ADDRESS or a local Ray)"


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own default prints the usage too)
        raise UsageError(f"{message} (see '{self.prog} --help')")


def results_dir(args) -> Path:
    return Path(args.results or os.environ.get("LOOPSCOPE_RESULTS") or DEFAULT_RESULTS)


def load_config(args) -> RunConfig:
    if args.config:  # a regular file within JSON_MIB, parsed without recursion errors
        from engine.inputs import read_json

        try:
            return RunConfig.from_dict(read_json(Path(args.config), f"config file {args.config}"))
        except ValueError as e:  # RunConfig's validation: a sentence naming the field, its range and the value
            raise UsageError(f"config file {args.config}: {e}") from None
    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
    try:
        return preset(args.preset, args.task, args.boundary, args.arch)
    except ValueError as e:  # validation says what to change
        raise UsageError(str(e)) from None


def device_of(args) -> str:
    from engine.core.train import resolve_device

    try:
        return resolve_device(args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None


def open_store(args, root: Path | None = None):
    """The results folder (or `root`), once a real write there has worked (os.access says yes as root on /proc)."""
    from engine.core.store import Store

    store = Store(root or results_dir(args))
    try:
        store.check_writable()
    except PermissionError as e:
        raise UsageError(str(e)) from None
    return store


def study_roots(args) -> list[Path]:
    """The results folder and the studies' own folders under it that exist (the GPU study's <results>/gpu/)."""
    root = results_dir(args)
    held = lambda f: (root / f / "runs").is_dir() or (root / f / "jobs" / "ckpt").is_dir()  # noqa: E731
    return [root, *(root / f for f in dict.fromkeys(OWN_FOLDER.values()) if held(f))]


def key_root(args, keys: list[str]) -> Path:
    """The folder whose store holds every run of `keys`: the results folder, or else the one study folder under it
    that holds them all (a key held in both is the results folder's: pass --results DIR/gpu for the other)."""
    from engine.core.store import KEY

    roots = study_roots(args)
    if all(isinstance(k, str) and KEY.fullmatch(k) for k in keys):
        for root in roots:
            if all((root / "runs" / k).is_dir() for k in keys):
                return root
    return roots[0]


def accuracy_table(rows: pd.DataFrame) -> str:
    acc = rows[rows["metric"] == "accuracy"]
    table = acc.pivot_table(index=["boundary", "difficulty"], columns="eval_loops", values="value", aggfunc="mean")
    return f"mean accuracy over {acc['seed'].nunique()} seed(s), by difficulty (rows) and loop count n (columns):\n" + (
        table.round(3).to_string()
    )


# ---------------------------------------------------------------- commands


def ray_fan_out(args, units, store) -> str:
    """--backend ray: train the units as Ray tasks first (each worker resolves --device on its own); the
    command then finds them cached. Returns the device for what remains here (this machine may lack CUDA)."""
    try:
        import ray  # noqa: F401

        from engine.runtime.fanout import fan_out
    except ImportError:
        raise UsageError("--backend ray needs Ray: pip install 'loopscope[ray]' (or 'ray[default]').") from None
    fan_out(units, store, args.device)
    from engine.core.train import resolve_device

    return "cpu" if args.device == "cpu" else resolve_device("auto")


def precision_of(args, cfg: RunConfig) -> str:
    """train.precision for --precision (fp32, bf16, or auto: decided here for cfg's model, and why printed)."""
    from engine.core.train import resolve_precision

    try:
        precision, why = resolve_precision(args.precision, cfg, device_of(args))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.precision == "auto":
        print(f"loopscope: --precision auto: {precision}: {why}.", file=sys.stderr)
    return precision


def with_precision(cmd):
    """`cmd` (cmd_run) with every config its presets make in one precision, --precision's (a study's precision is
    one value: auto is decided once, on the preset's first task's model); without --precision, as defined."""
    from engine.core.presets import precision_override

    def run(args) -> int:
        if args.precision is None or args.preset not in PRESETS:  # cmd says what is wrong with the preset
            return cmd(args)
        with precision_override(precision_of(args, preset(args.preset, tasks_of(args.preset)[0]))):
            return cmd(args)

    return run


def cmd_train(args) -> int:
    cfg = load_config(args)
    if args.group_size:  # a different group is a different computation: it changes the run keys
        try:
            cfg = replace(cfg, train=replace(cfg.train, group_size=args.group_size))
        except ValueError as e:
            raise UsageError(f"--group-size: {e}") from None
    if args.precision:  # part of the config, so of the run key (fp32: the key every run had before)
        cfg = replace(cfg, train=replace(cfg.train, precision=precision_of(args, cfg)))
    seeds = parse_seeds(args.seeds)
    from engine.experiments.runs import ensure_runs

    store = open_store(args, None if args.config else study_root(results_dir(args), args.preset))
    if args.backend == "ray":
        device = ray_fan_out(args, [(cfg, seeds, "train")], store)
    else:
        device = device_of(args)
        check_memory([(cfg, seeds)], device, store)  # before any group trains
    keys = ensure_runs(cfg, seeds, store, experiment="train", device=device)
    rows = pd.concat([store.load_rows(k) for k in keys])
    print(accuracy_table(rows))
    print("runs: " + " ".join(keys))
    return 0


def cmd_eval(args) -> int:
    from engine.experiments.runs import extend_eval

    loops = parse_loops(args.loops)
    keys = list(dict.fromkeys(args.run_keys))  # a key given twice is evaluated once
    root = key_root(args, keys)
    cfg = check_runs(root, keys)
    if args.boundary == "rescale" and (cfg.model.boundary != "norm" or cfg.model.arch != "looped"):
        raise UsageError(
            f"the rescale surgery replaces the boundary norm of a norm-trained looped model, and {keys[0]} is a "
            f"{cfg.model.boundary}-trained {cfg.model.arch} run; pick a norm-trained looped run (loopscope list)."
        )
    device = device_of(args)
    store = open_store(args, root)
    if args.boundary == "rescale":  # E5's surgery: the run's stored per-step scalars, measured first if missing
        from engine.experiments.e5 import ensure_rescale

        ensure_rescale(store, keys, max(loops), device)
        rows = pd.concat([store.load_rows(k) for k in keys])
        rows = rows[(rows["boundary"] == "norm->rescale") & rows["eval_loops"].isin(loops)]
    else:
        rows = extend_eval(store, keys, loops, boundary=args.boundary, device=device)
    print(accuracy_table(rows))
    return 0


def cmd_run(args) -> int:
    """One experiment, or `all` (E2, E3, E4 in order; each reuses what the one before cached)."""
    names = list(PAPER) if args.experiment == "all" else [args.experiment]
    modules = [REGISTRY[name] for name in names]
    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
    seeds = parse_seeds(args.seeds)
    tasks = [t.strip() for t in args.tasks.split(",")] if args.tasks else list(tasks_of(args.preset))
    for module in modules:
        unknown = sorted(set(tasks) - set(module.TASKS))
        if unknown:
            raise UsageError(f"unknown task {unknown[0]!r} in --tasks; choose from {', '.join(module.TASKS)}.")
    if set(tasks) - set(tasks_of(args.preset)):
        raise UsageError(f"the {args.preset} preset defines {', '.join(tasks_of(args.preset))} only; pick --tasks "
                         f"{','.join(tasks_of(args.preset))}.")  # fmt: skip
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be at least 1 and at most {MAX_WORKERS} (4 per core), got {args.workers}.")
    if args.workers > 1 and args.backend == "ray":
        raise UsageError("--workers is for the local backend; Ray places its tasks itself (drop --workers).")
    device = device_of(args)
    store = open_store(args, study_root(results_dir(args), args.preset))  # the GPU study: a folder of its own
    from engine.experiments.runs import check_study_precision  # one precision a study, before any training

    check_study_precision(store, args.preset, [cfg for m in modules for cfg, _ in m.trainings(args.preset, tasks)])
    if args.backend != "ray":  # every training of every experiment asked for, before the first one starts
        units = [(cfg, seeds_for(name, args.preset, cfg, seeds))
                 for name in names for cfg, _ in REGISTRY[name].trainings(args.preset, tasks)]  # fmt: skip
        check_memory(units, device, store, args.workers)
    for name, module in zip(names, modules, strict=True):
        start = time.perf_counter()  # the fan-out included: the figure is the experiment's wall time
        if args.backend == "ray":
            from engine.runtime.fanout import experiment_units

            units = [(cfg, seeds_for(name, args.preset, cfg, seeds), label)
                     for cfg, label in experiment_units(name, args.preset, tasks)]  # fmt: skip
            device = ray_fan_out(args, units, store)
        elif args.workers > 1:
            from engine.runtime.fanout import local_fan_out

            local_fan_out(name, args.preset, tasks, seeds, store, device, args.workers)
        rows = module.run(args.preset, seeds, store, device, tasks)
        if len(names) > 1:
            print(f"\n== {name.upper()} ({time.perf_counter() - start:.0f} s)")
        print(module.report(rows, args.preset))  # its estimates and its verdicts (module.claims)
    return 0


def cmd_push(args) -> int:
    from engine.runtime import share

    check_repo(args.repo)
    root = results_dir(args)
    try:
        count = share.push(root, args.repo, checkpoints=args.checkpoints, private=args.private)
    except (share.HubUnavailable, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    print(f"pushed {count} files from {root} to https://huggingface.co/datasets/{args.repo}")
    return 0


def cmd_pull(args) -> int:
    from engine.runtime import share

    check_repo(args.repo)
    store = open_store(args)
    try:
        came = share.pull(store.root, args.repo, checkpoints=args.checkpoints)
    except share.HubUnavailable as e:
        raise UsageError(str(e)) from None
    top = came["tables"]
    named = f" ({', '.join(top[:5])}{', ...' if len(top) > 5 else ''})" if top else ""
    print(f"pulled {args.repo} into {store.root}: {came['files']} files downloaded, {came['runs']} runs or refits, "
          f"{len(top)} top-level files{named}; view it with: loopscope dashboard --results {store.root}")  # fmt: skip
    return 0


def cmd_ouro(args) -> int:
    from engine.experiments import e1

    args.loops = parse_loops(args.loops)
    tasks = e1.validate(args)  # all input checked before the results folder is touched
    if args.dry_run:
        return e1.dry_run(args, tasks, device_of(args))
    return e1.cmd_ouro(args, tasks, device_of(args), open_store(args))


def cmd_bench(args) -> int:
    from engine.runtime import bench

    if args.only == "precision":  # the CPU's fp32 against its bf16, at three sizes
        result, report = bench.run_precision(quick=args.quick), bench.format_precision_report
    elif args.device == "cpu":
        result, report = bench.run_all(quick=args.quick, results=results_dir(args)), bench.format_report
    else:  # the GPU script: the paper preset's throughput against the device's bf16 peak
        device = device_of(args)
        if device == "cpu":
            raise UsageError("--device auto found no GPU; run `loopscope bench` for the CPU benchmark.")
        result, report = bench.run_device(device, compile=not args.no_compile), bench.format_device_report
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


def cmd_verify(args) -> int:
    """Retrain seeds of a shipped study here: bit-identical, or inside the shipped seeds' distribution per n."""
    from engine.core.store import Store
    from engine.runtime import verify

    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
    seeds = parse_seeds(args.seeds)
    units = [
        cfg for cfg, _ in REGISTRY[args.experiment].trainings(args.preset, tasks_of(args.preset))
        if (args.task in (None, cfg.task.name)) and (args.boundary in (None, cfg.model.boundary))
        and (args.arch in (None, cfg.model.arch))
    ]  # fmt: skip
    store = Store(study_root(results_dir(args), args.preset))
    missing = [cfg.run_key(s) for cfg in units for s in seeds if store.status(cfg.run_key(s)) != "ok"]
    if not units or missing:
        raise UsageError(
            f"no shipped runs to verify under {store.root} ({len(missing)} missing, e.g. {missing[:1]}); "
            f"run 'loopscope run {args.experiment} --preset {args.preset}' there first, or pass --results."
        )
    device, results = device_of(args), []
    check_memory([(cfg, seeds) for cfg in units], device)  # every group retrains
    for cfg in units:
        groups = cfg.groups(seeds)
        what = f"{cfg.task.name} {cfg.model.arch} {cfg.model.boundary}, {cfg.train.steps} steps"
        print(f"retraining {len(groups)} group(s) of {cfg.train.group_size} seeds ({what}): a seed trains in its "
              "whole group.", file=sys.stderr)  # fmt: skip
        result = verify.verify(store, cfg, seeds, device)
        print(verify.report(result, cfg))
        results.append(all(result["identical"].values()) or bool((result["per_n"]["mann_whitney_p"] >= 0.05).all()))
    return 0 if all(results) else 1


def cmd_restore(args) -> int:
    """Retrain the groups of runs stored without their weights; keep weights only where rows match bit for bit."""
    from engine.core.store import Store, check_run_key, weights_not_kept
    from engine.experiments.runs import restore

    if bool(args.run_keys) == bool(args.experiment):
        raise UsageError(
            "name runs (loopscope restore RUN_KEY...) or a study (--experiment e2 --preset cpu), one of them."
        )
    if args.experiment:
        if args.preset not in PRESETS:
            raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
        module = REGISTRY[args.experiment]
        seeds = parse_seeds(args.seeds) if args.seeds else None
        store = Store(study_root(results_dir(args), args.preset))
        cfgs = [cfg for cfg, _ in module.trainings(args.preset, tasks_of(args.preset))]
        wanted = {cfg.run_key(s) for cfg in cfgs for s in seeds} if seeds else None
        keys = []
        for k in store.run_keys():
            if (wanted is None or k in wanted) and store.status(k) == "ok":
                m = store.manifest(k)
                if weights_not_kept(m) is not None and RunConfig.from_dict(m["config"]) in cfgs:
                    keys.append(k)
        if not keys:
            print(f"no run of {args.experiment} at {args.preset} under {store.root} lacks its weights; nothing to do.")
            return 0
    else:
        keys = list(dict.fromkeys(args.run_keys))
        store = Store(key_root(args, keys))
        for key in keys:
            try:
                check_run_key(store.root, key)
            except ValueError as e:
                raise UsageError(str(e)) from None
            if store.status(key) != "ok":
                raise UsageError(f"no valid run {key} under {store.root}; 'loopscope list' shows the cached runs.")
    store = open_store(args, store.root)
    weightless = [k for k in keys if weights_not_kept(store.manifest(k)) is not None]
    groups = {json.dumps([store.manifest(k)[f] for f in ("config", "group")], sort_keys=True) for k in weightless}
    device = device_of(args)
    check_memory([(RunConfig.from_dict(store.manifest(k)["config"]), ()) for k in weightless], device)
    if weightless:
        print(f"restoring {len(weightless)} run(s): retraining {len(groups)} group(s) in a temporary folder.",
              file=sys.stderr)  # fmt: skip
    outcome = restore(store, keys, device)
    for key, what in outcome.items():
        print(f"{key}: {what}.")
    return 0 if all(w.startswith(("restored", "has its weights")) for w in outcome.values()) else 1


def _record(cfg: dict, with_config: bool, **fields) -> dict:
    """One row of `loopscope list`: the run's model read from its manifest's config (blank where it does not read),
    then `fields` (seed, steps, status...)."""
    cfg = cfg if isinstance(cfg, dict) else {}
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
    try:
        params = RunConfig.from_dict(cfg).model.n_params
    except (ValueError, TypeError, KeyError, AttributeError):
        params = None
    return {
        "run_key": fields.pop("run_key"), "task": task.get("name"),
        "arch": "looped" if model.get("tied", True) else "stacked", "boundary": model.get("boundary"),
        "T": model.get("trained_loops"), "params": params, **fields, **({"config": cfg} if with_config else {}),
    }  # fmt: skip


def part_trained(root: Path, with_config: bool) -> list[dict]:
    """The trainings under root's jobs/ckpt/ that a kill left midway (engine.experiments.runs.checkpoint_path): one
    record per seed of the group, at the step its checkpoint reached; running the same command again resumes it."""
    from engine.core.train import checkpoint_header

    out = []
    for path in sorted((root / "jobs" / "ckpt").glob("*.safetensors")):
        try:
            meta = checkpoint_header(path)
        except ValueError as e:
            raise UsageError(f"checkpoint {path} cannot be listed: {e}; delete it (the command that trained it then "
                             "starts that training again at step 0).") from None  # fmt: skip
        cfg, step = meta["config"], meta["step"]
        run = RunConfig.from_dict(cfg)
        for seed in meta["seeds"]:
            key, total = run.run_key(seed), run.train.steps
            status = (f"trained, not evaluated: step {step} of {total} (checkpoint; the same command evaluates it)"
                      if step >= total else
                      f"part-trained: step {step} of {total} (checkpoint; the same command resumes it)")  # fmt: skip
            out.append(_record(cfg, with_config, run_key=key, seed=seed, steps=step, final_loss=None, wall_s=None,
                               resumed_from=None, status=status, weights=""))  # fmt: skip
    return out


def cmd_list(args) -> int:
    """Every run of the results folder, and of the studies' own folders under it (column `folder`)."""
    from engine.core.store import Store

    roots = study_roots(args)
    records = []
    for store, key in ((Store(r), key) for r in roots for key in Store(r).run_keys()):
        status = store.status(key)
        try:
            m = store.manifest(key)
        except Exception:
            m = {}
        folder = {"folder": str(store.root.relative_to(roots[0]))} if len(roots) > 1 or args.json else {}
        records.append(folder | _record(
            m.get("config", {}), args.json, run_key=key, seed=m.get("seed"), steps=m.get("steps"),
            final_loss=m.get("final_loss"), wall_s=m.get("wall_time_s"),
            resumed_from=m.get("resumed_from_step") or None,  # wall_s counts the training from that step on
            status=status, weights=store.weights_state(key) if status == "ok" else "",
        ))  # fmt: skip
    records += [r | ({"folder": str(root.relative_to(roots[0]))} if len(roots) > 1 or args.json else {})
                for root in roots for r in part_trained(root, args.json)]  # fmt: skip
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    weightless = [r["run_key"] for r in records if r["weights"].startswith("not kept")]
    if weightless:  # one sentence, not one per run
        from engine.core.store import how_to_get_weights

        print(f"{len(weightless)} of {len(records)} runs are stored without their weights (rows and manifests "
              f"complete); {how_to_get_weights(weightless[0])}.", file=sys.stderr)  # fmt: skip
        for r in records:
            r["weights"] = "not kept" if r["weights"].startswith("not kept") else r["weights"]
    if not records:
        print(f"no runs under {roots[0]}; train some with 'loopscope train --preset smoke --seeds 2'.")
    else:
        table = pd.DataFrame(records)
        if table["resumed_from"].isna().all():  # the column only where a run was resumed from a checkpoint
            table = table.drop(columns="resumed_from")
        else:
            table["resumed_from"] = table["resumed_from"].map(lambda s: "" if pd.isna(s) else f"step {int(s)}")
        print(table.to_string(index=False))
    return 0


def cmd_merge(args) -> int:
    """A pack of the GPU study (dev/studies/gpu-study/gpu-study.sh) into the study's folder under the results folder."""
    from engine.runtime.gpu_pack import merge

    if not Path(args.pack).is_file():
        raise UsageError(f"no pack {args.pack}; name the gpu-study-PIECE.tar.gz a GPU run brought back.")
    try:
        done = merge(Path(args.pack), results_dir(args))
    except PermissionError as e:  # the results folder cannot be written: said before anything was merged
        raise UsageError(str(e)) from None
    tables = ", ".join(f"{name} ({rows:,} rows)" for name, rows in done["tables"].items()) or "none"
    print(f"merged {args.pack} (piece {done['piece']}) into {done['into']}: {done['added']} runs or refits added, "
          f"{done['extended']} extended; tables rebuilt: {tables}"
          + (f"; chain search: {', '.join(done['chain_search'])}" if done["chain_search"] else "") + ".")  # fmt: skip
    return 0


def cmd_check(args) -> int:
    from engine.core.checks import run_checks

    results = run_checks()
    if args.json:
        print(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        for r in results:
            print(f"{'PASS' if r.passed else 'FAIL'}  {r.name}  ({r.detail})")
    return 0 if all(r.passed for r in results) else 1


def dashboard_env(args) -> dict[str, str]:
    """The server's environment: its results folder, and who may run jobs. Beyond localhost it is read-only
    unless --allow-remote-jobs says otherwise (then LOOPSCOPE_REMOTE_JOBS=1, which the app checks too)."""
    from engine.runtime import settings

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port; pick one from 1 to 65535 (default 8501).")
    env = dict(os.environ, LOOPSCOPE_RESULTS=str(results_dir(args).resolve()))
    local = settings.is_local_address(args.host)
    if local and args.allow_remote_jobs:
        raise UsageError(f"--allow-remote-jobs is for a server beyond localhost; --host {args.host} is local only.")
    if local or args.allow_remote_jobs:
        env["LOOPSCOPE_REMOTE_JOBS"] = "1" if args.allow_remote_jobs else ""
        return env
    try:
        asked = settings.read_only_setting()
    except settings.Refused as e:
        raise UsageError(str(e)) from None
    if asked is False:
        raise UsageError(
            f"LOOPSCOPE_READ_ONLY says writable, but --host {args.host} reaches beyond this machine, where anyone "
            "could run jobs; add --allow-remote-jobs to allow that, or unset LOOPSCOPE_READ_ONLY."
        )
    print(f"loopscope: serving on {args.host or 'every interface'}, read-only (--allow-remote-jobs lets visitors "
          "run jobs).", file=sys.stderr)  # fmt: skip
    return env | {"LOOPSCOPE_READ_ONLY": "1", "LOOPSCOPE_REMOTE_JOBS": ""}


def cmd_dashboard(args) -> int:
    import threading

    env = dashboard_env(args)
    repo = REPO
    # the overview's verdicts, computed beside the server's start-up: a first visit finds them on disk
    warm = [sys.executable, "-m", "dashboard.results", env["LOOPSCOPE_RESULTS"]]
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if hasattr(os, "nice"):  # behind the server's own start-up and first session, not beside them
        quiet["preexec_fn"] = lambda: os.nice(10)
    warmer = subprocess.Popen(warm, env=env, cwd=repo, **quiet)
    threading.Thread(target=warmer.wait, name="reap-warm-up", daemon=True).start()  # no zombie once it ends
    address = ["--server.address", args.host, "--server.port", str(args.port)]
    # from the checkout, as the warm-up: its .streamlit/config.toml (theme, no usage statistics) applies
    return subprocess.call([sys.executable, "-m", "dashboard.serve", *address], env=env, cwd=repo)


def cmd_report(args) -> int:
    root = results_dir(args)
    if not root.is_dir():
        raise UsageError(f"no results folder {root}; run an experiment first (loopscope run e2 --preset cpu).")
    # the report is the dashboard's, the layer above the CLI: its own process, as the server is (cmd_dashboard)
    chosen = [args.preset] if args.preset else []
    report = [sys.executable, "-m", "dashboard.report", str(Path(args.out).resolve()), str(root.resolve()), *chosen]
    return subprocess.call(report, cwd=REPO)


PRECISION_HELP = (
    "train.precision on the CPU (part of the run key): fp32 (default, every run before the option), bf16 (autocast, "
    "fp32 weights, AdamW, loss and evaluation), auto (bf16 only on a CPU with native bf16 and a model large enough)"
)


def build_parser() -> Parser:
    common = Parser(add_help=False)
    common.add_argument("--results", help=f"results folder (default: $LOOPSCOPE_RESULTS or ./{DEFAULT_RESULTS})")
    parser = Parser(prog="loopscope", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("train", parents=[common], help="train seeds of a preset or config (cached)")
    p.add_argument("--preset", default="cpu", help=f"one of {', '.join(PRESETS)} (default cpu)")
    p.add_argument("--config", help="a run config as JSON instead of a preset")
    p.add_argument("--task", default="parity", choices=["parity", "chain"])
    p.add_argument("--boundary", default="norm", choices=["norm", "none"], help="the mode to train with")
    p.add_argument("--arch", default="looped", choices=["looped", "stacked"])
    p.add_argument("--seeds", default="1", help="a count (16 = seeds 0..15), a range 0-15 or a list 0,3,7")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--group-size", type=int, help="seeds trained together as one batch (part of the config, so of the run key)"
    )
    p.add_argument("--backend", default="local", choices=["local", "ray"], help=BACKEND_HELP)
    p.add_argument("--precision", choices=["fp32", "bf16", "auto"], help=PRECISION_HELP)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", parents=[common], help="evaluate cached runs at more loop counts or in the other mode")
    p.add_argument("run_keys", nargs="+", metavar="RUN_KEY")
    p.add_argument(
        "--loops", default="1-12", help=f"loop counts, e.g. 1-24 (one forward of the largest; {MAX_LOOPS} at most)"
    )
    p.add_argument(
        "--boundary",
        choices=["norm", "none", "rescale"],
        help="run in this mode (default: the trained one); rescale: E5's surgery on a norm-trained run, n = 1..max",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("run", parents=[common], help="run a named experiment (cached): e2..e5, or all (e2-e4)")
    titles = "; ".join(f"{name}: {module.TITLE}" for name, module in REGISTRY.items())
    p.add_argument("experiment", choices=[*REGISTRY, "all"], help=f"{titles}; all: {', '.join(PAPER)}")
    p.add_argument("--preset", default="cpu", help=f"one of {', '.join(PRESETS)} (default cpu)")
    p.add_argument("--seeds", default="16", help="a count (16 = seeds 0..15), a range or a list")
    p.add_argument("--tasks", help="comma-separated tasks (default: the preset's, parity,chain; gpu: parity)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--backend", default="local", choices=["local", "ray"], help=BACKEND_HELP)
    p.add_argument(
        "--workers", type=int, default=1, help="local backend: processes sharing the cores (2 is fastest on 2 cores)"
    )
    p.add_argument("--precision", choices=["fp32", "bf16", "auto"], help=PRECISION_HELP)
    p.set_defaults(func=with_precision(cmd_run))

    for name, verb in (("push", "upload results to"), ("pull", "download results from")):
        p = sub.add_parser(name, parents=[common], help=f"{verb} a Hugging Face dataset repo")
        p.add_argument("--repo", required=True, metavar="ORG/NAME", help="the dataset repo")
        p.add_argument(
            "--checkpoints", action="store_true", help="include the weights (model.safetensors, refit.safetensors)"
        )
        if name == "push":
            p.add_argument("--private", action="store_true", help="create the repo private")
        p.set_defaults(func=cmd_push if name == "push" else cmd_pull)

    p = sub.add_parser("ouro", parents=[common], help="E1: probe released Ouro weights with and without the norm")
    p.add_argument("--model", default="ByteDance/Ouro-1.4B", help="a Hugging Face id or a local checkpoint folder")
    p.add_argument("--task", default="chain,parity", help="comma-separated probe tasks (chain, parity)")
    p.add_argument("--loops", default="1-8", help="loop counts, e.g. 1-8 (one forward of the largest)")
    p.add_argument("--difficulty", default=None, help="per task, e.g. chain=8,parity=12 (default chain=3,parity=6)")
    p.add_argument("--prompts", type=int, default=500, help="prompts per task (even: labels exactly balanced)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bf16 on GPU")
    p.add_argument(
        "--readout", default="final", choices=["final", "released"],
        help="final (default, the study's): the answer at loop step n; released: where the released "
        "forward's early exit (config early_exit_threshold) stops within n steps",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print what would be downloaded and run, and its cost")
    p.set_defaults(func=cmd_ouro)

    p = sub.add_parser("bench", parents=[common], help="measure every fast path against its baseline, as ratios")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="fewer seeds and steps (seconds, noisier)")
    p.add_argument(
        "--device", default="cpu", choices=["auto", "cpu", "cuda"], help="cuda/auto: the paper preset on a GPU"
    )
    p.add_argument("--no-compile", action="store_true", help="with a GPU: skip the torch.compile levers")
    p.add_argument(
        "--only", choices=["precision"], help="one section: precision (fp32 vs bf16 training steps, CPU flags)"
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("verify", parents=[common], help="retrain seeds of a shipped study here and compare")
    p.add_argument("experiment", choices=list(REGISTRY))
    p.add_argument("--preset", default="cpu", help=f"one of {', '.join(PRESETS)} (default cpu)")
    p.add_argument("--seeds", default="2", help="the seeds to retrain (a count, a range or a list; default 2)")
    p.add_argument("--task", choices=["parity", "chain"], help="only this task's trainings")
    p.add_argument("--boundary", choices=["norm", "none"], help="only the trainings in this mode")
    p.add_argument("--arch", choices=["looped", "stacked"], help="only this architecture")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("restore", parents=[common], help="retrain runs stored without their weights, to get them back")
    p.add_argument("run_keys", nargs="*", metavar="RUN_KEY")
    p.add_argument("--experiment", choices=list(REGISTRY), help="every weightless run of this experiment at --preset")
    p.add_argument("--preset", default="cpu", help=f"with --experiment: one of {', '.join(PRESETS)} (default cpu)")
    p.add_argument("--seeds", help="with --experiment: only these seeds (default: every stored seed)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("list", parents=[common], help="list cached runs and their state")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "merge", parents=[common], help="merge a GPU study's pack (dev/studies/gpu-study/gpu-study.sh) into the results"
    )
    p.add_argument("pack", help="gpu-study-PIECE.tar.gz, as a GPU run brought it back")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("check", help="run the implementation checks; exit 1 if any fails")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("dashboard", parents=[common], help="open the Streamlit dashboard")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument(
        "--host", default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only); 0.0.0.0 serves every interface, "
        "read-only unless --allow-remote-jobs",
    )  # fmt: skip
    p.add_argument(
        "--allow-remote-jobs", action="store_true", help="with --host beyond localhost: let visitors submit jobs"
    )
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("report", parents=[common], help="write a static HTML report (claims, figures, provenance)")
    p.add_argument("--out", required=True, help="folder for index.html (created)")
    p.add_argument("--preset", help="the scale to report where its table exists (default: the largest present)")
    p.set_defaults(func=cmd_report)
    return parser


def remove_temporaries(args) -> None:
    """This process's half-written files under the results folder, should a writer have left one behind
    (engine.core.store.atomic_write removes its own)."""
    try:
        for tmp in results_dir(args).glob(f"**/.*.{os.getpid()}.tmp"):
            tmp.unlink(missing_ok=True)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "group_size", None) is not None and args.group_size < 1:
            raise UsageError("--group-size must be at least 1.")
        return args.func(args)
    except UsageError as e:
        print(f"loopscope: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a known failure (no space, no permission, no memory, a bad checkpoint): one sentence
        sentence = explain(e)
        if sentence is None:
            raise  # a bug: its traceback is the report
        if args is not None and hasattr(args, "results"):
            remove_temporaries(args)
        print(f"loopscope: error: {sentence}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("loopscope: interrupted; finished runs are cached, the rest will be redone.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
