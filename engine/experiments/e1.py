"""E1: an Ouro checkpoint (the released weights, or any local Ouro folder) probed in both loop boundaries.

    loopscope ouro --model ByteDance/Ouro-1.4B --task chain,parity --loops 1-8 --prompts 500

For each task, `--prompts` balanced binary prompts (engine.experiments.e1_probe, prompt seed PROMPT_SEED, the probe's
default difficulty unless `--difficulty` names another) are read out at every loop step of ONE forward of
n = max(--loops) per batch, once as released (`norm`) and once with the boundary norm removed (`norm->none`,
the surgery). The n = 1 identity (both modes' logits torch.equal on a batch) is checked and recorded; if it
fails the results are still written, flagged in the manifest, a warning is printed and the command exits 1
(every later run that serves those cached results exits 1 too).

Results: `<results>/e1-<slug>.parquet` (engine.core.store.RESULT_COLUMNS rows; metric `top_token` is the
token id, the decoded strings are in the manifest) and `<results>/e1-<slug>.json` (model identity,
config, revision, per-task settings, n = 1 identity, prompts, decoded top tokens, provenance and the
table's sha256). A task whose key -- the model identity (config + sha256 of weights and tokenizer files)
and the probe settings -- is in the manifest is served from the table and not recomputed.

`python -m engine.experiments.e1_bench` times a random-weight Ouro-1.4B on this CPU.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from engine.core.store import RESULT_COLUMNS, CorruptRun, Store, provenance
from engine.errors import UsageError
from engine.experiments import e1_probe as P
from engine.ouro.hub import load_model, model_key, plan, resolve_model

EXPERIMENT = "e1"
PROMPT_SEED = 0
BATCH_SIZE = 16  # part of the cache key: padding within a batch changes the low bits
PROBE_VERSION = (
    3  # bump when the probe or the rows change meaning; old caches are then recomputed (3: readout, exit_step)
)
RELEASED_RULE = 2  # in the key of `--readout released` only (2: torch.cumsum on the model's device, issue 31)
MODES = {"norm": "norm", "none": "norm->none"}  # mode run -> boundary label (Ouro is trained with the norm)
METRICS = {  # result metric -> engine.experiments.e1_probe column
    "accuracy": "greedy_acc",
    "choice_accuracy": "forced_acc",
    "top_token_share": "top_share",
    "top_token": "top_token_id",
    "norm_pre": "norm_pre",
    "norm_post": "norm_post",
    "exit_prob": "exit_prob",
    "exit_step": "exit_step",
    "forced_margin": "forced_margin",
    "option_rate": "option_rate",
}  # plus norm_ratio: max/min of norm_post over steps 1..n
# ---------------------------------------------------------------- settings and cache


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def task_settings(task: str, args, dtype: torch.dtype, device: str) -> dict:
    readout = getattr(args, "readout", "final")
    return {
        "task": task,
        "difficulty": (getattr(args, "difficulty", None) or {}).get(task, P.DEFAULT_DIFFICULTY[task]),
        "prompts": int(args.prompts),
        "prompt_seed": PROMPT_SEED,
        "loops": [int(n) for n in args.loops],
        "n_max": max(args.loops),
        "dtype": str(dtype).removeprefix("torch."),
        "device_type": device,
        "batch_size": BATCH_SIZE,
        "readout": readout,
        **({"released_rule": RELEASED_RULE} if readout == "released" else {}),
        "probe_version": PROBE_VERSION,
    }


def task_key(mkey: str, settings: dict) -> str:
    return hashlib.sha256(json.dumps({"model": mkey, **settings}, sort_keys=True).encode()).hexdigest()[:16]


def table_paths(root: Path, slug: str) -> tuple[Path, Path]:
    return root / f"{EXPERIMENT}-{slug}.parquet", root / f"{EXPERIMENT}-{slug}.json"


def read_cached(root: Path, slug: str) -> tuple[dict, pd.DataFrame] | None:
    """The manifest and table of a previous run, verified against the manifest's sha256; None if absent or bad."""
    table, manifest_path = table_paths(root, slug)
    if not manifest_path.exists():
        return None
    try:
        return Store(root).read_probe(table.stem)
    except CorruptRun as e:
        print(f"loopscope: {e}; recomputing.", file=sys.stderr)
        return None


