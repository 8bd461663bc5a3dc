"""Results to and from a Hugging Face dataset repo: `loopscope push` and `loopscope pull`.

What travels: the experiment tables and E1's manifests at the top of the results folder, and each run's
(and E3 refit's) rows.parquet, manifest.json and any measurement stored beside them (E5's rescale scalars,
scales.safetensors); with --checkpoints also their weights (WEIGHTS: a run's model, a refit's state).
Never jobs/ (this machine's job files and training checkpoints). A run pushed without its weights goes
with a manifest that says so (the weights' checksum moves from `files` to `files_not_included`), so the
pulled copy verifies and the dashboard reads it like any results folder (LOOPSCOPE_RESULTS).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from engine.core.store import MANIFEST, WEIGHTS, is_weights, sha256

RUN_FOLDERS = ("runs", "refits")


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


def _without_weights(manifest: bytes) -> bytes:
    m = json.loads(manifest)
    files = m.get("files", {})
    dropped = {name: files.pop(name) for name in list(files) if is_weights(name)}
    m["files_not_included"] = {**(m.get("files_not_included") or {}), **dropped}
    if dropped:
        m["weights_not_kept"] = "pushed without --checkpoints"
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
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def pull(root: Path, repo: str, checkpoints: bool = False) -> Path:
    """Download the dataset repo into the results folder. Runs already complete here are not downloaded
    (a run key names one config and seed); tables are replaced by the pushed ones."""
    from huggingface_hub import snapshot_download

    root = Path(root)
    have = [
        f"{p.parent.name}/{p.name}/*" for f in RUN_FOLDERS for p in (root / f).glob("*") if complete(p, checkpoints)
    ]
    ignore = [*have, "jobs/*", *([] if checkpoints else [f"*/{role.split('.')[0]}*.safetensors" for role in WEIGHTS])]
    try:
        path = snapshot_download(repo_id=repo, repo_type="dataset", local_dir=str(root), ignore_patterns=ignore)
    except Exception as e:
        raise _hub_error(e, repo) from None
    return Path(path)
