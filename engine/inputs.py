"""What a user typed, checked: numbers, ranges, run keys and repo ids. Each failure is a UsageError whose
message says what is wrong and what to do (the CLI turns it into one line and exit code 2)."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from engine.core.limits import MAX_LOOPS  # loop counts per forward; a shared dashboard caps lower (jobs.CAPS)
from engine.core.presets import RunConfig
from engine.errors import UsageError

MAX_SEEDS, MAX_SEED = 1024, 2**31 - 1  # seeds per command, and the largest seed (every RNG here takes it)
MAX_WORKERS = 4 * (os.cpu_count() or 1)  # local processes: more than this only thrashes
JSON_MIB = 4  # a JSON file read from outside (--config, a manifest, gpu-study.json, a pulled one): at most this
INTEGER_COLUMNS = ("seed", "trained_loops", "eval_loops", "difficulty", "refit_steps")  # a run's rows: the rest is
# text but `value` (a float)


def number(digits: str, most: int) -> int | None:
    """int(digits) if it is at most `most`, else None (the length first: int() refuses 4300+ digits)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= len(str(most)) and int(digits) <= most else None


def parse_ints(text: str, what: str, most: int, count: int, unit: str) -> list[int]:
    """'3-7', '1,2,5' or a mix like '1-4,8', in ASCII digits, sorted and without repeats. Numbers above
    `most`, or more than `count` of them, are refused before the list is built."""
    found: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if re.fullmatch(r"-[0-9]+", part):
            raise UsageError(f"{what} must not be negative (got {text!r}).")
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part)  # [0-9], not \d: \d takes any script's digits
        if not match:
            raise UsageError(f"cannot read {what} {text!r}; write a number, a range like 1-24, or a list like 1,2,8.")
        lo, hi = number(match[1], most), number(match[2] or match[1], most)
        if lo is None or hi is None:
            raise UsageError(f"{what} {text!r} goes past {most}, the largest {unit} loopscope takes; use smaller ones.")
        if lo > hi:
            raise UsageError(f"{what} range {part!r} runs backwards; write it low-high, e.g. 1-24.")
        if hi - lo >= count or len(found.union(range(lo, hi + 1))) > count:
            raise UsageError(
                f"{what} {text!r} names more than {count} {unit}s, the most one command takes; pass fewer."
            )
        found.update(range(lo, hi + 1))
    return sorted(found)


def parse_seeds(text: str) -> list[int]:
    text = text.strip()
    if re.fullmatch(r"-?[0-9]+", text):  # a count
        count = number(text.lstrip("-"), MAX_SEEDS)
        if text.startswith("-") or count == 0:
            raise UsageError(f"--seeds {text}: give a positive number of seeds, or a list like 0-15.")
        if count is None:
            raise UsageError(f"--seeds {text} is more than {MAX_SEEDS} seeds, the most one command takes; pass fewer.")
        return list(range(count))
    return parse_ints(text, "--seeds", MAX_SEED, MAX_SEEDS, "seed")


def parse_loops(text: str) -> list[int]:
    loops = parse_ints(text, "--loops", MAX_LOOPS, MAX_LOOPS, "loop count")
    if not loops or loops[0] < 1:
        raise UsageError(f"--loops {text}: loop counts start at 1, e.g. --loops 1-24.")
    return loops


