"""The results store: one folder per run, every change one atomic step, checked before every read.

    <root>/runs/<run_key>/model-<sha>.safetensors   the trained weights of one seed
    <root>/runs/<run_key>/rows-<sha>.parquet        its tidy evaluation rows (ROW_COLUMNS)
    <root>/runs/<run_key>/manifest.json             config, provenance, and which files hold the run
    <root>/<experiment>.parquet                     one table per experiment, assembled from runs
    <root>/locks/<name>.lock                        flock'ed by whoever computes or changes a run

A change to a run writes its new files under new names (each named by its checksum), then replaces
the manifest atomically, then removes what the manifest no longer names. A reader therefore sees the
old run or the new one, never a mix, whenever a process dies. Every read checks the file against the
manifest's sha256; a mismatch is reported and the run redone, a corrupt file is never loaded.

Weights not kept are a state, not damage: a run whose manifest moves its weights' checksum from `files` to
`files_not_included` (with the reason in `weights_not_kept`) is complete with its rows alone. Its status is
'ok'; reading its weights raises WeightsNotKept, a sentence that says how to get them back. Shipped results
keep the weights of one seed per training group (`Store.drop_weights`); `loopscope restore` retrains the
others and keeps them only where the retrained rows equal the stored ones bit for bit.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pandas as pd
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from engine.errors import UsageError

RESULT_COLUMNS = [
    "experiment", "run_key", "task", "arch", "boundary", "seed",
    "trained_loops", "eval_loops", "difficulty", "metric", "value",
]  # fmt: skip
ROW_KEY = [c for c in RESULT_COLUMNS if c != "value"]
ROW_COLUMNS = [*RESULT_COLUMNS, "split"]  # a run's rows: `split` says heldout, seen or beyond (core.tasks.split_of)
MODEL, ROWS, MANIFEST = "model.safetensors", "rows.parquet", "manifest.json"  # a run's files, by role
WEIGHTS = (MODEL, "refit.safetensors")  # the roles of a run's and an E3 refit's weights
NOT_KEPT_WHY = "not kept in this results folder"  # the reason when a manifest names none (older pushes)
REPO = Path(__file__).resolve().parents[2]
KEY = re.compile(r"[0-9a-f]{16}")


class CorruptRun(Exception):
    """A run folder whose files do not match its manifest."""


class WeightsNotKept(UsageError, ValueError):
    """A run stored without its weights (a state, not damage); the message says how to get them back."""


class BadKey(ValueError):
    """A string used as a run key that is not one (16 lowercase hex digits)."""


def check_key(key: str) -> str:
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise BadKey(f"{key!r} is not a run key (16 hex digits); 'loopscope list' shows the cached runs.")
    return key


def check_run_key(root: Path, key: str) -> None:
    """Raise BadKey unless key can only name a run folder inside root: keys become paths, so no '..',
    and no symbolic link that leads out of the results folder."""
    check_key(key)
    root = Path(root).resolve()
    if not (root / "runs" / key).resolve().is_relative_to(root):
        raise BadKey(f"run {key} leads outside {root} (a symbolic link); keep the runs inside the results folder.")


def stored_name(role: str, data: bytes) -> str:
    """The file name a role's bytes are stored under: `model.safetensors` -> `model-<sha12>.safetensors`."""
    stem, suffix = role.split(".", 1)
    return f"{stem}-{sha256(data)[:12]}.{suffix}"


def stored_as(name: str, role: str) -> bool:
    """Whether a file name is a role's stored name (stored_name's, or the role itself in older runs)."""
    stem, suffix = role.split(".", 1)
    return re.fullmatch(rf"{re.escape(stem)}(-[0-9a-f]{{12}})?\.{re.escape(suffix)}", name) is not None


def file_of(files: dict[str, str], role: str) -> str | None:
    """The stored name of a role in a manifest's files (`model.safetensors` itself in older runs)."""
    names = [n for n in files if stored_as(n, role)]
    return names[0] if len(names) == 1 else None


def is_weights(name: str | Path) -> bool:
    """Whether a stored file name holds weights (a run's model or a refit's state)."""
    return any(stored_as(Path(name).name, role) for role in WEIGHTS)


