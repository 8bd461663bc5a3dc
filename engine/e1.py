"""E1: an Ouro checkpoint (the released weights, or any local Ouro folder) probed in both loop boundaries.

    loopscope ouro --model ByteDance/Ouro-1.4B --task chain,parity --loops 1-8 --prompts 500

For each task, `--prompts` balanced binary prompts (engine.probe, prompt seed PROMPT_SEED, the probe's
default difficulty) are read out at every loop step of ONE forward of n = max(--loops) per batch, once as
released (`norm`) and once with the boundary norm removed (`norm->none`, the surgery). The n = 1 identity
(both modes' logits torch.equal on a batch) is checked and recorded; if it fails the results are still
written, flagged in the manifest, a warning is printed and the command exits 1 (every later run that
serves those cached results exits 1 too).

Results: `<results>/e1-<slug>.parquet` (engine.store.RESULT_COLUMNS rows; metric `top_token` is the
token id, the decoded strings are in the manifest) and `<results>/e1-<slug>.json` (model identity,
config, revision, per-task settings, n = 1 identity, prompts, decoded top tokens, provenance and the
table's sha256). A task whose key -- the model identity (config + sha256 of weights and tokenizer files)
and the probe settings -- is in the manifest is served from the table and not recomputed.

`python -m engine.e1 --measure` times a random-weight Ouro-1.4B on this CPU (see `measure_cpu`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
import torch

from engine import probe as P
from engine.cli import UsageError, device_of, open_store
from engine.store import RESULT_COLUMNS, atomic_write, parquet_bytes, provenance, sha256

EXPERIMENT = "e1"
PROMPT_SEED = 0
BATCH_SIZE = 16  # part of the cache key: padding within a batch changes the low bits
PROBE_VERSION = 2  # bump when the probe or the rows change meaning; old caches are then recomputed
MODES = {"norm": "norm", "none": "norm->none"}  # mode run -> boundary label (Ouro is trained with the norm)
METRICS = {  # result metric -> engine.probe column
    "accuracy": "greedy_acc",
    "choice_accuracy": "forced_acc",
    "top_token_share": "top_share",
    "top_token": "top_token_id",
    "norm_pre": "norm_pre",
    "norm_post": "norm_post",
    "exit_prob": "exit_prob",
    "forced_margin": "forced_margin",
    "option_rate": "option_rate",
}  # plus norm_ratio: max/min of norm_post over steps 1..n
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model",
)  # fmt: skip
IDENTITY_FILES = ("config.json", *WEIGHT_FILES, *TOKENIZER_FILES)  # what the results depend on
DOWNLOAD_PATTERNS = [*IDENTITY_FILES, "generation_config.json"]  # never the remote modeling code
HEX64 = re.compile(r"^[0-9a-f]{64}$")


# ---------------------------------------------------------------- resolving the model


@dataclass
class ModelSource:
    spec: str  # what the user passed
    path: Path  # a local folder with config.json, safetensors and tokenizer files
    hub_id: str | None = None
    revision: str | None = None  # the Hub commit of a cached snapshot, when known
    slug: str = ""
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256 (see file_digest)


def not_cached_message(spec: str) -> str:
    return (
        f"the model {spec} is not in the local Hugging Face cache and the Hub cannot be reached from here; "
        f"fetch it on a machine with internet with 'hf download {spec} --local-dir FOLDER' (huggingface_hub's CLI), "
        "copy FOLDER here and pass it with --model FOLDER."
    )


def hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "")
    return constants.HF_HUB_OFFLINE or flag.upper() in {"1", "ON", "YES", "TRUE"}


def hub_reachable(timeout: float = 5.0) -> bool:
    """False when offline mode is set or the Hub's host does not accept a TCP connection within `timeout`."""
    if hub_offline():
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy decides; snapshot_download's own timeouts apply
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def looks_like_path(spec: str) -> bool:
    if spec.startswith(("/", "./", "../", "~", ".\\")) or spec.endswith(("/", os.sep)) or spec.count("/") > 1:
        return True
    head = spec.split("/")[0]
    return "/" in spec and Path(head).is_dir()  # e.g. cached_results/e1-demo


