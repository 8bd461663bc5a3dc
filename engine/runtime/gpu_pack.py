"""What comes back from the GPU study's pieces, and how it goes into a results folder here.

pack() writes OUT/gpu-study-PIECE.tar.gz on the GPU machine: gpu-study.json (the study, its preset, the piece, the
commit) and the study's folder (runs, refits, tables, the chain search), with the weights that stay on the GPU
machine dropped (weights_policy: the light repository's one seed per training group, and at most KEEP_MIB a run)
and the runs that still need them left out (gpu_study.unfinished). merge() (`loopscope merge PACK`) checks every
member, adds what is new, replaces a run the pack extends, refuses in one sentence a pack that is not of the study
or that differs from what is here, and rebuilds the tables from the merged store.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from pathlib import Path

from engine.core.presets import OWN_FOLDER, study_root
from engine.core.store import MODEL, Store, git_state, is_weights, stored_as, utc_now, weights_not_kept
from engine.errors import UsageError
from engine.runtime.gpu_study import STEPS, STUDY, say, unfinished, write_tables

KEEP_MIB = 8  # weights that come back: at most this much a run, and only the lowest seed of a training group
PACK_MIB = 15  # $OUT takes files of at most 16 MiB
FOLDERS = ("runs", "refits")


def weights_policy(store: Store, key: str) -> str | None:
    """None if a run's (or a refit's) weights come back, else why they stay on the GPU machine: only the lowest
    seed of each training group brings its weights back, and only weights of at most KEEP_MIB."""
    m = store.manifest(key)
    if weights_not_kept(m) is not None:
        return None  # nothing to drop: the run traveled here without them
    size = sum((store.run_dir(key) / n).stat().st_size for n in m["files"] if is_weights(n))
    if size > KEEP_MIB * 2**20:
        return (f"trained on the GPU machine; its weights ({size / 2**20:.0f} MiB) stayed there: a piece of the GPU "
                f"study brings back weights of at most {KEEP_MIB} MiB a run")  # fmt: skip
    if m["seed"] != min(m.get("group") or [m["seed"]]):
        return (f"trained on the GPU machine; one seed of each training group brings its weights back (seed "
                f"{min(m['group'])}), as the light repository keeps them")  # fmt: skip
    return None


def pack(name: str, preset_name: str, results: Path, out: Path) -> dict:
    """OUT/gpu-study-NAME.tar.gz: gpu-study.json and the study's folder (runs, refits, tables, chain search) with the
    weights that stay on the GPU machine dropped (weights_policy) and the runs that still need them left out
    (unfinished); added to the piece's summary. Over PACK_MIB, it is packed again without any weights."""
    root = study_root(results, preset_name)
    summary_path = out / f"{STUDY}-{name}.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else dict(study=STUDY, piece=name)
    made = {}
    for keep_weights in (True, False):
        made = _pack(name, preset_name, root, out, keep_weights)
        if made["bytes"] <= PACK_MIB * 2**20:
            break
    summary["pack"] = made
    out.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=1, default=str))
    say(f"packed {made['file']}: {made['bytes'] / 2**20:.1f} MiB, {len(made['runs'])} runs ({made['weightless']} "
        f"without weights), {len(made['refits'])} refits, left out {made['left_out'] or 'nothing'}")  # fmt: skip
    return made


