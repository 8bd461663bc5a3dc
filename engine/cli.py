"""`loopscope` (also `python -m engine`): train, evaluate, list and check runs; open the dashboard.

Bad input ends with one sentence on stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from engine.presets import PRESETS, RunConfig, preset

DEFAULT_RESULTS = "cached_results"
BACKEND_HELP = "local (default): this process; ray: seed groups as Ray tasks ($RAY_ADDRESS or a local Ray)"


class UsageError(Exception):
    """Bad input: the message says what is wrong and what to do."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own default prints the usage too)
        raise UsageError(f"{message} (see '{self.prog} --help')")


def results_dir(args) -> Path:
    return Path(args.results or os.environ.get("LOOPSCOPE_RESULTS") or DEFAULT_RESULTS)


def parse_ints(text: str, what: str) -> list[int]:
    """'3-7', '1,2,5' or a mix like '1-4,8'."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if re.fullmatch(r"-\d+", part):
            raise UsageError(f"{what} must not be negative (got {text!r}).")
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise UsageError(f"cannot read {what} {text!r}; write a number, a range like 1-24, or a list like 1,2,8.")
        lo, hi = int(match[1]), int(match[2] or match[1])
        if lo > hi:
            raise UsageError(f"{what} range {part!r} runs backwards; write it low-high, e.g. 1-24.")
        out += range(lo, hi + 1)
    return out


def parse_seeds(text: str) -> list[int]:
    if re.fullmatch(r"-?\d+", text.strip()):
        count = int(text)
        if count < 1:
            raise UsageError(f"--seeds {text}: give a positive number of seeds, or a list like 0-15.")
        return list(range(count))
    return sorted(set(parse_ints(text, "--seeds")))


def parse_loops(text: str) -> list[int]:
    loops = sorted(set(parse_ints(text, "--loops")))
    if not loops or loops[0] < 1:
        raise UsageError(f"--loops {text}: loop counts start at 1, e.g. --loops 1-24.")
    return loops


def load_config(args) -> RunConfig:
    if args.config:
        try:
            return RunConfig.from_dict(json.loads(Path(args.config).read_text()))
        except FileNotFoundError:
            raise UsageError(
                f"config file {args.config} does not exist; pass a JSON file written by 'loopscope list --json'."
            ) from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise UsageError(
                f"config file {args.config} is not a run config ({e}); start from a preset's JSON."
            ) from None
    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
    try:
        return preset(args.preset, args.task, args.boundary, args.arch)
    except ValueError as e:  # validation says what to change
        raise UsageError(str(e)) from None


def device_of(args) -> str:
    from engine.train import resolve_device

    try:
        return resolve_device(args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None


def open_store(args):
    from engine.store import Store

    store = Store(results_dir(args))
    try:
        store.check_writable()
    except PermissionError as e:
        raise UsageError(str(e)) from None
    return store


def accuracy_table(rows: pd.DataFrame) -> str:
    acc = rows[rows["metric"] == "accuracy"]
    table = acc.pivot_table(index=["boundary", "difficulty"], columns="eval_loops", values="value", aggfunc="mean")
    return f"mean accuracy over {acc['seed'].nunique()} seed(s), by difficulty (rows) and loop count n (columns):\n" + (
        table.round(3).to_string()
    )


# ---------------------------------------------------------------- commands


def ray_fan_out(args, units, store, group_size: int) -> str:
    """--backend ray: train the units as Ray tasks first (each worker resolves --device on its own); the
    command then finds them cached. Returns the device for what remains here (this machine may lack CUDA)."""
    try:
        import ray  # noqa: F401

        from engine.fanout import fan_out
    except ImportError:
        raise UsageError("--backend ray needs Ray: pip install 'loopscope[ray]' (or 'ray[default]').") from None
    fan_out(units, store, args.device, group_size)
    from engine.train import resolve_device

    return "cpu" if args.device == "cpu" else resolve_device("auto")


def cmd_train(args) -> int:
    cfg = load_config(args)
    seeds = parse_seeds(args.seeds)
    from engine.experiments import ensure_runs

    store = open_store(args)
    if args.backend == "ray":
        device = ray_fan_out(args, [(cfg, seeds, "train")], store, args.group_size)
    else:
        device = device_of(args)
    keys = ensure_runs(cfg, seeds, store, experiment="train", device=device, group_size=args.group_size)
    rows = pd.concat([store.load_rows(k) for k in keys])
    print(accuracy_table(rows))
    print("runs: " + " ".join(keys))
    return 0


def cmd_eval(args) -> int:
    from engine.experiments import extend_eval

    loops = parse_loops(args.loops)
    store = open_store(args)
    for key in args.run_keys:
        status = store.status(key)
        if status == "missing":
            raise UsageError(f"no run {key!r} under {store.root}; 'loopscope list' shows the cached runs.")
        if status != "ok":
            raise UsageError(f"{status}; retrain it with 'loopscope train' (same config and seed).")
    device = device_of(args)
    rows = extend_eval(store, args.run_keys, loops, boundary=args.boundary, device=device)
    print(accuracy_table(rows))
    return 0


EXPERIMENTS = ("e2", "e3", "e4")


def cmd_run(args) -> int:
    """One experiment, or `all` (E2, E3, E4 in order; each reuses what the one before cached)."""
    import importlib

    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    modules = [importlib.import_module(f"engine.{name}") for name in names]
    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
    seeds = parse_seeds(args.seeds)
    tasks = [t.strip() for t in args.tasks.split(",")]
    for module in modules:
        unknown = sorted(set(tasks) - set(module.TASKS))
        if unknown:
            raise UsageError(f"unknown task {unknown[0]!r} in --tasks; choose from {', '.join(module.TASKS)}.")
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}.")
    if args.workers > 1 and args.backend == "ray":
        raise UsageError("--workers is for the local backend; Ray places its tasks itself (drop --workers).")
    store = open_store(args)
    device = device_of(args)
    for name, module in zip(names, modules, strict=True):
        start = time.perf_counter()  # the fan-out included: the figure is the experiment's wall time
        if args.backend == "ray":
            from engine.fanout import experiment_units

            units = [(cfg, seeds, label) for cfg, label in experiment_units(name, args.preset, tasks)]
            device = ray_fan_out(args, units, store, group_size=16)
        elif args.workers > 1:
            from engine.fanout import local_fan_out

            local_fan_out(name, args.preset, tasks, seeds, store, device, args.workers)
        rows = module.run(args.preset, seeds, store, device, tasks)
        if len(names) > 1:
            print(f"\n== {name.upper()} ({time.perf_counter() - start:.0f} s)")
        print(module.report(rows, args.preset))
    return 0


def check_repo(repo: str) -> None:
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise UsageError(f"--repo {repo!r} is not a Hugging Face repo id; write it ORG/NAME.")


def cmd_push(args) -> int:
    from engine import share

    check_repo(args.repo)
    root = results_dir(args)
    try:
        count = share.push(root, args.repo, checkpoints=args.checkpoints, private=args.private)
    except (share.HubUnavailable, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    print(f"pushed {count} files from {root} to https://huggingface.co/datasets/{args.repo}")
    return 0


def cmd_pull(args) -> int:
    from engine import share

    check_repo(args.repo)
    store = open_store(args)
    try:
        share.pull(store.root, args.repo, checkpoints=args.checkpoints)
    except share.HubUnavailable as e:
        raise UsageError(str(e)) from None
    print(f"pulled {args.repo} into {store.root}; view it with: loopscope dashboard --results {store.root}")
    return 0


def cmd_ouro(args) -> int:
    from engine import e1

    args.loops = parse_loops(args.loops)
    return e1.cmd_ouro(args)


def cmd_bench(args) -> int:
    from engine import bench

    if args.device == "cpu":
        result, report = bench.run_all(quick=args.quick, results=results_dir(args)), bench.format_report
    else:  # the GPU script: the paper preset's throughput against the device's bf16 peak
        device = device_of(args)
        if device == "cpu":
            raise UsageError("--device auto found no GPU; run `loopscope bench` for the CPU benchmark.")
        result, report = bench.run_device(device, compile=args.compile), bench.format_device_report
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


def cmd_list(args) -> int:
    from engine.store import Store

    store = Store(results_dir(args))
    records = []
    for key in store.run_keys():
        status = store.status(key)
        try:
            m = store.manifest(key)
        except Exception:
            m = {}
        cfg = m.get("config", {})
        records.append(
            {
                "run_key": key,
                "task": cfg.get("task", {}).get("name"),
                "arch": "looped" if cfg.get("model", {}).get("tied", True) else "stacked",
                "boundary": cfg.get("model", {}).get("boundary"),
                "T": cfg.get("model", {}).get("trained_loops"),
                "seed": m.get("seed"),
                "steps": m.get("steps"),
                "final_loss": m.get("final_loss"),
                "wall_s": m.get("wall_time_s"),
                "status": status,
                **({"config": cfg} if args.json else {}),
            }
        )
    if args.json:
        print(json.dumps(records, indent=2))
    elif not records:
        print(f"no runs under {store.root}; train some with 'loopscope train --preset smoke --seeds 2'.")
    else:
        print(pd.DataFrame(records).to_string(index=False))
    return 0


def cmd_check(args) -> int:
    from engine.checks import run_checks

    results = run_checks()
    if args.json:
        print(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        for r in results:
            print(f"{'PASS' if r.passed else 'FAIL'}  {r.name}  ({r.detail})")
    return 0 if all(r.passed for r in results) else 1


def cmd_dashboard(args) -> int:
    import dashboard

    app = Path(dashboard.__file__).parent / "app.py"
    env = dict(os.environ, LOOPSCOPE_RESULTS=str(results_dir(args).resolve()))
    command = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(args.port)]
    return subprocess.call(command, env=env)


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
    p.add_argument("--group-size", type=int, default=16, help="seeds trained together in one process")
    p.add_argument("--backend", default="local", choices=["local", "ray"], help=BACKEND_HELP)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", parents=[common], help="evaluate cached runs at more loop counts or in the other mode")
    p.add_argument("run_keys", nargs="+", metavar="RUN_KEY")
    p.add_argument("--loops", default="1-12", help="loop counts, e.g. 1-24 (one forward of the largest)")
    p.add_argument("--boundary", choices=["norm", "none"], help="run in this mode (default: the trained one)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("run", parents=[common], help="run a named experiment (cached): e2, e3, e4, or all")
    p.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    p.add_argument("--preset", default="cpu", help=f"one of {', '.join(PRESETS)} (default cpu)")
    p.add_argument("--seeds", default="16", help="a count (16 = seeds 0..15), a range or a list")
    p.add_argument("--tasks", default="parity,chain", help="comma-separated tasks (default parity,chain)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--backend", default="local", choices=["local", "ray"], help=BACKEND_HELP)
    p.add_argument(
        "--workers", type=int, default=1, help="local backend: processes sharing the cores (2 is fastest on 2 cores)"
    )
    p.set_defaults(func=cmd_run)

    for name, verb in (("push", "upload results to"), ("pull", "download results from")):
        p = sub.add_parser(name, parents=[common], help=f"{verb} a Hugging Face dataset repo")
        p.add_argument("--repo", required=True, metavar="ORG/NAME", help="the dataset repo")
        p.add_argument("--checkpoints", action="store_true", help="include the weights (*.safetensors)")
        if name == "push":
            p.add_argument("--private", action="store_true", help="create the repo private")
        p.set_defaults(func=cmd_push if name == "push" else cmd_pull)

    p = sub.add_parser("ouro", parents=[common], help="E1: probe released Ouro weights with and without the norm")
    p.add_argument("--model", default="ByteDance/Ouro-1.4B", help="a Hugging Face id or a local checkpoint folder")
    p.add_argument("--task", default="chain,parity", help="comma-separated probe tasks (chain, parity)")
    p.add_argument("--loops", default="1-8", help="loop counts, e.g. 1-8 (one forward of the largest)")
    p.add_argument("--prompts", type=int, default=500, help="prompts per task (even: labels exactly balanced)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bf16 on GPU")
    p.set_defaults(func=cmd_ouro)

    p = sub.add_parser("bench", parents=[common], help="measure every fast path against its baseline, as ratios")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="fewer seeds and steps (seconds, noisier)")
    p.add_argument(
        "--device", default="cpu", choices=["auto", "cpu", "cuda"], help="cuda/auto: the paper preset on a GPU"
    )
    p.add_argument("--compile", action="store_true", help="with a GPU: also measure through torch.compile")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("list", parents=[common], help="list cached runs and their state")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("check", help="run the implementation checks; exit 1 if any fails")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("dashboard", parents=[common], help="open the Streamlit dashboard")
    p.add_argument("--port", type=int, default=8501)
    p.set_defaults(func=cmd_dashboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "group_size", 1) < 1:
            raise UsageError("--group-size must be at least 1.")
        return args.func(args)
    except UsageError as e:
        print(f"loopscope: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("loopscope: interrupted; finished runs are cached, the rest will be redone.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