def check_runs(root: Path, keys: list[str]) -> RunConfig:
    """Every key names a verified run inside root (keys become paths), and the runs share one config:
    they load as one ensemble. Returns that config."""
    from engine.core.store import Store, check_run_key, weights_not_kept

    store, configs = Store(root), {}
    for key in keys:
        try:
            check_run_key(root, key)
        except ValueError as e:
            raise UsageError(str(e)) from None
        status = store.status(key)
        if status == "missing":
            raise UsageError(f"no run {key!r} under {store.root}; 'loopscope list' shows the cached runs.")
        if status != "ok":
            raise UsageError(f"{status}; retrain it with 'loopscope train' (same config and seed).")
        if weights_not_kept(store.manifest(key)) is not None:
            store.load_weights(key)  # raises WeightsNotKept (a UsageError): the sentence says how to get them back
        try:
            configs[key] = RunConfig.from_dict(store.manifest(key)["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(
                f"run {key} holds no readable config ({e!r}); retrain it with 'loopscope train'."
            ) from None
    first = keys[0]
    for key in keys[1:]:
        if configs[key] != configs[first]:
            raise UsageError(
                f"runs {first} and {key} have different configs, so they cannot be evaluated together; "
                "evaluate them in separate 'loopscope eval' calls."
            )
    return configs[first]


def check_repo(repo: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", repo) or ".." in repo:
        raise UsageError(f"--repo {repo!r} is not a Hugging Face repo id; write it ORG/NAME.")


def check_memory(units: Iterable[tuple[RunConfig, Iterable[int]]], device: str, store=None, workers: int = 1) -> None:
    """Refuse, before anything is allocated, a training whose group does not fit `device` (engine.core.memory:
    the estimated peak against a GPU's memory or the machine's RAM, $LOOPSCOPE_MEMORY_GB overriding both). Units
    are (config, seeds); with `store`, only configs with a seed not cached there train, so only they are checked.
    A lower bound (weights, AdamW state and the input every layer keeps at every loop step, checkpointed or not)
    refuses the absurd at once, without the estimate's own forward. With `workers` > 1 (the local backend) that
    many groups train at once: the largest `workers` estimates of the groups to train must fit together. UsageError
    with one sentence."""
    from engine.core import presets
    from engine.core.memory import GIB, available, check_fits, longest_sequence

    try:
        have = available(device)
    except ValueError:
        raise UsageError(
            f"LOOPSCOPE_MEMORY_GB={os.environ.get('LOOPSCOPE_MEMORY_GB')!r:.40} is not a number of gigabytes; "
            "set it like 16, or unset it to use this machine's memory."
        ) from None
    size = lambda n: f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"  # noqa: E731
    units = [(cfg, list(seeds)) for cfg, seeds in units]

    def untrained(cfg: RunConfig, seeds: list[int]) -> bool:  # without a store: all of it
        return store is None or any(store.status(cfg.run_key(s)) != "ok" for s in seeds)

    todo = [cfg for cfg, seeds in units if untrained(cfg, seeds)]
    peaks = {}
    for cfg in dict.fromkeys(todo):  # each config once
        members, m = cfg.train.group_size, cfg.model
        loops = max(presets.parse_loops(cfg.train.loops)[1]) if cfg.train.loops else m.trained_loops
        items = members * cfg.train.batch_size
        least = 16 * m.n_params * members + 2 * items * loops * m.layers_per_block * m.d_model * longest_sequence(cfg)
        try:
            if least > have:
                raise ValueError(
                    f"a group of {members} seed(s) needs more than {size(least)} on {device} and {size(have)} are "
                    "there; use a smaller train.group_size, train.batch_size or model."
                )
            peaks[cfg] = check_fits(cfg, members, device).peak_bytes
        except ValueError as e:
            raise UsageError(f"{cfg.task.name} {cfg.model.arch} {cfg.model.boundary}: {e}") from None
    if workers > 1:  # the groups still to train, each at its config's peak; `workers` of them run at once
        pending = {(cfg, tuple(g)) for cfg, seeds in units if cfg in peaks for g in cfg.groups(seeds)
                   if untrained(cfg, [s for s in g if s in seeds])}  # fmt: skip
        groups = sorted((peaks[cfg] for cfg, _ in pending), reverse=True)
        together = sum(groups[:workers])
        if len(groups) > 1 and together > have:
            fit = next(k for k in range(len(groups), 0, -1) if sum(groups[:k]) <= have)
            raise UsageError(
                f"--workers {workers} trains {min(workers, len(groups))} groups at once, which need about "
                f"{size(together)} together on {device}, and {size(have)} are there; use --workers {fit} or fewer."
            )


def parse_json(data: bytes, what: str):
    """The JSON value in `data`; UsageError naming `what` if it is not UTF-8 JSON or is nested too deep to read."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = "nested too deep" if isinstance(e, RecursionError) else f"not JSON ({str(e)[:80]})"
        raise UsageError(f"{what} is {why}; give a JSON file as loopscope writes it.") from None


def read_json(path: Path, what: str, most: int = JSON_MIB * 2**20):
    """The JSON in `path`, a regular file of at most `most` bytes (not a folder, a device or a FIFO: it is opened
    without waiting and checked before a byte is read), parsed without recursion errors. UsageError with one
    sentence naming `what` (the file, as the reader knows it) otherwise; the caller checks the value's type."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UsageError(f"{what} does not exist; check the path.") from None
    except OSError as e:
        raise UsageError(f"{what} cannot be read ({e.strerror}); check the path.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{what} is not a regular file; give a JSON file.")
    with os.fdopen(fd, "rb") as f:
        data = f.read(most + 1)
    if len(data) > most:
        raise UsageError(f"{what} is larger than {most / 2**20:g} MiB, the most loopscope reads; give a smaller one.")
    return parse_json(data, what)


def check_run_folder(store, key: str) -> str | None:
    """None if the folder of run (or refit) `key` in `store` is whole and is the run its key names, else what is
    wrong, for a run that came from elsewhere (a pack, a pull): its manifest is a bounded JSON object of a manifest's
    shape naming every file the folder holds (only regular files), each matching its checksum; its config (a refit:
    its run key and refit) hashes to the key; its rows load and have the columns and types of the schema."""
    import hashlib

    import pandas as pd

    from engine.core.store import MANIFEST, ROW_COLUMNS, valid_manifest

    what = f"{store.folder[:-1]} {key}"
    folder = store.run_dir(key)
    try:
        m = read_json(folder / MANIFEST, f"{what}'s manifest.json")
    except UsageError as e:
        return str(e).split(";")[0]
    wrong = valid_manifest(m)
    if wrong:
        return f"{what}'s manifest {wrong}"
    extra = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST and p.name not in m["files"])
    odd = [n for n in m["files"] if (folder / n).is_symlink() or not (folder / n).is_file()]
    if extra or odd:
        return f"{what} holds {(extra or odd)[0][:60]!r}, which is not a file its manifest names"
    status = store.status(key)
    if status != "ok":
        return status
    try:
        if store.folder == "runs":
            made = RunConfig.from_dict(m.get("config")).run_key(m.get("seed"))
        else:  # engine.experiments.e3.refit_key: the run's key and the refit's config
            blob = json.dumps({"run_key": m.get("run_key"), "refit": m.get("refit")}, sort_keys=True)
            made = hashlib.sha256(blob.encode()).hexdigest()[:16]
    except (ValueError, TypeError) as e:
        return f"{what}'s config cannot be read ({str(e)[:80]})"
    if made != key:
        return f"{what}'s config and seed do not hash to its key (the manifest was changed)"
    try:
        rows = store.load_rows(key)
    except Exception as e:  # pyarrow's errors for a file that is not Parquet are of many kinds
        return f"{what}'s rows are not a readable Parquet table ({type(e).__name__})"
    if store.folder == "runs":
        columns = ROW_COLUMNS
    else:
        from engine.experiments.e3 import COLUMNS as columns
    if list(rows.columns) != list(columns):
        return f"{what}'s rows have the columns {', '.join(map(str, rows.columns))[:120]}, not {', '.join(columns)}"
    for name in columns:
        kind = "integer" if name in INTEGER_COLUMNS else "number" if name == "value" else "text"
        fits = {"integer": pd.api.types.is_integer_dtype, "number": pd.api.types.is_float_dtype,
                "text": pd.api.types.is_string_dtype}[kind](rows[name])  # fmt: skip
        if not fits:
            return f"{what}'s rows hold {rows[name].dtype} in `{name}`, where the schema has {kind}s"
    return None