def weights_not_kept(manifest: dict) -> str | None:
    """None if the manifest's weights are kept, else why not (the manifest's reason)."""
    if not any(is_weights(n) for n in manifest.get("files_not_included") or {}):
        return None
    return str(manifest.get("weights_not_kept") or NOT_KEPT_WHY)


def how_to_get_weights(key: str) -> str:
    """The sentence every command and page gives for a run without its weights."""
    return (
        f"get them back with 'loopscope pull --repo REPO --checkpoints' from a dataset repo that has them, or "
        f"'loopscope restore {key}' (retrains its group; bit-identical on the machine type that made it)"
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes | Callable[[BinaryIO], None]) -> None:
    """path's new contents in one rename: `data`, or what the callable writes into the open file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data) if isinstance(data, bytes) else data(f)
            f.flush()
            os.fsync(f.fileno())
        _fault_point(path)
        os.replace(tmp, path)
    except BaseException:  # a full disk or a refused write: no half-written temporary left behind
        tmp.unlink(missing_ok=True)
        raise


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}  # fmt: skip


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """A safetensors file written atomically tensor by tensor from the tensors' own memory: safetensors.torch.save
    copies every tensor into one bytes object twice (28 bytes a parameter for a checkpoint's weights and AdamW
    moments: 0.5 GiB at 19M, the CPU's peak RSS; dev/LOG.md, 2026-12-06). Read back by safetensors' safe_open."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned

    def write(f: BinaryIO) -> None:
        f.write(len(text).to_bytes(8, "little") + text)
        for t in tensors.values():
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))

    atomic_write(path, write)


_writes: dict[str, int] = {}


def _fault_point(path: Path) -> None:
    """Fault injection for the crash tests: LOOPSCOPE_FAULT=<text>:<n> kills this process (SIGKILL, as
    `kill -9` would) at the n-th write whose file name contains <text>, after the new bytes are on disk
    and before they take their name."""
    spec = os.environ.get("LOOPSCOPE_FAULT")
    if not spec:
        return
    text, n = spec.rsplit(":", 1)
    if text in path.name:
        _writes[text] = _writes.get(text, 0) + 1
        if _writes[text] == int(n):
            os.kill(os.getpid(), signal.SIGKILL)


def parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def utc_now() -> str:
    """The time a result is stored, as manifests write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def git_state() -> tuple[str, bool]:
    """The repository's HEAD commit ("" if unknown) and whether tracked files differ from it. A copy of the tree
    without its .git (a remote GPU machine's) takes the commit from $LOOPSCOPE_COMMIT, set by whoever sent a clean
    tree of that commit (dev/studies/gpu-study/gpu-study.sh's command), and $LOOPSCOPE_DIRTY=1 if it was not clean."""
    if not (REPO / ".git").exists() and os.environ.get("LOOPSCOPE_COMMIT"):
        return os.environ["LOOPSCOPE_COMMIT"].strip(), os.environ.get("LOOPSCOPE_DIRTY", "") == "1"
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=5,
            ).stdout.strip()
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return commit, dirty


def provenance(device: str) -> dict:
    """Where and with what a result was produced."""
    commit, dirty = git_state()
    import numpy
    import safetensors

    gpu = {}
    if device.startswith("cuda") and torch.cuda.is_available():
        device_name = f"cuda ({torch.cuda.get_device_name(0)})"
        gpu = {"gpu": gpu_info()}
    else:
        device_name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {
        "git_commit": commit or "unknown",
        "git_dirty": dirty,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "pandas": pd.__version__,
            "safetensors": safetensors.__version__,
        },
        "device": device_name,
        "machine": machine(),
        **gpu,
        "host": platform.node(),
        "created": utc_now(),
    }


NUMBER, TEXT = (int, float), (str,)
# The type of each field a run's or a refit's manifest may carry; a field of another type makes the run damaged
# (Store.status says which), never a crash of a reader. A refit's (a manifest with `refit`) losses, times and curves
# are per target: dicts (PER_TARGET).
FIELD_TYPES = {
    "seed": int, "steps": int, "resumed_from_step": int, "group": list, "config": dict, "files_not_included": dict,
    "rows_added": list, "machine": dict, "versions": dict, "gpu": dict, "refit": dict, "state_scales": dict,
    "computed_targets": dict, "git_dirty": bool, "weights_not_kept": TEXT, "experiment": TEXT, "created": TEXT,
    "device": TEXT, "host": TEXT, "run_key": TEXT, "refit_key": TEXT, "task": TEXT, "dtype_policy": TEXT,
    "git_commit": (str, type(None)), "final_loss": (*NUMBER, type(None)), "wall_time_s": NUMBER,
    "eval_wall_s": NUMBER, "peak_memory_gib": NUMBER, "estimated_memory_gib": NUMBER, "loss_curve": list,
}  # fmt: skip
PER_TARGET = ("final_loss", "wall_time_s", "loss_curve")


