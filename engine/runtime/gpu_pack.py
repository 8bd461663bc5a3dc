"""What comes back from the GPU study's pieces, and how it goes into a results folder here.

pack() writes OUT/gpu-study-PIECE.tar.gz on the GPU machine: gpu-study.json (the study, its preset, the piece, the
commit) and the study's folder (runs, refits, tables, the chain search), with the weights that stay on the GPU
machine dropped (weights_policy: the light repository's one seed per training group, and at most KEEP_MIB a
run); a run that still needs them (gpu_study.unfinished) comes back with its rows, named in `still_needs`.
merge() (`loopscope merge PACK`) checks every member, adds what is new, replaces a run the pack extends, refuses in
one sentence a pack that is not of the study (a run whose rows are another run's, or that its study does not train,
included) or that differs from what is here, and rebuilds the tables from the merged store. The pack is unpacked in
a scratch folder of the temporary folder (scratch), which a merge killed midway leaves behind and the next one
removes.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from engine.core.presets import GPU_RECIPES, OWN_FOLDER, RunConfig, cpu_ladder, study_root, tasks_of
from engine.core.store import MODEL, Store, git_state, is_weights, stored_as, utc_now, weights_not_kept
from engine.errors import NO_SPACE, UsageError
from engine.inputs import check_run_folder, parse_json
from engine.runtime.gpu_study import PIECES, STEPS, STUDY, say, unfinished, write_tables

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
    weights that stay on the GPU machine dropped (weights_policy), the runs that still need them named (`still_needs`)
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
        f"without weights), {len(made['refits'])} refits, left out {made['left_out'] or 'nothing'}; still needing "
        f"their weights {len(made.get('still_needs', {}))}")  # fmt: skip
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
                if todo:  # its rows come back all the same; the piece that needs its weights retrains its group first
                    needed = ", ".join(STEPS[t] for t in todo)
                    made.setdefault("still_needs", {})[key] = (
                        f"its weights stay on the GPU machine and it still needs {needed}: the next piece that needs "
                        "them retrains its group (kept only if every retrained row equals these bit for bit)"
                    )
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

MEMBERS, MEMBER_MIB, UNPACKED_MIB = 5_000, 16, 64  # a pack's caps: members, each member's size, all of them unpacked
_EXCHANGE = 2  # renameat2's RENAME_EXCHANGE (Linux): two paths swapped in one step


def _refuse(pack_path: Path, why: str) -> UsageError:
    return UsageError(f"{pack_path} {why}; nothing was merged.")


def read_pack(pack_path: Path, into: Path) -> dict:
    """Unpack a pack into the folder `into`, every member checked first: gpu-study.json naming the study and a
    preset of its own folder, then only that folder's runs/ and refits/ files, its tables and chain search; a pack
    of at most PACK_MIB whose members are at most MEMBERS, each unpacked at most MEMBER_MIB and all together at most
    UNPACKED_MIB (from the headers, and again while reading), none sparse. UsageError (one sentence) for anything
    else. Returns gpu-study.json."""
    if not pack_path.is_file() or pack_path.stat().st_size > PACK_MIB * 2**20:
        raise _refuse(pack_path, f"is not a pack of the GPU study (not a file of at most {PACK_MIB} MiB)")
    try:
        with tarfile.open(pack_path, "r:gz") as tar:
            members, total = [], 0
            for m in tar:
                if m.issparse():
                    raise _refuse(pack_path, f"is not a pack of the GPU study (it holds a sparse file {m.name[:80]!r})")
                members.append(m)
                total += m.size
                if len(members) > MEMBERS or m.size > MEMBER_MIB * 2**20 or total > UNPACKED_MIB * 2**20:
                    raise _refuse(pack_path, f"is larger than a pack of the GPU study unpacks (at most {MEMBERS:,} "
                                  f"members of at most {MEMBER_MIB} MiB, {UNPACKED_MIB} MiB in all)")  # fmt: skip
            names = {m.name: m for m in members}
            if f"{STUDY}.json" not in names or not names[f"{STUDY}.json"].isfile():
                raise _refuse(pack_path, f"is not a pack of the GPU study (it has no {STUDY}.json)")
            try:
                about = parse_json(_read(tar, names[f"{STUDY}.json"], pack_path), f"{STUDY}.json")
            except UsageError:
                about = None
            ok = isinstance(about, dict) and about.get("study") == STUDY and isinstance(about.get("piece", ""), str)
            if not ok or not isinstance(about.get("preset"), str) or about["preset"] not in OWN_FOLDER:
                raise _refuse(pack_path, f"is not a pack of the GPU study ({STUDY}.json names no study preset of it)")
            folder = OWN_FOLDER[about["preset"]]
            for m in members:
                if m.name != f"{STUDY}.json" and not _allowed(m, folder, about["preset"]):
                    raise _refuse(pack_path, f"is not a pack of the GPU study (it holds {m.name[:80]!r})")
            for m in members:
                if m.isfile() and m.name != f"{STUDY}.json":
                    target = into / m.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(_read(tar, m, pack_path))
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise _refuse(
            pack_path, f"is not a pack of the GPU study ({type(e).__name__}: not a readable .tar.gz)"
        ) from None
    return about


def _read(tar: tarfile.TarFile, m: tarfile.TarInfo, pack_path: Path) -> bytes:
    """A member's bytes, read in pieces and never more than its header says nor than MEMBER_MIB."""
    f, data = tar.extractfile(m), bytearray()
    while chunk := f.read(2**20):
        data += chunk
        if len(data) > min(m.size, MEMBER_MIB * 2**20):
            raise _refuse(pack_path, f"is not a pack of the GPU study ({m.name[:80]!r} is longer than its header says)")
    return bytes(data)


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
    if len(rest) == 2:
        return rest[0] == "chain-search" and rest[1].endswith(".json") and not rest[1].startswith(".")
    return len(rest) == 3 and rest[0] in FOLDERS and not rest[2].startswith(".")