# ---------------------------------------------------------------- probing


@torch.inference_mode()
def ouro_n1_identity(model, tokenizer, prompts: list[P.ProbePrompt]) -> dict:
    """Both modes at n = 1 on the first probe batch (left padded, as the probe runs it): bit-identical?"""
    batch = [pr.prompt for pr in P.fit_prompts(tokenizer, prompts[:BATCH_SIZE])]
    saved = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        enc = tokenizer(batch, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = saved
    device = next(model.parameters()).device
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    a, b = (model.loop_forward(ids, mask, n_loops=1, boundary=m) for m in MODES)
    checks = {f: torch.equal(getattr(a, f), getattr(b, f)) for f in ("logits", "norm_pre", "exit_probs")}
    return {"batch": len(batch), **{f"{f}_equal": v for f, v in checks.items()}}


def probe_task(model, tokenizer, settings: dict, key: str, trained_loops: int) -> tuple[pd.DataFrame, dict]:
    """Rows (RESULT_COLUMNS) and the manifest entry of one task: both modes, one n_max forward per batch."""
    from tqdm.auto import tqdm

    task, n_max, keep = settings["task"], settings["n_max"], set(settings["loops"])
    prompts = P.make_prompts(task, settings["prompts"], seed=PROMPT_SEED, difficulty=settings["difficulty"])
    start = time.time()
    identity = ouro_n1_identity(model, tokenizer, prompts)
    frames = {}
    for mode, label in MODES.items():
        with tqdm(total=len(prompts), desc=f"e1 {task} {label} n<={n_max}", unit="prompt") as bar:
            frames[label] = P.probe(model, tokenizer, prompts, n_max, mode, BATCH_SIZE, bar.update, settings["readout"])
    # every step-1 column but norm_post (by definition |Norm(pre)| in one mode and |pre| in the other)
    step1 = [f[f["step"] == 1].drop(columns=["boundary", "norm_post"]).reset_index(drop=True) for f in frames.values()]
    identity["rows_equal"] = bool(step1[0].equals(step1[1]))
    identity["passed"] = all(v for k, v in identity.items() if k.endswith("_equal"))
    rows = []
    for label, df in frames.items():
        df = df.assign(norm_ratio=df["norm_post"].cummax() / df["norm_post"].cummin())
        for _, r in df[df["step"].isin(keep)].iterrows():
            for metric, col in {**METRICS, "norm_ratio": "norm_ratio"}.items():
                rows.append(
                    {
                        "experiment": EXPERIMENT,
                        "run_key": key,
                        "task": task,
                        "arch": "looped",
                        "boundary": label,
                        "seed": PROMPT_SEED,
                        "trained_loops": trained_loops,
                        "eval_loops": int(r["step"]),
                        "difficulty": settings["difficulty"],
                        "metric": metric,
                        "value": float(r[col]),
                    }
                )
    fitted = P.fit_prompts(tokenizer, prompts)
    entry = {
        "run_key": key,
        "settings": settings,
        "n1_identity": identity,
        "top_tokens": {
            label: {str(int(r.step)): {"id": int(r.top_token_id), "text": r.top_token} for r in df.itertuples()}
            for label, df in frames.items()
        },
        "prompts": [{"prompt": pr.prompt, "answer": pr.answer, "options": list(pr.options)} for pr in fitted],
        "prompt_space_moved": any(f.prompt != p.prompt for f, p in zip(fitted, prompts, strict=True)),
        "readout_device": str(next(model.parameters()).device),  # the released exit step depends on it
        "early_exit": {k: getattr(model.config, k, None) for k in ("early_exit_threshold", "early_exit_step")},
        "wall_time_s": round(time.time() - start, 2),
    }
    return pd.DataFrame(rows, columns=RESULT_COLUMNS), entry


# ---------------------------------------------------------------- the command


def validate(args) -> list[str]:
    tasks = [t.strip() for t in str(args.task).split(",") if t.strip()]
    if not tasks:
        raise UsageError(f"--task {args.task!r} names no task; choose from {', '.join(P.TASKS)}.")
    unknown = [t for t in tasks if t not in P.TASKS]
    if unknown:
        raise UsageError(f"unknown task {unknown[0]!r} in --task; choose from {', '.join(P.TASKS)}.")
    if args.prompts < 2 or args.prompts % 2:
        raise UsageError(
            f"--prompts {args.prompts}: give a positive even number, so that the two answers are exactly balanced."
        )
    args.difficulty = parse_difficulty(getattr(args, "difficulty", None))
    return list(dict.fromkeys(tasks))


def parse_difficulty(text: str | dict | None) -> dict[str, int]:
    """`--difficulty chain=8,parity=12` -> {"chain": 8, "parity": 12}; a task not named keeps the probe's default
    (chain 3 hops, parity 6 bits)."""
    if not text or isinstance(text, dict):
        return dict(text or {})
    out = {}
    for part in str(text).split(","):
        task, _, value = part.strip().partition("=")
        if task not in P.TASKS or not value.strip().isdigit():
            raise UsageError(f"--difficulty {text!r}: write task=number pairs, e.g. chain=8,parity=12.")
        out[task] = int(value)
        try:
            P.make_prompts(task, 2, difficulty=out[task])
        except ValueError as e:
            raise UsageError(f"--difficulty {text!r}: {e}.") from None
    return out


def cmd_ouro(args, tasks: list[str], device: str, store: Store) -> int:
    """`loopscope ouro`: see the module docstring. Exit 0, 1 (n = 1 identity failed) or 2 (bad input).
    `tasks` come from validate(args); the CLI resolves the device and checks the results folder."""
    dtype = resolve_dtype(args.dtype, device)
    source = resolve_model(args.model)
    mkey = model_key(source)
    root = store.root
    table_path, manifest_path = table_paths(root, source.slug)

    cached = read_cached(root, source.slug)
    if cached and cached[0].get("model", {}).get("key") != mkey:
        print(f"loopscope: {table_path.name} holds another checkpoint's results; replacing them.", file=sys.stderr)
        cached = None
    manifest, table = cached if cached else ({}, pd.DataFrame(columns=RESULT_COLUMNS))
    entries = dict(manifest.get("tasks", {}))
    settings = {t: task_settings(t, args, dtype, device) for t in tasks}
    keys = {t: task_key(mkey, s) for t, s in settings.items()}
    todo = [t for t in tasks if entries.get(t, {}).get("run_key") != keys[t] or not (table["run_key"] == keys[t]).any()]

    if todo:
        start = time.time()
        need = plan(str(source.path), str(dtype).removeprefix("torch."), args.prompts, todo, max(args.loops))
        if need["weights_gib"]:
            print(f"e1: loading {need['parameters']:,} parameters: {need['weights_gib']:.1f} GiB of weights in "
                  f"{str(dtype).removeprefix('torch.')}, plus activations", file=sys.stderr)  # fmt: skip
        model, tokenizer = load_model(source, device, dtype)
        trained = int(model.config.total_ut_steps)
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"e1: {source.spec} ({n_params:,} parameters, T = {trained}) in {str(dtype).removeprefix('torch.')} "
            f"on {device}; computing {', '.join(todo)}"
        )
        new_rows = []
        for task in todo:
            try:
                rows, entry = probe_task(model, tokenizer, settings[task], keys[task], trained)
            except ValueError as e:  # e.g. the tokenizer cannot tell the two answers apart
                raise UsageError(f"{task}: {e}") from None
            entry["provenance"] = provenance(device)
            entries[task] = entry
            new_rows.append(rows)
        table = table[~table["task"].isin(todo)]
        table = pd.concat([t for t in (table, *new_rows) if len(t)], ignore_index=True)[RESULT_COLUMNS]
        manifest = {
            "experiment": EXPERIMENT,
            "table": table_path.name,
            "model": {
                "spec": source.spec,
                "hub_id": source.hub_id,
                "path": str(source.path),
                "revision": source.revision,
                "slug": source.slug,
                "key": mkey,
                "files_sha256": source.files,
                "parameters": n_params,
                "trained_loops": trained,
                "config": json.loads((source.path / "config.json").read_text()),
                "training": training_record(source.path),
            },
            "tasks": entries,
            **provenance(device),
            "wall_time_s": round(time.time() - start, 2),
        }
        store.write_probe(table_path.stem, table, manifest)  # the table, then the manifest holding its checksum
        manifest = store.probe_manifest(table_path.stem)
    else:
        print(f"e1: {', '.join(tasks)} for {source.spec} cached in {table_path} (nothing recomputed)")

    print(report(table, manifest, tasks))
    print(f"table: {table_path}\nmanifest: {manifest_path}")
    failed = [t for t in tasks if not manifest["tasks"][t]["n1_identity"]["passed"]]
    if failed:
        print(
            f"loopscope: warning: the n = 1 identity failed for {', '.join(failed)} (the two modes' logits differ "
            "at n = 1); the results are written and flagged in the manifest, exit status 1.",
            file=sys.stderr,
        )
        return 1
    return 0


