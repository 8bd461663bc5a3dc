"""Results to and from a Hugging Face dataset repo: `loopscope push` and `loopscope pull`.

What travels: the experiment tables and E1's manifests at the top of the results folder, and each run's
(and E3 refit's) rows.parquet, manifest.json and any measurement stored beside them (E5's rescale scalars,
scales.safetensors); with --checkpoints also their weights (WEIGHTS: a run's model, a refit's state).
Never jobs/ (this machine's job files and training checkpoints). A run pushed without its weights goes
with a manifest that says so (the weights' checksum moves from `files` to `files_not_included`), so the
pulled copy verifies and the dashboard reads it like any results folder (LOOPSCOPE_RESULTS).

What comes from elsewhere is data, never authority: a pull never brings a `verdicts.json` (the dashboard judges the
tables here, dashboard.results), and a top-level file must be named as a results folder's tables and E1 manifests
are (TOP_NAME).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from engine.core.store import MANIFEST, WEIGHTS, is_weights, sha256
from engine.errors import UsageError

RUN_FOLDERS = ("runs", "refits")
PULL_MIB = 4096  # a pulled file: at most this (the paper's 19M model's weights are 76 MB)
# A top-level file a pull places: an experiment's table or E1's manifest beside it, named as
# dashboard.results.TABLE_NAME reads a table (lowercase letters, digits, '.', '_', '-', never a web address)
TOP_NAME = re.compile(r"e\d+-(?!.*www\.)[a-z0-9][a-z0-9._-]{0,63}\.(parquet|json)")
VERDICTS = "verdicts.json"  # dashboard.results.SHIPPED: the verdicts of the tables beside it, never pulled


class HubUnavailable(Exception):
    """The Hub could not be reached or refused the request; the message says what to do."""


def _hub_error(e: Exception, repo: str) -> HubUnavailable:
    names = {c.__name__ for c in type(e).__mro__}
    if names & {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "TransportError", "ConnectionError", "Timeout"}:
        return HubUnavailable(f"cannot reach the Hugging Face Hub for {repo} (offline?); connect and try again.")
    return HubUnavailable(
        f"the Hugging Face Hub refused {repo} ({type(e).__name__}: {e}); check the name and HF_TOKEN."
    )


def files_to_push(root: Path, checkpoints: bool) -> list[Path]:
    """Paths relative to root: top-level tables and manifests, and every run folder's files."""
    top = [
        p for p in root.glob("*") if p.is_file() and p.suffix in (".parquet", ".json") and not p.name.startswith(".")
    ]
    runs = [p for folder in RUN_FOLDERS for p in (root / folder).glob("*/*") if p.is_file()]
    keep = [p for p in top + runs if not p.name.startswith(".") and (checkpoints or not is_weights(p))]
    return sorted(p.relative_to(root) for p in keep)


def _without_weights(manifest: bytes, why: str = "pushed without --checkpoints") -> bytes:
    m = json.loads(manifest)
    files = m.get("files", {})
    dropped = {name: files.pop(name) for name in list(files) if is_weights(name)}
    m["files_not_included"] = {**(m.get("files_not_included") or {}), **dropped}
    if dropped:
        m["weights_not_kept"] = why
    return json.dumps(m, indent=2, sort_keys=True).encode()


def stage(root: Path, checkpoints: bool, into: Path) -> list[Path]:
    """Lay out what push uploads under `into` (hard links where possible); return the relative paths."""
    names = files_to_push(root, checkpoints)
    for rel in names:
        src, dst = root / rel, into / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel.name == MANIFEST and rel.parts[0] in RUN_FOLDERS and not checkpoints:
            dst.write_bytes(_without_weights(src.read_bytes()))
            continue
        try:
            os.link(src, dst)
        except OSError:  # another file system
            shutil.copy2(src, dst)
    return names


def push(root: Path, repo: str, checkpoints: bool = False, private: bool = False) -> int:
    """Upload the results folder to the dataset repo `repo` (created if needed); return the number of files."""
    from huggingface_hub import HfApi

    api = HfApi()
    with tempfile.TemporaryDirectory(prefix="loopscope-push-") as tmp:
        names = stage(Path(root), checkpoints, Path(tmp))
        if not names:
            raise FileNotFoundError(f"nothing to push under {root}: no results tables or runs.")
        try:
            api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
            api.upload_folder(
                folder_path=tmp, repo_id=repo, repo_type="dataset", commit_message=f"loopscope push: {len(names)} files"
            )
        except Exception as e:
            raise _hub_error(e, repo) from None
    return len(names)