def _weights_sha(m: dict) -> dict[str, str]:
    files = {**(m.get("files_not_included") or {}), **m["files"]}
    return {n: h for n, h in files.items() if is_weights(n)}


FILE_FIELDS = ("files", "files_not_included", "weights_not_kept", "rows_added")  # what an extension may change


def compare(mine: Store, theirs: Store, key: str) -> str:
    """How a pack's run (theirs) stands to the one stored here (mine): 'new', 'same', 'extends' (the same training
    with rows added: every row here is in the pack, value for value; every field of the manifest here is in the
    pack's with the same value, but the files, and rows_added, which the pack's continues) or 'conflict: why'."""
    if mine.status(key) == "missing":
        return "new"
    a, b = mine.manifest(key), theirs.manifest(key)
    if {**(a.get("files_not_included") or {}), **a["files"]} == {**(b.get("files_not_included") or {}), **b["files"]}:
        return "same"
    if _weights_sha(a) != _weights_sha(b):
        return "conflict: other weights"
    changed = [k for k in a if k not in FILE_FIELDS and (k not in b or b[k] != a[k])]
    if changed or b.get("rows_added", [])[: len(a.get("rows_added", []))] != a.get("rows_added", []):
        return f"conflict: its manifest's {(changed or ['rows_added'])[0]} differs"
    here, there = mine.load_rows(key), theirs.load_rows(key)
    if list(here.columns) != list(there.columns):
        return "conflict: other columns"
    on = [c for c in here.columns if c != "value"]
    both = here.merge(there, on=on, how="left", suffixes=("", "_pack"))
    if both["value_pack"].isna().any() or not (both["value"].to_numpy() == both["value_pack"].to_numpy()).all():
        return "conflict: other rows"
    return "extends"


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A folder of the temporary folder named `prefix` + this process's id, removed on the way out; what a process
    killed inside one left (a folder of this prefix whose process is gone) goes first."""
    base = Path(tempfile.gettempdir())
    for stale in base.glob(f"{prefix}*"):
        pid = stale.name[len(prefix) :].split("-")[0]
        try:
            mine = stale.is_dir() and not stale.is_symlink() and stale.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


class Study:
    """What a study's folder may hold, to tell a pack's run that is the study's own from one that is not: the configs
    its experiments train (E2's, E3's and E5's trainings at the preset; the `cpu-ladder` probe's candidates), compared
    without train.precision (a study's runs share one, which the tables' writers check), and the runs of the pack and
    of the folder here (a refit's run is one of them)."""

    def __init__(self, preset_name: str, runs: set[str]):
        from engine.experiments import e2, e3, e5

        tasks = tasks_of(preset_name)
        configs = [cfg for module in (e2, e3, e5) for cfg, _ in module.trainings(preset_name, tasks)]
        configs += [cpu_ladder(recipe=name) for name in GPU_RECIPES] if preset_name == "cpu-ladder" else []
        self.preset, self.runs = preset_name, runs
        self.configs = {self._loose(cfg) for cfg in configs}

    @staticmethod
    def _loose(cfg: RunConfig) -> str:
        return json.dumps(replace(cfg, train=replace(cfg.train, precision="fp32")).to_dict(), sort_keys=True)

    def foreign(self, store: Store, key: str) -> str | None:
        """None if run (or refit) `key` of `store` (checked by check_run_folder) is the study's own, else why not: its
        rows are its own (every row's run key and seed are its manifest's), and a run's config is one the study
        trains, a refit's run one of the pack's or of the folder here."""
        what, m = f"{store.folder[:-1]} {key}", store.manifest(key)
        rows = store.load_rows(key)
        owner = key if store.folder == "runs" else m.get("run_key")
        if set(rows["run_key"]) != {owner} or set(rows["seed"]) != {m.get("seed")}:
            return f"{what}'s rows are another run's (their run key or seed is not its manifest's)"
        if store.folder == "runs" and self._loose(RunConfig.from_dict(m["config"])) not in self.configs:
            return f"{what} is not a run the {self.preset} study trains (its config is none of the study's)"
        if store.folder != "runs" and owner not in self.runs:
            return f"{what} refits a run that is neither in the pack nor in the {self.preset} study's folder here"
        return None


def merge(pack_path: Path, results: Path) -> dict:
    """Merge a pack into the study's folder under `results` (study_root), all or nothing: every run and refit of the
    pack is checked (engine.inputs.check_run_folder: its files, its key, its rows' schema) and compared with what is
    here (compare), its chain search must be JSON; a pack that is not of the GPU study, or whose run or file differs
    from what is here, is refused in one sentence (UsageError) before anything is written. Then a copy of the study's
    folder (hard links) takes the new runs and refits, the runs the pack extends (keeping weights kept here) and the
    chain search, and its tables are rebuilt from that store; it replaces the folder in one step (_swap_in). A kill
    or a full disk before that step leaves the folder as it was, after it as merged."""
    pack_path = Path(pack_path)
    with scratch("gpu-study-merge-") as tmp:
        about = read_pack(pack_path, Path(tmp))
        p = about["preset"]
        staged, dest = Path(tmp) / OWN_FOLDER[p], study_root(results, p)
        plan, conflicts = [], []
        ours = Study(p, {*Store(staged).run_keys(), *Store(dest).run_keys()})
        for folder in FOLDERS:
            theirs, mine = Store(staged, folder=folder), Store(dest, folder=folder)
            for key in theirs.run_keys():
                wrong = check_run_folder(theirs, key) or ours.foreign(theirs, key)
                if wrong:
                    raise _refuse(pack_path, f"holds a {folder[:-1]} that cannot be merged: {wrong}")
                how = compare(mine, theirs, key)
                conflicts += [f"{folder[:-1]} {key} ({how[len('conflict: ') :]})"] if how.startswith("conflict") else []
                plan += [(folder, key, how)] if how in ("new", "extends") else []
        searches = []  # the chain search's results that are new here
        for path in sorted((staged / "chain-search").glob("*.json")) if (staged / "chain-search").is_dir() else []:
            try:
                parse_json(path.read_bytes(), f"chain-search/{path.name}")
            except UsageError as e:
                why = str(e).split(";")[0]
                raise _refuse(pack_path, f"holds a chain-search file that cannot be merged: {why}") from None
            here = dest / "chain-search" / path.name
            if here.is_file() and here.read_bytes() != path.read_bytes():
                conflicts.append(f"chain-search/{path.name} (other numbers)")
            searches += [] if here.is_file() else [path]
        if conflicts:
            raise _refuse(pack_path, f"conflicts with {dest}: {conflicts[0]} is stored there with other bytes"
                          f"{f' (and {len(conflicts) - 1} more)' if len(conflicts) > 1 else ''}; merge it into an "
                          "empty folder (--results) to compare the two")  # fmt: skip

        def build(new: Path) -> dict:
            for folder, key, how in plan:
                _place(Store(staged, folder=folder), Store(dest, folder=folder), Store(new, folder=folder), key, how)
            for path in searches:
                (new / "chain-search").mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, new / "chain-search" / path.name)
            return write_tables(p, Store(new))

        Store(dest).check_writable()
        tables = _swap_in(dest, build)
    counts = {how: sum(1 for _, _, h in plan if h == how) for how in ("new", "extends")}
    return dict(preset=p, piece=about.get("piece"), into=str(dest), added=counts["new"], extended=counts["extends"],
                tables=tables, chain_search=[p.name for p in searches])  # fmt: skip