def training_record(path: Path) -> dict | None:
    """The summary of `training.json` (written by engine.experiments.e1_demo) beside a checkpoint trained here, if
    any."""
    try:
        record = json.loads((path / "training.json").read_text())
    except (OSError, ValueError):
        return None
    keep = (
        "what",
        "parameters",
        "config",
        "train",
        "objective",
        "boundary",
        "probe",
        "held_out",
        "seed",
        "threads",
        "wall_time_s",
    )
    return {k: record[k] for k in keep if k in record} | {"last_eval": (record.get("evals") or [None])[-1]}


def report(table: pd.DataFrame, manifest: dict, tasks: list[str]) -> str:
    """Per task, a per-step table of both modes: accuracy, forced choice, the head's top token, the state norm."""
    out = []
    model = manifest["model"]
    for task in tasks:
        entry = manifest["tasks"][task]
        s = entry["settings"]
        rows = table[table["run_key"] == entry["run_key"]]
        wide = rows.pivot_table(index="eval_loops", columns=["boundary", "metric"], values="value")
        lines = {}
        for label in MODES.values():
            top = entry["top_tokens"][label]
            lines[label] = pd.DataFrame(
                {
                    "acc": wide[(label, "accuracy")].map("{:.3f}".format),
                    "choice": wide[(label, "choice_accuracy")].map("{:.3f}".format),
                    "top token (share)": [
                        f"{top[str(n)]['text']!r} ({wide.loc[n, (label, 'top_token_share')]:.2f})" for n in wide.index
                    ],
                    "|h_t|": wide[(label, "norm_post")].map("{:.4g}".format),
                    "ratio": wide[(label, "norm_ratio")].map("{:.3f}".format),
                }
            )
        both = pd.concat(lines, axis=1)
        both.index.name = "n"
        ident = entry["n1_identity"]
        out.append(
            f"\n{task} (difficulty {s['difficulty']}, {s['prompts']} prompts, chance 0.5), {model['spec']} "
            f"({model['parameters']:,} parameters, T = {model['trained_loops']}), {s['dtype']} on {s['device_type']}; "
            f"n = 1 identity {'passed' if ident['passed'] else 'FAILED'}; ratio = max/min |h_t| over steps 1..n\n"
            + both.to_string()
        )
    return "\n".join(out)