def slug_of(spec: str, path: Path) -> str:
    """A short file-name part: 'ByteDance/Ouro-1.4B' -> 'ouro-1.4b', 'cached_results/e1-demo' -> 'demo'."""
    name = None
    for part in (path, *path.parents):  # a Hub cache snapshot: .../models--ByteDance--Ouro-1.4B/snapshots/<sha>
        if part.name.startswith("models--"):
            name = part.name.split("--")[-1]
            break
    name = name or (spec.rstrip("/").split("/")[-1] if not Path(spec).exists() else path.name)
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "model"
    return slug.removeprefix(f"{EXPERIMENT}-") or slug


def checkpoint_problem(path: Path) -> str | None:
    """None if `path` holds config.json and every safetensors shard it needs; else what is missing."""
    if not (path / "config.json").is_file():
        return "has no config.json"
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError):
            return "has an unreadable model.safetensors.index.json"
        missing = sorted(s for s in shards if not (path / s).is_file())
        return f"lacks the weight shards {', '.join(missing)}" if missing else None
    if not any(path.glob("*.safetensors")):
        return "has no *.safetensors weights (pickle checkpoints are not loaded)"
    return None


def resolve_model(spec: str) -> ModelSource:
    """A local folder as given, else a Hub id from the local cache, else downloaded (when the Hub is reachable)."""
    local = Path(spec).expanduser()
    if local.exists() or looks_like_path(spec):
        if not local.is_dir():
            raise UsageError(
                f"--model {spec} is not a folder; pass a checkpoint folder (config.json, *.safetensors, "
                "tokenizer files) or a Hugging Face id such as ByteDance/Ouro-1.4B."
            )
        if problem := checkpoint_problem(local):
            raise UsageError(f"--model {spec} {problem}; pass a folder written by save_pretrained or the Hub.")
        return _source(spec, local.resolve(), None)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        path = Path(snapshot_download(spec, allow_patterns=DOWNLOAD_PATTERNS, local_files_only=True))
        if checkpoint_problem(path):
            path = None  # a partial snapshot: complete it online if we can
    except HFValidationError:
        raise UsageError(
            f"--model {spec} is neither a local folder nor a valid Hugging Face id (like ByteDance/Ouro-1.4B)."
        ) from None
    except (OSError, ValueError):  # LocalEntryNotFoundError is an OSError
        path = None
    if path is None:
        if not hub_reachable():
            raise UsageError(not_cached_message(spec))
        path = _download(spec)
    if problem := checkpoint_problem(path):
        raise UsageError(f"the Hub snapshot of {spec} {problem}; it is not an Ouro checkpoint this tool can load.")
    return _source(spec, path, spec)


def _download(spec: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    print(f"loopscope: downloading {spec} (safetensors, config, tokenizer) into the Hugging Face cache ...")
    try:
        return Path(snapshot_download(spec, allow_patterns=DOWNLOAD_PATTERNS, etag_timeout=10))
    except GatedRepoError:
        raise UsageError(f"{spec} is gated on the Hub; accept its terms and log in ('hf auth login').") from None
    except RepositoryNotFoundError:
        raise UsageError(f"there is no model {spec} on the Hugging Face Hub; check the id.") from None
    except (HfHubHTTPError, OSError):
        raise UsageError(not_cached_message(spec)) from None


def _source(spec: str, path: Path, hub_id: str | None) -> ModelSource:
    revision = path.name if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name) else None
    files = {f.name: file_digest(f) for pattern in IDENTITY_FILES for f in sorted(path.glob(pattern)) if f.is_file()}
    return ModelSource(spec, path, hub_id, revision, slug_of(spec, path), files)