def complete(folder: Path, checkpoints: bool) -> bool:
    """A run folder whose files match its manifest (and, if weights are wanted, that has them)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files_ok = all(sha256((folder / n).read_bytes()) == h for n, h in manifest["files"].items())
        return files_ok and not (checkpoints and manifest.get("files_not_included"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return False


def pull(root: Path, repo: str, checkpoints: bool = False) -> dict:
    """Download the dataset repo into a folder of its own, check it as `merge` checks a pack (check_pulled, then
    engine.runtime.gpu_pack.compare with what is stored here), then put it in the results folder (place). Runs already
    complete here are not downloaded (a run key names one config and seed); a pulled run that is stored here already
    must be the same run or extend it (rows added, as merge allows), else the pull is refused; tables are replaced by
    the pushed ones. UsageError (one sentence) when nothing came (offline included), what came is not a results
    folder's, or it conflicts with what is here; then nothing was written. Returns what came: files, runs (and
    refits) placed, tables."""
    from huggingface_hub import snapshot_download

    from engine.runtime.gpu_pack import scratch

    root = Path(root)
    have = [
        f"{p.parent.name}/{p.name}/*" for f in RUN_FOLDERS for p in (root / f).glob("*") if complete(p, checkpoints)
    ]
    ignore = [*have, "jobs/*", ".gitattributes", "*.md", VERDICTS]
    ignore += [] if checkpoints else [f"*/{role.split('.')[0]}*.safetensors" for role in WEIGHTS]
    with scratch("loopscope-pull-") as tmp:
        try:
            snapshot_download(repo_id=repo, repo_type="dataset", local_dir=tmp, ignore_patterns=ignore)
        except Exception as e:
            raise _hub_error(e, repo) from None
        came = sorted(p.relative_to(tmp) for p in Path(tmp).rglob("*") if not p.is_dir() or p.is_symlink())
        came = [rel for rel in came if rel.parts[0] != ".cache"]  # the client's own bookkeeping
        came = [rel for rel in came if rel.as_posix() != VERDICTS]  # should a client not honour `ignore`
        if not came:
            raise UsageError(f"nothing was downloaded from {repo} (offline, or the repo holds nothing this folder "
                             "lacks); check the connection and the repo's name, and pull again.")  # fmt: skip
        runs = plan_pulled(root, Path(tmp), check_pulled(Path(tmp), came, checkpoints, repo), repo)
        tables = [rel for rel in came if len(rel.parts) == 1]
        place(root, Path(tmp), runs, tables)
    return dict(files=len(came), runs=len(runs), tables=[rel.name for rel in tables])


def plan_pulled(root: Path, tmp: Path, runs: list[tuple[str, str]], repo: str) -> list[tuple[str, str, str]]:
    """The pulled runs to place, each (folder, key, how) as merge plans a pack's (engine.runtime.gpu_pack.compare:
    "new", or "extends" what is stored here, keeping weights kept here), a run stored here that is damaged counted as
    new (pull repairs it), and a run that is the same as here placed only if it brings weights this copy lacks. A run
    stored here with other contents refuses the whole pull (UsageError, one sentence) before anything is written."""
    from engine.core.store import Store
    from engine.runtime.gpu_pack import compare

    plan, conflicts = [], []
    for folder, key in runs:
        mine, theirs = Store(root, folder=folder), Store(tmp, folder=folder)
        how = compare(mine, theirs, key) if mine.status(key) == "ok" else "new"
        if how.startswith("conflict"):
            conflicts.append(f"{folder[:-1]} {key} ({how[len('conflict: ') :]})")
        elif how != "same" or set(theirs.manifest(key)["files"]) - set(mine.manifest(key)["files"]):
            plan.append((folder, key, how))
    if conflicts:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise UsageError(f"{repo} conflicts with {root}: {conflicts[0]} is stored there with other contents{more}; "
                         "nothing was pulled, and the results folder is as it was; pull into an empty folder "
                         "(--results) to compare the two.")  # fmt: skip
    return plan


def place(root: Path, tmp: Path, runs: list[tuple[str, str, str]], tables: list[Path]) -> None:
    """Put the checked pull in the results folder, all or nothing as far as a disk can: every run folder and table is
    first built beside its place (in one hidden staging folder on the same file system, by merge's own placing,
    engine.runtime.gpu_pack._place); a full disk there removes the staging folder and leaves the results folder as it
    was. Only then does each go into its place in one step (a rename, or renameat2's exchange for a folder stored
    here), which needs no space: a kill -9 among those steps leaves each run whole, old or new. The results folder is
    locked (flock, as merge locks it) meanwhile; what a killed pull left staged goes at the next."""
    import fcntl

    from engine.core.store import Store
    from engine.runtime.gpu_pack import _place, swap_into

    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for stale in root.glob(".pull-*"):  # a killed pull's staging folder: nothing in it was placed
            shutil.rmtree(stale, ignore_errors=True)
        staging = root / f".pull-{os.getpid()}"
        try:
            staging.mkdir()
            for folder, key, how in runs:
                _place(Store(tmp, folder=folder), Store(root, folder=folder), Store(staging, folder=folder), key, how)
            for rel in tables:
                shutil.copy2(tmp / rel, staging / rel)
            for folder, key, _ in runs:
                swap_into(staging / folder / key, root / folder / key)  # an old folder goes with the staging
            for rel in tables:
                os.replace(staging / rel, root / rel)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        os.close(fd)


def check_pulled(tmp: Path, came: list[Path], checkpoints: bool, repo: str) -> list[tuple[str, str]]:
    """What a pull brought (`came`, relative to tmp), checked before anything is placed: only a results folder's
    files (top-level tables and JSON, run and refit folders), regular files within PULL_MIB (JSON within
    engine.inputs.JSON_MIB, tables readable as Parquet), and every run folder whole and its own
    (engine.inputs.check_run_folder). A run pulled without its weights says so in its manifest, as push writes it.
    Returns the run folders (folder, key); UsageError with one sentence otherwise."""
    import pyarrow.parquet as pq

    from engine.core.store import KEY, Store
    from engine.inputs import check_run_folder, read_json

    def refuse(why: str) -> UsageError:
        return UsageError(f"{repo} {why}; nothing was pulled, and the results folder is as it was.")

    runs = set()
    for rel in came:
        path = tmp / rel
        top = len(rel.parts) == 1 and TOP_NAME.fullmatch(rel.name)
        run = len(rel.parts) == 3 and rel.parts[0] in RUN_FOLDERS and KEY.fullmatch(rel.parts[1])
        if not (top or run) or path.is_symlink() or not path.is_file():
            raise refuse(f"holds {rel.as_posix()[:80]!r}, which is not a file of a results folder")
        if path.stat().st_size > PULL_MIB * 2**20:
            raise refuse(f"holds {rel.as_posix()[:80]!r}, larger than {PULL_MIB} MiB, the most loopscope reads")
        try:
            if top and rel.suffix == ".json":
                read_json(path, rel.name)
            elif top:
                pq.ParquetFile(path).close()
        except UsageError as e:
            raise refuse(f"holds {str(e).split(';')[0]}") from None
        except Exception as e:  # pyarrow's errors for a file that is not Parquet are of many kinds
            raise refuse(f"holds {rel.name}, which is not a readable Parquet table ({type(e).__name__})") from None
        if run:
            runs.add(rel.parts[:2])
    for folder, key in sorted(runs):
        manifest = tmp / folder / key / MANIFEST
        if not checkpoints and manifest.is_file():  # pushed with --checkpoints, pulled without: say so, as push does
            try:
                m = read_json(manifest, f"{folder[:-1]} {key}'s manifest.json")
            except UsageError:
                m = None  # check_run_folder says what is wrong with it
            if isinstance(m, dict) and isinstance(m.get("files"), dict):
                if any(is_weights(n) and not (manifest.parent / n).exists() for n in m["files"]):
                    manifest.write_bytes(_without_weights(manifest.read_bytes(), "pulled without --checkpoints"))
        wrong = check_run_folder(Store(tmp, folder=folder), key)
        if wrong:
            raise refuse(f"holds a {folder[:-1]} that cannot be used: {wrong}")
    return sorted(runs)