# ---------------------------------------------------------------- CPU cost of the released size


def dry_run(args, tasks: list[str], device: str) -> int:
    """`loopscope ouro --dry-run`: what would be read or downloaded and run, the memory and the time it
    should take on this project's CPU; nothing is downloaded, loaded or written."""
    dtype = str(resolve_dtype(args.dtype, device)).removeprefix("torch.")
    p = plan(args.model, dtype, args.prompts, tasks, max(args.loops))
    where = "in the Hub cache: " if p["hub"] and p["cached"] else "local folder: " if p["cached"] else ""
    print(f"model: {p['model']} ({where}{p['source']})")
    if p["parameters"]:
        print(f"parameters: {p['parameters']:,}; weights {p['weights_gib']:.1f} GiB in {dtype}")
    else:
        print("parameters: unknown until its config is downloaded")
    print(f"runs: {len(tasks)} task(s) x {args.prompts} prompts x 2 modes = {p['forwards']} forwards of "
          f"n = {max(args.loops)} loops on {device}, {dtype}")  # fmt: skip
    if p["estimated_s"] and device == "cpu":
        t = p["estimated_s"]
        took = f"{t / 60:.0f} min" if t >= 90 else f"{t:.0f} s"
        print(f"time here: about {took} on a 2-core CPU like this project's (docs/performance.md), plus "
              "loading; a GPU takes seconds")  # fmt: skip
    return 0