def file_digest(path: Path) -> str:
    """sha256 of the file; for a Hub-cache large file the blob's name already is its sha256 (git LFS)."""
    target = path.resolve()
    if path.is_symlink() and HEX64.match(target.name) and target.stat().st_size > (1 << 20):
        return target.name
    h = hashlib.sha256()
    with open(target, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def model_key(source: ModelSource) -> str:
    config = json.loads((source.path / "config.json").read_text())
    blob = json.dumps({"config": config, "files": source.files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- settings and cache


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def task_settings(task: str, args, dtype: torch.dtype, device: str) -> dict:
    return {
        "task": task,
        "difficulty": P.DEFAULT_DIFFICULTY[task],
        "prompts": int(args.prompts),
        "prompt_seed": PROMPT_SEED,
        "loops": [int(n) for n in args.loops],
        "n_max": max(args.loops),
        "dtype": str(dtype).removeprefix("torch."),
        "device_type": device,
        "batch_size": BATCH_SIZE,
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
        manifest = json.loads(manifest_path.read_text())
        data = table.read_bytes()
        if sha256(data) != manifest["files"][table.name]:
            raise ValueError("checksum mismatch")
        return manifest, pd.read_parquet(io.BytesIO(data))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"loopscope: {table.name} or its manifest is damaged or incomplete ({e}); recomputing.", file=sys.stderr)
        return None


# ---------------------------------------------------------------- probing


def load_model(source: ModelSource, device: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import engine.ouro  # noqa: F401  (registers model_type "ouro" with the Auto classes)

    try:
        config = AutoConfig.from_pretrained(source.path)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"cannot read {source.path / 'config.json'} ({_first_line(e)}).") from None
    if config.model_type != "ouro":
        raise UsageError(
            f"--model {source.spec} is a {config.model_type!r} checkpoint; E1 probes Ouro checkpoints "
            "(model_type 'ouro'), such as ByteDance/Ouro-1.4B."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot load the checkpoint in {source.path} ({_first_line(e)}).") from None
    return model.to(device).eval(), tokenizer


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


@torch.inference_mode()
def n1_identity(model, tokenizer, prompts: list[P.ProbePrompt]) -> dict:
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
    identity = n1_identity(model, tokenizer, prompts)
    frames = {}
    for mode, label in MODES.items():
        with tqdm(total=len(prompts), desc=f"e1 {task} {label} n<={n_max}", unit="prompt") as bar:
            frames[label] = P.probe(model, tokenizer, prompts, n_max, mode, BATCH_SIZE, progress=bar.update)
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
    return list(dict.fromkeys(tasks))


def cmd_ouro(args) -> int:
    """`loopscope ouro`: see the module docstring. Exit 0, 1 (n = 1 identity failed) or 2 (bad input)."""
    tasks = validate(args)
    device = device_of(args)
    dtype = resolve_dtype(args.dtype, device)
    store = open_store(args)  # checks the results folder is writable; creates nothing
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
        data = parquet_bytes(table)
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(table_path, data)  # then the manifest, which holds its checksum
        manifest["files"] = {table_path.name: sha256(data)}
        atomic_write(manifest_path, json.dumps(manifest, indent=2, sort_keys=True).encode())
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
    """The summary of `training.json` (written by engine.ouro_demo) beside a checkpoint trained here, if any."""
    try:
        record = json.loads((path / "training.json").read_text())
    except (OSError, ValueError):
        return None
    keep = ("what", "parameters", "config", "train", "objective", "boundary", "seed", "threads", "wall_time_s")
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


def local_bpe_tokenizer(vocab_size: int = 600):
    """A byte-level BPE built here in the style of Ouro's (SmolLM) tokenizer: digits split, spaces as 'Ġ'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "The variable x is set to the value of y, and the answer is the number that results.",
        "What is the value? Answer 0 or 1. Is the number of ones even or odd? Bits are digits.",
    ] * 50 + [p.prompt for t in P.TASKS for p in P.make_prompts(t, 40, seed=99)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _measure_one(dtype_name: str, n_loops: int, prompts: int, batch: int, threads: int, difficulty: int) -> dict:
    """In this process: build a random Ouro-1.4B in `dtype`, time forwards; peak RSS of the whole process."""
    import resource

    from engine.ouro import OuroConfig, OuroForCausalLM

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    tokenizer = local_bpe_tokenizer()
    texts = [p.prompt for p in P.make_prompts("chain", max(prompts, batch), seed=1, difficulty=difficulty)]
    enc = [tokenizer(t, return_tensors="pt")["input_ids"] for t in texts]
    config = OuroConfig()  # the released Ouro-1.4B sizes
    t0 = time.time()
    with torch.device("meta"):
        model = OuroForCausalLM(config)
    model = model.to_empty(device="cpu").to(dtype).eval()  # allocate once, in the target dtype
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name == "model.norm.weight":
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(0.02).to(dtype))
    build_s = time.time() - t0
    n_params = sum(p.numel() for p in model.parameters())
    out = {"dtype": dtype_name, "threads": threads, "parameters": n_params, "build_s": round(build_s, 1)}

    def timed(*inputs) -> float:
        t0 = time.perf_counter()
        model.loop_forward(*inputs, n_loops=n_loops)
        return time.perf_counter() - t0

    with torch.inference_mode():
        model.loop_forward(enc[0][:, :8], n_loops=1)  # warm-up (kernel selection), not timed
        single = sorted(timed(ids) for ids in enc[:prompts])
        pad = tokenizer.eos_token_id
        T = max(e.shape[1] for e in enc[:batch])
        ids = torch.full((batch, T), pad)
        mask = torch.zeros(batch, T, dtype=torch.long)
        for i, e in enumerate(enc[:batch]):
            ids[i, T - e.shape[1] :], mask[i, T - e.shape[1] :] = e[0], 1
        batched = sorted(timed(ids, mask) / batch for _ in range(2))
    # a shared machine only slows a run down: the minimum is the best estimate, the median shows the noise
    out["batch1_s_per_prompt"] = round(single[0], 2)
    out["batch1_s_per_prompt_median"] = round(single[len(single) // 2], 2)
    out[f"batch{batch}_s_per_prompt"] = round(batched[0], 2)
    out[f"batch{batch}_s_per_prompt_max"] = round(batched[-1], 2)
    tokens = [e.shape[1] for e in enc[:prompts]]
    out["tokens_per_prompt"] = round(sum(tokens) / len(tokens), 1)
    out["n_loops"] = n_loops
    out["rss_after_import_gib"] = round(rss0, 2)
    out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    out["weights_gib"] = round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30, 2)
    # matmul FLOPs per prompt (2 per MAC over the non-embedding weights, every token and loop; head once per step)
    blocks = n_params - 2 * config.vocab_size * config.hidden_size
    flops = 2 * blocks * out["tokens_per_prompt"] * n_loops + 2 * config.vocab_size * config.hidden_size * n_loops
    out["gflop_per_prompt"] = round(flops / 1e9, 1)
    out["achieved_gflops_batch1"] = round(flops / 1e9 / out["batch1_s_per_prompt"], 1)
    return out


def measure_cpu(
    dtypes=("float32", "bfloat16"), n_loops: int = 8, prompts: int = 3, batch: int = 4, threads: int = 2, difficulty=3
) -> list[dict]:
    """Peak RSS and seconds per prompt of a random-weight Ouro-1.4B at n loops, one fresh process per dtype."""
    import subprocess

    results = []
    for name in dtypes:
        cmd = [sys.executable, "-m", "engine.e1", "--measure-one", name, "--loops", str(n_loops)]
        cmd += ["--prompts", str(prompts), "--batch", str(batch), "--threads", str(threads)]
        cmd += ["--difficulty", str(difficulty)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.e1", description="CPU cost of a random Ouro-1.4B")
    parser.add_argument("--measure", action="store_true", help="measure fp32 and bf16, one process each")
    parser.add_argument("--measure-one", choices=["float32", "bfloat16"], help=argparse.SUPPRESS)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--loops", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=3, help="prompts timed one at a time")
    parser.add_argument("--batch", type=int, default=4, help="prompts timed as one left-padded batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--difficulty", type=int, default=3, help="chain hops of the timed prompts")
    args = parser.parse_args(argv)
    if args.measure_one:
        one = _measure_one(args.measure_one, args.loops, args.prompts, args.batch, args.threads, args.difficulty)
        print(json.dumps(one))
        return 0
    if not args.measure:
        parser.print_help()
        return 2
    for r in measure_cpu(args.dtypes.split(","), args.loops, args.prompts, args.batch, args.threads, args.difficulty):
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