def _pack(name: str, preset_name: str, root: Path, out: Path, keep_weights: bool) -> dict:
    made = dict(file=f"{STUDY}-{name}.tar.gz", runs=[], refits=[], weightless=0, left_out={}, tables=[])
    with tempfile.TemporaryDirectory(prefix="gpu-study-pack-") as tmp:
        stage = Path(tmp) / OWN_FOLDER[preset_name]
        for folder in FOLDERS:
            source = Store(root, folder=folder)
            for key in source.run_keys():
                status = source.status(key)
                if status != "ok":
                    made["left_out"][key] = status
                    continue
                drop = weights_policy(source, key) or (
                    None if keep_weights else "weights left out: the pack was too large"
                )
                gone = drop or weights_not_kept(source.manifest(key))
                todo = unfinished(source, key, preset_name) if folder == "runs" and gone else []
                if todo:
                    needed = ", ".join(STEPS[t] for t in todo)
                    made["left_out"][key] = f"its weights stay on the GPU machine and it still needs {needed}"
                    continue
                shutil.copytree(source.run_dir(key), stage / folder / key, ignore=shutil.ignore_patterns(".*"))
                if drop:
                    Store(stage, folder=folder).drop_weights(key, drop)
                made["weightless"] += bool(gone)
                made[folder].append(key)
        for table in sorted(root.glob(f"e*-{preset_name}.parquet")):
            shutil.copy2(table, stage / table.name)
            made["tables"].append(table.name)
        if (root / "chain-search").is_dir():
            shutil.copytree(root / "chain-search", stage / "chain-search")
        commit, dirty = git_state()
        about = dict(study=STUDY, preset=preset_name, piece=name, created=utc_now(), git_commit=commit,
                     git_dirty=dirty, runs=len(made["runs"]), refits=len(made["refits"]))  # fmt: skip
        (Path(tmp) / f"{STUDY}.json").write_text(json.dumps(about, indent=1))
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out / made["file"], "w:gz") as tar:
            tar.add(Path(tmp) / f"{STUDY}.json", arcname=f"{STUDY}.json")
            if stage.is_dir():
                tar.add(stage, arcname=stage.name)
    made["bytes"] = (out / made["file"]).stat().st_size
    return made


# ---------------------------------------------------------------- merge: a pack into a results folder here


def _refuse(pack_path: Path, why: str) -> UsageError:
    return UsageError(f"{pack_path} {why}; nothing was merged.")


def read_pack(pack_path: Path, into: Path) -> dict:
    """Unpack a pack into the folder `into`, every member checked first: gpu-study.json naming the study and a
    preset of its own folder, then only that folder's runs/ and refits/ files, its tables and chain search.
    UsageError (one sentence) for anything else. Returns gpu-study.json."""
    try:
        with tarfile.open(pack_path, "r:gz") as tar:
            members = tar.getmembers()
            names = {m.name: m for m in members}
            if f"{STUDY}.json" not in names:
                raise _refuse(pack_path, f"is not a pack of the GPU study (it has no {STUDY}.json)")
            try:
                about = (
                    json.loads(tar.extractfile(names[f"{STUDY}.json"]).read()) if names[f"{STUDY}.json"].isfile() else 0
                )
            except (json.JSONDecodeError, UnicodeDecodeError):
                about = None
            if not isinstance(about, dict) or about.get("study") != STUDY or about.get("preset") not in OWN_FOLDER:
                raise _refuse(pack_path, f"is not a pack of the GPU study ({STUDY}.json names no study preset of it)")
            folder = OWN_FOLDER[about["preset"]]
            for m in members:
                if m.name != f"{STUDY}.json" and not _allowed(m, folder, about["preset"]):
                    raise _refuse(pack_path, f"is not a pack of the GPU study (it holds {m.name[:80]!r})")
            for m in members:
                if m.isfile():
                    target = into / m.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(m).read())
    except (tarfile.TarError, EOFError, OSError) as e:
        raise _refuse(
            pack_path, f"is not a pack of the GPU study ({type(e).__name__}: not a readable .tar.gz)"
        ) from None
    return about


def _allowed(m: tarfile.TarInfo, folder: str, preset_name: str) -> bool:
    """A pack member inside the study's folder: a directory, or a regular file where the study keeps one."""
    parts = Path(m.name).parts
    if not parts or parts[0] != folder or ".." in parts or m.name.startswith("/") or not (m.isfile() or m.isdir()):
        return False
    rest = parts[1:]
    if m.isdir():
        return len(rest) <= 2 and (not rest or rest[0] in (*FOLDERS, "chain-search"))
    if len(rest) == 1:
        return rest[0].startswith("e") and rest[0].endswith(f"-{preset_name}.parquet")
    if rest[0] == "chain-search":
        return len(rest) == 2 and rest[1].endswith(".json")
    return len(rest) == 3 and rest[0] in FOLDERS and not rest[2].startswith(".")


def _weights_sha(m: dict) -> dict[str, str]:
    files = {**(m.get("files_not_included") or {}), **m["files"]}
    return {n: h for n, h in files.items() if is_weights(n)}