def _swap_in(dest: Path, build):
    """Run build(new) on `new`, a copy of `dest` beside it (hard links where the file system has them: every writer
    here replaces files, none writes into one), then put `new` in dest's place in one step (renameat2's exchange; a
    rename where dest is new). With the results folder locked (flock): what a killed merge left beside it goes first
    (its old folder put back, should it have died inside exchange's fallback). Returns what build returns; on any
    error the copy goes and dest is as it was."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for stale in sorted(dest.parent.glob(f".{dest.name}.merge-*")):  # what a killed merge left
            if stale.name.endswith(".old") and not dest.exists():
                stale.rename(dest)  # killed between exchange's two renames: the folder as it was
            else:
                shutil.rmtree(stale, ignore_errors=True)
        new = dest.with_name(f".{dest.name}.merge-{os.getpid()}")
        try:
            if dest.is_dir():
                copy_tree(dest, new)
            new.mkdir(exist_ok=True)
            done = build(new)
            swap_into(new, dest)
        finally:
            shutil.rmtree(new, ignore_errors=True)  # the old folder after the exchange, else the unfinished copy
        return done
    finally:
        os.close(fd)  # and the lock with it


def copy_tree(src: Path, dst: Path) -> None:
    """dst as a copy of src: folders made, files hard-linked (copied where links cannot be made); an OSError (a
    full disk) as it is, not gathered into shutil.Error."""
    for folder, _, files in os.walk(src):
        here = dst / Path(folder).relative_to(src)
        here.mkdir(exist_ok=True)
        for name in files:
            try:
                os.link(Path(folder) / name, here / name, follow_symlinks=False)
            except OSError as e:
                if e.errno in NO_SPACE:
                    raise
                shutil.copy2(Path(folder) / name, here / name, follow_symlinks=False)


def swap_into(new: Path, target: Path) -> None:
    """Put folder `new` at `target` in one step: exchanged with what is there (which is then left at `new`, for the
    caller to remove), or renamed where nothing is."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        exchange(new, target)
    else:
        new.rename(target)