def valid_manifest(m) -> str | None:
    """None if `m` has a run manifest's shape (its files, and each known field of its type: FIELD_TYPES), else what
    is wrong with it."""
    if not isinstance(m, dict):
        return f"is a JSON {type(m).__name__}, not an object"
    files = m.get("files")
    if not isinstance(files, dict) or not files:
        return "names no files"
    if not all(isinstance(n, str) and "/" not in n and not n.startswith(".") and isinstance(h, str)
               for n, h in files.items()):  # fmt: skip
        return "names a file outside its folder or without a checksum"
    for field, kind in FIELD_TYPES.items():
        value, kind = m.get(field), (kind, dict) if "refit" in m and field in PER_TARGET else kind
        wrong = field in m and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool)
        if wrong or field == "group" and not all(isinstance(s, int) and not isinstance(s, bool) for s in value or []):
            return f"has a {field} of the wrong type"
    if not all(isinstance(n, str) and isinstance(h, str) for n, h in (m.get("files_not_included") or {}).items()):
        return "names a file not included without a checksum"
    if not all(isinstance(a, dict) for a in m.get("rows_added") or []):
        return "has a rows_added of the wrong type"
    return None


def gpu_info() -> dict:
    """What a GPU result's rounding rests on: the GPU model, its driver, CUDA and cuDNN, and torch's build."""
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
            timeout=10,
        ).stdout.strip().splitlines()[0]  # fmt: skip
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    props = torch.cuda.get_device_properties(0)
    return {
        "name": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "driver": driver,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "torch": torch.__version__,
    }


def machine() -> dict:
    """What bit-identity rests on: the CPU model and its vector instruction sets, the kernels torch picks
    for them, the BLAS build and the thread count (dev/LOG.md: the same code on another x86-64 CPU rounds
    differently)."""
    cpu, flags = platform.processor() or platform.machine(), []
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), cpu)
        line = next((x for x in info.splitlines() if x.startswith("flags")), "flags:")
        flags = sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "sse", "fma", "amx", "f16c")))
    except OSError:  # not Linux
        pass
    config = torch.__config__.show()
    blas = next(iter(re.findall(r"BLAS_INFO=(\w+)", config)), "unknown")
    return {
        "cpu": cpu,
        "cpu_flags": flags,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": blas,
        "threads": torch.get_num_threads(),
    }