def compare(mine: Store, theirs: Store, key: str) -> str:
    """How a pack's run (theirs) stands to the one stored here (mine): 'new', 'same', 'extends' (the same training
    with rows added: every row here is in the pack, value for value) or 'conflict: why'."""
    if mine.status(key) == "missing":
        return "new"
    a, b = mine.manifest(key), theirs.manifest(key)
    if {**(a.get("files_not_included") or {}), **a["files"]} == {**(b.get("files_not_included") or {}), **b["files"]}:
        return "same"
    if _weights_sha(a) != _weights_sha(b):
        return "conflict: other weights"
    here, there = mine.load_rows(key), theirs.load_rows(key)
    on = [c for c in here.columns if c != "value"]
    both = here.merge(there, on=on, how="left", suffixes=("", "_pack"))
    if both["value_pack"].isna().any() or not (both["value"].to_numpy() == both["value_pack"].to_numpy()).all():
        return "conflict: other rows"
    return "extends"


def merge(pack_path: Path, results: Path) -> dict:
    """Merge a pack into the study's folder under `results` (study_root): new runs and refits are added, runs the
    pack extends are replaced (keeping weights kept here), identical ones left; then the tables are rebuilt from
    the store. A pack that is not of the GPU study, or whose run or file differs from what is here, is refused in
    one sentence (UsageError) before anything is written."""
    pack_path = Path(pack_path)
    with tempfile.TemporaryDirectory(prefix="gpu-study-merge-") as tmp:
        about = read_pack(pack_path, Path(tmp))
        p = about["preset"]
        staged, dest = Path(tmp) / OWN_FOLDER[p], study_root(results, p)
        plan, conflicts = [], []
        for folder in FOLDERS:
            theirs, mine = Store(staged, folder=folder), Store(dest, folder=folder)
            for key in theirs.run_keys():
                if theirs.status(key) != "ok":
                    raise _refuse(pack_path, f"holds a damaged {folder[:-1]} {key} ({theirs.status(key)})")
                how = compare(mine, theirs, key)
                conflicts += [f"{folder[:-1]} {key} ({how[len('conflict: ') :]})"] if how.startswith("conflict") else []
                plan += [(folder, key, how)] if how in ("new", "extends") else []
        searches = []  # the chain search's results that are new here
        for path in sorted((staged / "chain-search").glob("*.json")) if (staged / "chain-search").is_dir() else []:
            here = dest / "chain-search" / path.name
            if here.is_file() and here.read_bytes() != path.read_bytes():
                conflicts.append(f"chain-search/{path.name} (other numbers)")
            searches += [] if here.is_file() else [path]
        if conflicts:
            raise _refuse(pack_path, f"conflicts with {dest}: {conflicts[0]} is stored there with other bytes"
                          f"{f' (and {len(conflicts) - 1} more)' if len(conflicts) > 1 else ''}; merge it into an "
                          "empty folder (--results) to compare the two")  # fmt: skip
        Store(dest).check_writable()
        for folder, key, how in plan:
            _place(Store(staged, folder=folder), Store(dest, folder=folder), key, how)
        for path in searches:
            (dest / "chain-search").mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / "chain-search" / path.name)
        tables = write_tables(p, Store(dest))
    counts = {how: sum(1 for _, _, h in plan if h == how) for how in ("new", "extends")}
    return dict(preset=p, piece=about.get("piece"), into=str(dest), added=counts["new"], extended=counts["extends"],
                tables=tables, chain_search=[p.name for p in searches])  # fmt: skip


def _place(theirs: Store, mine: Store, key: str, how: str) -> None:
    """Put a pack's run folder in place in one rename (the old one, if any, renamed aside first); a run whose weights
    are kept here and not in the pack keeps them."""
    kept = {}
    if how == "extends":
        m = mine.manifest(key)
        kept = {n: (mine.run_dir(key) / n).read_bytes() for n in m["files"] if is_weights(n)}
    target = mine.run_dir(key)
    target.parent.mkdir(parents=True, exist_ok=True)
    new = target.with_name(f".{key}.merge")
    shutil.rmtree(new, ignore_errors=True)
    shutil.copytree(theirs.run_dir(key), new)
    old = target.with_name(f".{key}.old")
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    for name, data in kept.items():  # the same bytes the pack's manifest names under files_not_included
        if name in (mine.manifest(key).get("files_not_included") or {}):
            mine.restore_weights(key, MODEL if stored_as(name, MODEL) else "refit.safetensors", data)