def exchange(a: Path, b: Path) -> None:
    """Swap two paths in one step (Linux's renameat2 with RENAME_EXCHANGE); where the C library or the file system
    has no such call, b aside (as a's name + .old), a in its place, and the old b where a was (a kill between two
    renames leaves b absent and the old b beside it, which the next merge puts back: _swap_in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    done = hasattr(libc, "renameat2") and libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _EXCHANGE) == 0
    err = ctypes.get_errno() if hasattr(libc, "renameat2") and not done else errno.ENOSYS
    if done:
        return
    if err not in (errno.ENOSYS, errno.EINVAL):  # -100 above: AT_FDCWD
        raise OSError(err, os.strerror(err), str(b))
    aside = a.with_name(a.name + ".old")
    b.rename(aside)
    a.rename(b)
    aside.rename(a)


def _place(theirs: Store, mine: Store, new: Store, key: str, how: str) -> None:
    """Put a pack's run folder in the copy `new` of the study's folder; a run whose weights are kept here (mine) and
    not in the pack keeps them."""
    kept = {}
    if how == "extends":
        m = mine.manifest(key)
        kept = {n: (mine.run_dir(key) / n).read_bytes() for n in m["files"] if is_weights(n)}
    target = new.run_dir(key)
    shutil.rmtree(target, ignore_errors=True)  # its links to the old files: the files themselves stay in `mine`
    target.mkdir(parents=True)
    for path in theirs.run_dir(key).iterdir():
        shutil.copy2(path, target / path.name)
    for name, data in kept.items():  # the same bytes the pack's manifest names under files_not_included
        if name in (new.manifest(key).get("files_not_included") or {}):
            new.restore_weights(key, MODEL if stored_as(name, MODEL) else "refit.safetensors", data)


# ---------------------------------------------------------------- the command line (dev/studies/gpu-study/gpu-study.sh)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.runtime.gpu_pack", description=__doc__.splitlines()[0])
    ap.add_argument("piece", choices=PIECES)
    ap.add_argument("--preset", default="gpu", choices=list(OWN_FOLDER))
    ap.add_argument("--results", default="cached_results", help="the results folder (the study stores in its gpu/)")
    ap.add_argument("--out", required=True, help="the folder that comes back ($OUT)")
    args = ap.parse_args(argv)
    pack(args.piece, args.preset, Path(args.results), Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