@dataclass
class Store:
    root: Path
    folder: str = "runs"  # where the run folders live under root (E3's refits: "refits")
    columns: tuple[str, ...] = tuple(ROW_COLUMNS)  # the columns a run's rows keep

    def __post_init__(self):
        self.root = Path(self.root)

    # -- layout
    def run_dir(self, key: str) -> Path:
        return self.root / self.folder / check_key(key)

    def run_keys(self) -> list[str]:
        runs = self.root / self.folder
        return sorted(p.name for p in runs.iterdir() if p.is_dir() and KEY.fullmatch(p.name)) if runs.is_dir() else []

    # -- reading, always verified
    def manifest(self, key: str) -> dict:
        path = self.run_dir(key) / MANIFEST
        try:
            m = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise CorruptRun(f"run {key}: no manifest (an interrupted write?)") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptRun(f"run {key}: manifest.json is not valid JSON") from e
        except RecursionError:
            raise CorruptRun(f"run {key}: manifest.json is nested too deep") from None
        wrong = valid_manifest(m)
        if wrong:
            raise CorruptRun(f"run {key}: manifest.json {wrong}")
        return m

    def read(self, key: str, role: str) -> bytes:
        """The verified bytes of a run's file by role (MODEL, ROWS, ...)."""
        files = self.manifest(key)["files"]
        name = file_of(files, role)
        if name is None and role in WEIGHTS:
            m = self.manifest(key)
            why = weights_not_kept(m)
            if why is not None:
                raise WeightsNotKept(f"run {key} has no weights here ({why}); {how_to_get_weights(key)}.")
        if name is None:
            raise CorruptRun(f"run {key}: the manifest lists no {role}")
        try:
            data = (self.run_dir(key) / name).read_bytes()
        except FileNotFoundError as e:
            raise CorruptRun(f"run {key}: {name} is missing") from e
        if sha256(data) != files[name]:
            raise CorruptRun(f"run {key}: {name} does not match its checksum (truncated or corrupt)")
        return data

    def status(self, key: str) -> str:
        """'ok', 'missing', or a sentence saying what is wrong."""
        if not self.run_dir(key).exists():
            return "missing"
        try:
            for name, digest in self.manifest(key)["files"].items():
                path = self.run_dir(key) / name
                if not path.is_file():
                    return f"run {key}: {name} is missing"
                if sha256(path.read_bytes()) != digest:
                    return f"run {key}: {name} does not match its checksum (truncated or corrupt)"
        except CorruptRun as e:
            return str(e)
        return "ok"

    def weights_state(self, key: str) -> str:
        """'kept', or 'not kept (why)' for a run stored without its weights."""
        why = weights_not_kept(self.manifest(key))
        return "kept" if why is None else f"not kept ({why})"

    def drop_weights(self, key: str, why: str) -> bool:
        """Store the run without its weights: the checksum moves to `files_not_included`, the reason to
        `weights_not_kept`, and the file goes (one atomic manifest change). Returns whether anything changed."""
        manifest = self.manifest(key)
        files = manifest.pop("files")
        dropped = {n: h for n, h in files.items() if is_weights(n)}
        if not dropped:
            return False
        manifest["files_not_included"] = {**(manifest.get("files_not_included") or {}), **dropped}
        manifest["weights_not_kept"] = why
        self.commit(key, manifest, {}, {n: h for n, h in files.items() if n not in dropped})
        return True

    def restore_weights(self, key: str, role: str, data: bytes) -> None:
        """Give a weightless run its weights back; they must be the bytes whose checksum the manifest kept."""
        manifest = self.manifest(key)
        missing = manifest.get("files_not_included") or {}
        name = stored_name(role, data)
        if missing.get(name) != sha256(data):
            raise CorruptRun(f"run {key}: these weights are not the ones its manifest names; nothing stored")
        files = manifest.pop("files")
        rest = {n: h for n, h in missing.items() if n != name}
        manifest = {k: v for k, v in manifest.items() if k not in ("files_not_included", "weights_not_kept")}
        if rest:
            manifest["files_not_included"] = rest
        self.commit(key, manifest, {role: data}, files)

    def load_weights(self, key: str) -> dict[str, torch.Tensor]:
        return load_safetensors(self.read(key, MODEL))

    def load_rows(self, key: str) -> pd.DataFrame:
        return pd.read_parquet(io.BytesIO(self.read(key, ROWS)))

    # -- writing: new files under new names, then the manifest in one rename, then cleaning up
    def commit(self, key: str, manifest: dict, blobs: dict[str, bytes], keep: dict[str, str] | None = None) -> None:
        """Make `manifest` (plus `files`) the run's state in one atomic step: blobs are role -> bytes;
        keep is stored name -> sha256 of files that stay. Files the new manifest does not name go."""
        json.dumps(manifest, allow_nan=False)  # strict JSON (no NaN, no Infinity): refused before any file is written
        folder = self.run_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        files = dict(keep or {})
        for role, data in blobs.items():
            name = stored_name(role, data)
            if not ((folder / name).is_file() and sha256((folder / name).read_bytes()) == sha256(data)):
                atomic_write(folder / name, data)
            files[name] = sha256(data)
        manifest = dict(manifest, files=files)
        atomic_write(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False).encode())
        for path in folder.iterdir():  # what no manifest names: replaced files, a dead writer's temporaries
            if path.name != MANIFEST and path.name not in files:
                path.unlink(missing_ok=True)

    def save_run(self, key: str, manifest: dict, state: dict[str, torch.Tensor], rows: pd.DataFrame) -> None:
        blobs = {MODEL: save_safetensors(state), ROWS: parquet_bytes(rows[list(self.columns)])}
        self.commit(key, {**manifest, "run_key": key}, blobs)

    def add_rows(self, key: str, rows: pd.DataFrame) -> pd.DataFrame:
        """Merge new rows into a run's table (a new value replaces the old one); returns the merged table. The
        manifest keeps the training's provenance and lists each addition under `rows_added`: its boundary
        labels, experiment, commit and time (folders extended before this was recorded have none)."""
        manifest = self.manifest(key)
        commit, dirty = git_state()
        manifest["rows_added"] = [*manifest.get("rows_added", []), {
            "boundaries": sorted(map(str, rows["boundary"].unique())),
            "experiment": ", ".join(sorted(map(str, rows["experiment"].unique()))) if "experiment" in rows else "",
            "git_commit": commit or "unknown", "git_dirty": dirty,
            "created": utc_now(),
        }]  # fmt: skip
        merged = pd.concat([self.load_rows(key), rows[list(self.columns)]], ignore_index=True)  # older: no split
        row_key = [c for c in self.columns if c != "value"]
        merged = merged.drop_duplicates(row_key, keep="last").reset_index(drop=True)
        files = manifest.pop("files")
        keep = {n: h for n, h in files.items() if n != file_of(files, ROWS)}
        self.commit(key, manifest, {ROWS: parquet_bytes(merged)}, keep)
        return merged

    # -- locks: one writer per run, group or refit at a time, across processes
    @contextmanager
    def lock(self, name: str, what: str) -> Iterator[None]:
        """Hold <root>/locks/<name>.lock; if another process holds it, say so and wait for it."""
        path = self.root / "locks" / f"{name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"loopscope: another process is {what}; waiting for it.", file=sys.stderr)
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def check_writable(self) -> None:
        """Create root, write and delete a probe file in it, then remove the folders this made (the writers
        make them again); PermissionError with a sentence if that fails. Either way the disk is as it was."""
        made = [p for p in (self.root, *self.root.parents) if not os.path.lexists(p)]  # deepest first
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=".loopscope-probe-", dir=self.root)
            os.close(handle)
            os.unlink(probe)
        except OSError as e:
            raise PermissionError(
                f"cannot write results under {self.root} ({e.strerror or e}); "
                "pass --results with a folder you can write."
            ) from None
        finally:
            for folder in filter(os.path.isdir, made):
                try:
                    os.rmdir(folder)
                except OSError:
                    break

    # -- probes (E1): a table at the top with a manifest beside it that holds its checksum
    def write_probe(self, name: str, table: pd.DataFrame, manifest: dict) -> tuple[Path, Path]:
        """`<name>.parquet`, then `<name>.json` naming its sha256 (a kill between the two is a mismatch,
        detected on the next read and recomputed)."""
        data = parquet_bytes(table)
        json.dumps(manifest, allow_nan=False)  # strict JSON (no NaN, no Infinity): refused before any file is written
        table_path, manifest_path = self.root / f"{name}.parquet", self.root / f"{name}.json"
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write(table_path, data)
        manifest = dict(manifest, files={table_path.name: sha256(data)})
        atomic_write(manifest_path, json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False).encode())
        return table_path, manifest_path

    def probe_manifest(self, name: str) -> dict:
        """`<name>.json`, checked against its table; CorruptRun with a sentence if they do not match."""
        table_path, manifest_path = self.root / f"{name}.parquet", self.root / f"{name}.json"
        try:
            manifest = json.loads(manifest_path.read_text())
            ok = sha256(table_path.read_bytes()) == manifest["files"][table_path.name]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptRun(f"{manifest_path.name} or its table could not be read ({type(e).__name__})") from None
        if not ok:
            raise CorruptRun(f"{table_path.name} does not match the checksum in {manifest_path.name}")
        return manifest

    def read_probe(self, name: str) -> tuple[dict, pd.DataFrame]:
        manifest = self.probe_manifest(name)
        return manifest, pd.read_parquet(self.root / f"{name}.parquet")

    def write_table(self, experiment: str, rows: pd.DataFrame) -> Path:
        path = self.root / f"{experiment}.parquet"
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write(path, parquet_bytes(rows.reset_index(drop=True)))
        return path

    def read_table(self, experiment: str) -> pd.DataFrame | None:
        path = self.root / f"{experiment}.parquet"
        return pd.read_parquet(path) if path.exists() else None
