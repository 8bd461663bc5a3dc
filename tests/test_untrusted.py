"""Input the project did not make (issue 41): a results pack from another machine, a pulled dataset, a --config file,
a shared link. Each is refused in one sentence (exit 2, no traceback) with the results folder byte-identical, or
handled: `merge` is all or nothing (a full disk, a kill), reading is bounded, a URL's values are shown as text, and
the memory estimate is an upper bound of the CPU's peak RSS. The packs are a genuine gpu-smoke ladder pack and copies
of it changed as an attacker would, made here."""

import errno
import fnmatch
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest

from engine import cli
from engine.core.store import Store, parquet_bytes, sha256
from engine.runtime import gpu_pack, gpu_study

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

SMOKE = "gpu-smoke"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """The ladder piece at gpu-smoke, packed; and a results folder it was merged into."""
    root, out, merged = (tmp_path_factory.mktemp(n) for n in ("results", "out", "merged"))
    assert gpu_study.main(["run", "ladder", "--preset", SMOKE, "--results", str(root), "--device", "cpu",
                           "--out", str(out)]) == 0  # fmt: skip
    pack = out / gpu_pack.pack("ladder", SMOKE, root, out)["file"]
    assert cli.main(["merge", str(pack), "--results", str(merged)]) == 0
    return dict(pack=pack, merged=merged, made=root)


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under folder with its bytes (None: a folder)."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


def members(pack: Path) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(pack) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}


def write_pack(path: Path, items: dict[str, tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, (info, data) in items.items():
            info = tarfile.TarInfo(name) if info is None else info
            info.name = name
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def file_member(name: str, data: bytes):
    return name, (None, data)


def run_files(items, key: str) -> dict[str, str]:
    """A run's files in a pack's members: role stem (rows, manifest, ...) -> member name."""
    prefix = f"{SMOKE}/runs/{key}/"
    return {n[len(prefix) :].split("-")[0].split(".")[0]: n for n in items if n.startswith(prefix) and items[n][1]}


def set_rows(items, key: str, data: bytes, manifest_change=None) -> None:
    """Give a pack's run other rows bytes, its manifest's checksum fixed to match (and the manifest changed)."""
    names = run_files(items, key)
    items[names["rows"]] = (items[names["rows"]][0], data)
    manifest = json.loads(items[names["manifest"]][1])
    manifest["files"][Path(names["rows"]).name] = sha256(data)
    (manifest_change or (lambda m: None))(manifest)
    items[names["manifest"]] = (items[names["manifest"]][0], json.dumps(manifest).encode())


def keys_of(items) -> list[str]:
    return sorted({n.split("/")[2] for n in items if n.startswith(f"{SMOKE}/runs/") and n.count("/") == 3})


def refused(capsys, pack: Path, results: Path, words: str) -> str:
    before = snapshot(results)
    assert cli.main(["merge", str(pack), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and err.startswith("loopscope: error: "), err
    assert snapshot(results) == before  # byte-identical after a refusal
    return err


@pytest.fixture
def results(genuine, tmp_path) -> Path:
    """A results folder holding the genuine pack, merged."""
    shutil.copytree(genuine["merged"], tmp_path / "results")
    return tmp_path / "results"


# ---------------------------------------------------------------- merge: every check before anything is placed


def test_rows_that_are_not_parquet_with_their_checksum_fixed_are_refused(genuine, results, tmp_path, capsys):
    items = members(genuine["pack"])
    set_rows(items, keys_of(items)[0], b"PAR1 not a table" * 64)
    shutil.rmtree(results / SMOKE)  # into a folder without the run: it would be new
    err = refused(capsys, write_pack(tmp_path / "p.tar.gz", items), results, "rows are not a readable Parquet table")
    assert "nothing was merged" in err
    assert cli.main(["merge", str(genuine["pack"]), "--results", str(results)]) == 0  # the next merge works


def test_a_manifest_whose_config_does_not_hash_to_its_key_is_refused(genuine, tmp_path, capsys):
    items = members(genuine["pack"])
    key = keys_of(items)[0]
    name = run_files(items, key)["manifest"]
    manifest = json.loads(items[name][1])
    manifest["config"]["train"]["steps"] = 999999
    items[name] = (items[name][0], json.dumps(manifest).encode())
    refused(capsys, write_pack(tmp_path / "p.tar.gz", items), tmp_path / "empty", "do not hash to its key")


@pytest.mark.parametrize("field", ["git_commit", "host"])
def test_an_extension_that_changes_the_manifest_is_refused(genuine, results, tmp_path, capsys, field):
    store = Store(results / SMOKE)
    key = store.run_keys()[0]
    full = store.load_rows(key)
    manifest = store.manifest(key)
    files = manifest.pop("files")
    store.commit(key, manifest, {"rows.parquet": parquet_bytes(full[full["boundary"] != "norm->rescale"])},
                 {n: h for n, h in files.items() if not n.startswith("rows")})  # fmt: skip
    items = members(genuine["pack"])
    name = run_files(items, key)["manifest"]
    changed = json.loads(items[name][1]) | {field: "elsewhere"}
    items[name] = (items[name][0], json.dumps(changed).encode())
    refused(capsys, write_pack(tmp_path / "p.tar.gz", items), results, f"its manifest's {field} differs")
    assert cli.main(["merge", str(genuine["pack"]), "--results", str(results)]) == 0
    assert "1 extended" in capsys.readouterr().out  # the genuine extension still merges


def test_an_extension_whose_rows_lack_a_column_is_refused(genuine, results, tmp_path, capsys):
    store = Store(results / SMOKE)
    key = store.run_keys()[0]
    items = members(genuine["pack"])
    set_rows(items, key, parquet_bytes(store.load_rows(key).drop(columns=["split"])))
    refused(capsys, write_pack(tmp_path / "p.tar.gz", items), results, "rows have the columns")


@pytest.mark.parametrize("extra", ["evil.pkl", "run.sh"])
def test_a_file_its_manifest_does_not_name_is_refused(genuine, tmp_path, capsys, extra):
    items = members(genuine["pack"])
    items.update([file_member(f"{SMOKE}/runs/{keys_of(items)[0]}/{extra}", b"import os")])
    err = refused(capsys, write_pack(tmp_path / "p.tar.gz", items), tmp_path / "r", "which is not a file its manifest")
    assert extra in err


def test_a_chain_search_file_that_is_not_json_or_too_many_of_them_are_refused(genuine, tmp_path, capsys):
    items = members(genuine["pack"])
    items.update([file_member(f"{SMOKE}/chain-search/C1.json", b"<html>")])
    refused(capsys, write_pack(tmp_path / "p.tar.gz", items), tmp_path / "r", "chain-search/C1.json is not JSON")
    items = members(genuine["pack"])
    items.update(file_member(f"{SMOKE}/chain-search/c{i}.json", b"{}") for i in range(gpu_pack.MEMBERS + 1))
    refused(
        capsys, write_pack(tmp_path / "many.tar.gz", items), tmp_path / "r", f"at most {gpu_pack.MEMBERS:,} members"
    )


# ---------------------------------------------------------------- bounded reading


@pytest.mark.parametrize("bomb", ["member", "json", "total"])
def test_a_pack_that_unpacks_past_its_caps_is_refused(genuine, tmp_path, capsys, bomb):
    """Each cap alone, on a member nothing else reads or checks (weights, their checksum fixed; chain-search JSON that
    parses), so only the cap can refuse it."""
    items = members(genuine["pack"])
    if bomb == "member":  # one run's weights: 17 MiB of zeros that compress to a few KB
        key = next(k for k in keys_of(items) if "model" in run_files(items, k))
        name = run_files(items, key)["model"]
        zeros = bytes((gpu_pack.MEMBER_MIB + 1) * 2**20)
        items[name] = (items[name][0], zeros)
        manifest = json.loads(items[run_files(items, key)["manifest"]][1])
        manifest["files"][Path(name).name] = sha256(zeros)
        items[run_files(items, key)["manifest"]] = (None, json.dumps(manifest).encode())
        words = "is larger than a pack of the GPU study unpacks"
    elif bomb == "json":  # a study file of valid JSON, padded
        items["gpu-study.json"] = (None, b" " * (gpu_pack.MEMBER_MIB + 1) * 2**20 + items["gpu-study.json"][1])
        words = "is larger than"
    else:  # many members each under the cap, more than UNPACKED_MIB together
        per = (gpu_pack.MEMBER_MIB - 1) * 2**20
        pad = b" " * per + b"{}"
        items.update(file_member(f"{SMOKE}/chain-search/z{i}.json", pad) for i in range(5))
        words = f"{gpu_pack.UNPACKED_MIB} MiB in all"
    pack = write_pack(tmp_path / f"{bomb}.tar.gz", items)
    assert pack.stat().st_size < 2**20
    refused(capsys, pack, tmp_path / "r", words)


@pytest.mark.parametrize("size", [2**20, 8 * 2**30])
def test_a_sparse_member_is_refused(genuine, tmp_path, capsys, size):
    items = members(genuine["pack"])
    name = f"{SMOKE}/runs/{keys_of(items)[0]}/model-000000000000.safetensors"
    info = tarfile.TarInfo(name)
    info.pax_headers = {"GNU.sparse.size": str(size), "GNU.sparse.map": "0,0", "GNU.sparse.name": name}
    items[name] = (info, b"")
    pack = write_pack(tmp_path / "sparse.tar.gz", items)
    with tarfile.open(pack) as tar:
        assert tar.getmember(name).issparse()
    refused(capsys, pack, tmp_path / "r", "it holds a sparse file")


@pytest.mark.parametrize("about", [
    json.dumps({"study": "gpu-study", "preset": ["gpu-smoke"], "piece": "ladder"}).encode(),
    json.dumps({"study": "gpu-study", "preset": "gpu-smoke", "piece": {"x": 1}}).encode(),
    b"[" * 200_000 + b"]" * 200_000,
])  # fmt: skip
def test_a_study_json_of_the_wrong_type_or_nested_too_deep_is_refused(genuine, tmp_path, capsys, about):
    items = members(genuine["pack"])
    items["gpu-study.json"] = (None, about)
    refused(capsys, write_pack(tmp_path / "p.tar.gz", items), tmp_path / "r", "names no study preset")


def test_a_member_named_like_the_study_folder_is_refused(genuine, tmp_path, capsys):
    items = {n: v for n, v in members(genuine["pack"]).items() if n == "gpu-study.json"}
    items.update([file_member(SMOKE, b"x")])
    refused(capsys, write_pack(tmp_path / "p.tar.gz", items), tmp_path / "r", f"it holds {SMOKE!r}")


def test_a_manifest_nested_too_deep_is_refused(genuine, tmp_path, capsys):
    items = members(genuine["pack"])
    name = run_files(items, keys_of(items)[0])["manifest"]
    items[name] = (items[name][0], b'{"files": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    refused(capsys, write_pack(tmp_path / "deep.tar.gz", items), tmp_path / "r", "manifest.json is nested too deep")


# ---------------------------------------------------------------- placing: all or nothing


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A folder on a full disk: a 200 KiB tmpfs where this user may mount one (root), too small for the genuine pack
    merged (about 400 KB); elsewhere a disk simulated full (ENOSPC) after a few files are copied. Yields the folder
    and a function that makes room."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(disk)],
                                                   capture_output=True).returncode == 0  # fmt: skip
    if mounted:
        yield disk, lambda: subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        subprocess.run(["umount", "-l", str(disk)], check=True)
        return
    copy, calls = shutil.copy2, []

    def full(src, dst, **kw):
        calls.append(dst)
        if len(calls) > 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return copy(src, dst, **kw)

    monkeypatch.setattr(shutil, "copy2", full)
    yield disk, lambda: monkeypatch.setattr(shutil, "copy2", copy)


def fill(disk: Path) -> None:
    """The small tmpfs filled but for 16 KiB, less than the files of any run take (a pack's ladder piece holds fewer
    runs when its training budget runs out on a loaded machine, and might fit in 200 KiB); the simulated disk (not a
    tmpfs of this size) is left alone."""
    fs = os.statvfs(disk)
    if fs.f_blocks * fs.f_frsize <= 2**20:
        (disk / "filler").write_bytes(bytes(max(0, fs.f_bavail * fs.f_frsize - 16 * 2**10)))


def test_a_merge_onto_a_full_disk_leaves_the_folder_as_it_was_and_the_next_one_works(genuine, small_disk, capsys):
    disk, make_room = small_disk
    results = disk / "results"
    results.mkdir()
    (results / "notes.txt").write_text("mine")
    fill(disk)
    before = snapshot(disk)
    assert cli.main(["merge", str(genuine["pack"]), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device" in err and err.count("\n") == 1
    assert snapshot(disk) == before  # no partial merge, no .gpu-smoke.merge folder
    make_room()
    assert cli.main(["merge", str(genuine["pack"]), "--results", str(results)]) == 0
    assert snapshot(results / SMOKE) == snapshot(genuine["merged"] / SMOKE)


def test_a_merge_killed_before_its_last_step_leaves_the_folder_as_it_was(genuine, results, tmp_path):
    shutil.rmtree(results / SMOKE / "runs" / Store(results / SMOKE).run_keys()[0])  # the pack adds one run
    before = snapshot(results / SMOKE)
    env = dict(os.environ, LOOPSCOPE_FAULT=f"e5-{SMOKE}:1")  # kill -9 while the table is written
    merge = [sys.executable, "-m", "engine.cli", "merge", str(genuine["pack"]), "--results", str(results)]
    assert subprocess.run(merge, env=env, cwd=REPO, capture_output=True).returncode == -9
    assert snapshot(results / SMOKE) == before
    assert subprocess.run(merge, cwd=REPO, capture_output=True).returncode == 0  # the next merge works
    assert snapshot(results) == snapshot(genuine["merged"])  # exactly as merged: the killed one's copy is gone


# ---------------------------------------------------------------- --config and pull


@pytest.mark.parametrize("make", ["folder", "device", "deep", "fifo"])
def test_a_config_that_is_no_regular_json_file_is_refused_in_one_sentence(tmp_path, capsys, make):
    path = {"folder": tmp_path, "device": Path("/dev/zero"), "deep": tmp_path / "deep.json",
            "fifo": tmp_path / "fifo"}[make]  # fmt: skip
    if make == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    if make == "fifo":
        os.mkfifo(path)
    assert cli.main(["train", "--config", str(path), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert ("not a regular file" in err or "nested too deep" in err) and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """snapshot_download from a folder standing in for the dataset repo (no network)."""
    remote = tmp_path / "hub"
    remote.mkdir()

    def snapshot_download(*, repo_id, repo_type, local_dir, ignore_patterns=(), **kw):
        for path in remote.rglob("*"):
            rel = path.relative_to(remote).as_posix()
            if path.is_file() and not any(fnmatch.fnmatch(rel, p) for p in ignore_patterns):
                (Path(local_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, Path(local_dir) / rel)
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return remote


def test_pull_offline_into_a_folder_that_exists_fails(genuine, results, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the real client, no traffic
    before = snapshot(results)
    assert cli.main(["pull", "--repo", "someorg/somedata", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("cannot reach" in err or "nothing was downloaded" in err)
    assert snapshot(results) == before


def test_pull_of_a_repo_that_holds_nothing_fails(results, hub, capsys):
    before = snapshot(results)
    assert cli.main(["pull", "--repo", "org/data", "--results", str(results)]) == 2
    assert "nothing was downloaded from org/data" in capsys.readouterr().err
    assert snapshot(results) == before


def test_pull_says_what_came_and_refuses_what_merge_would(genuine, results, hub, capsys):
    key = Store(results / SMOKE).run_keys()[0]
    shutil.copytree(results / SMOKE / "runs" / key, hub / "runs" / key)
    (hub / "runs" / key / "evil.pkl").write_bytes(b"\x80\x04")
    before = snapshot(results)
    assert cli.main(["pull", "--repo", "org/data", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "'evil.pkl', which is not a file its manifest names" in err and err.count("\n") == 1
    assert snapshot(results) == before
    (hub / "runs" / key / "evil.pkl").unlink()
    (hub / "e5-x.parquet").write_bytes((results / SMOKE / f"e5-{SMOKE}.parquet").read_bytes())
    assert cli.main(["pull", "--repo", "org/data", "--results", str(results)]) == 0
    assert "4 files downloaded, 1 runs or refits, 1 top-level files (e5-x.parquet)" in capsys.readouterr().out
    assert Store(results).status(key) == "ok"


def weightless_run(results: Path) -> str:
    store = Store(results / SMOKE)
    return next(k for k in store.run_keys() if store.weights_state(k) != "kept")


def test_pull_refuses_a_run_stored_here_with_other_rows(results, hub, capsys):
    """A run that is here (weightless, so --checkpoints downloads it) comes with other values: a conflict, as merge
    says it, and nothing is placed, not even the pull's other, new run."""
    here, key = results / SMOKE, weightless_run(results)
    shutil.copytree(here / "runs" / key, hub / "runs" / key)
    store = Store(hub)
    rows = store.load_rows(key)
    rows.loc[rows.index[0], "value"] += 0.5
    manifest = store.manifest(key)
    files = manifest.pop("files")
    store.commit(
        key, manifest, {"rows.parquet": parquet_bytes(rows)}, {n: h for n, h in files.items() if n[:4] != "rows"}
    )
    other = next(k for k in Store(here).run_keys() if k != key)
    shutil.copytree(here / "runs" / other, hub / "runs" / other)
    shutil.rmtree(here / "runs" / other)  # new here
    before = snapshot(results)
    assert cli.main(["pull", "--repo", "org/data", "--checkpoints", "--results", str(here)]) == 2
    err = capsys.readouterr().err
    assert f"conflicts with {here}: run {key} (other rows)" in err and err.count("\n") == 1, err
    assert snapshot(results) == before


def test_pull_extends_a_run_as_merge_does_and_brings_back_weights(genuine, results, hub, capsys):
    """A weightless run here with fewer rows than the repo's: extended (as merge extends); a weightless run here whose
    weights the repo has: given them back (`pull --checkpoints`), checked against its manifest."""
    here, store = results / SMOKE, Store(results / SMOKE)
    short = weightless_run(results)
    full = store.load_rows(short)
    manifest = store.manifest(short)
    files = manifest.pop("files")
    store.commit(short, manifest, {"rows.parquet": parquet_bytes(full[full["boundary"] != "norm->rescale"])},
                 {n: h for n, h in files.items() if not n.startswith("rows")})  # fmt: skip
    shutil.copytree(genuine["merged"] / SMOKE / "runs" / short, hub / "runs" / short)
    made = Store(genuine["made"] / SMOKE)
    back = next(k for k in store.run_keys() if k != short and store.weights_state(k) != "kept")
    assert made.weights_state(back) == "kept"
    shutil.copytree(made.run_dir(back), hub / "runs" / back)
    assert cli.main(["pull", "--repo", "org/data", "--checkpoints", "--results", str(here)]) == 0
    assert "2 runs or refits" in capsys.readouterr().out
    assert len(store.load_rows(short)) == len(full) and store.status(short) == "ok"
    assert store.weights_state(back) == "kept" and store.read(back, "model.safetensors") == made.read(
        back, "model.safetensors"
    )
    assert not list(here.glob(".pull-*"))


def test_pull_onto_a_full_disk_leaves_the_folder_as_it_was(genuine, small_disk, hub, capsys):
    """The disk fills while the pulled runs are laid out beside their places (every run of the genuine piece, more
    than the disk holds): nothing of the pull is placed, and once there is room the same pull works."""
    disk, make_room = small_disk
    results = disk / "results"
    results.mkdir()
    (results / "notes.txt").write_text("mine")
    shutil.copytree(genuine["merged"] / SMOKE / "runs", hub / "runs")
    fill(disk)
    before = snapshot(disk)
    assert cli.main(["pull", "--repo", "org/data", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device" in err and err.count("\n") == 1
    assert snapshot(disk) == before  # no run placed, no staging folder left
    make_room()
    assert cli.main(["pull", "--repo", "org/data", "--results", str(results)]) == 0  # the next pull works
    assert Store(results).run_keys() == Store(genuine["merged"] / SMOKE).run_keys()


# ---------------------------------------------------------------- a URL's values, on a read-only server


def test_a_value_from_the_url_is_shown_as_text_not_markdown(monkeypatch, tmp_path):
    markdown_it = pytest.importorskip("markdown_it")
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "1")
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(tmp_path))

    def page():
        from dashboard import data, ui

        ui.select("study (preset)", ["cpu", "smoke"], "preset")
        data.compare_folder("[folder](https://evil.example)")

    at = AppTest.from_function(page)
    at.query_params["preset"] = "[click me](https://evil.example) <img src=x> ![i](https://evil.example/i.png) `x`"
    at.run()
    assert len(at.warning) == 2
    for warning in at.warning:
        html = markdown_it.MarkdownIt().render(warning.value)
        assert "<a" not in html and "<img" not in html and "<code" not in html and "evil.example" in html, html


# ---------------------------------------------------------------- the memory estimate on the CPU

PEAK = REPO / "tests" / "memory_peak.py"  # one case: prints the estimate and the peak RSS


@pytest.mark.parametrize("change, seeds", [
    (({"layers_per_block": 128}, {}, {}), 1),
    (({}, {"eval_examples": 100_000}, {}), 1),
    (({}, {}, {"batch_size": 8192}), 2),  # the smoke group of two at batch 8,192 (issue 60: 1.72-1.78 GiB elsewhere)
    (({}, {}, {}), 256),  # a group of 256 smoke members (issue 60: >= 1.20 GiB elsewhere)
])  # fmt: skip
def test_the_memory_estimate_is_at_least_the_measured_peak_on_the_cpu(change, seeds):
    """One process per case, its peak RSS (VmHWM, evaluation included) against the estimate."""
    command = [sys.executable, str(PEAK), "--change", json.dumps(change), "--seeds", str(seeds)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    estimated, measured = map(int, done.stdout.split()[-2:])
    assert estimated >= measured, f"estimate {estimated / 2**20:.0f} MiB < peak RSS {measured / 2**20:.0f} MiB"


# Every peak RSS measured so far on a CPU (tests/memory_peak.py: one process, 2 steps and the whole evaluation;
# dev/LOG.md), on whichever machine it peaked highest: preset, task, [model, task, train] changes, seeds, GiB.
MEASURED = [
    ("cpu", "parity", ({}, {}, {}), 16, 1.218),  # Intel Xeon, 2026-12-05
    ("cpu", "chain", ({}, {}, {}), 16, 1.470),  # Intel Xeon, 2026-12-06
    ("cpu-ladder", "parity", ({}, {}, {}), 1, 1.828),  # 19M, Intel Xeon, 2026-12-06
    ("smoke", "parity", ({"layers_per_block": 128}, {}, {}), 1, 0.657),  # issue 41
    ("smoke", "parity", ({}, {}, {}), 1024, 1.819),  # Intel Xeon, 2026-12-06
    ("smoke", "parity", ({}, {}, {"batch_size": 8192}), 2, 1.78),  # issue 60 (1.72-1.78; AMD EPYC: 0.98)
    ("smoke", "parity", ({}, {}, {}), 256, 1.20),  # issue 60 (>= 1.20; AMD EPYC: 0.73)
]  # fmt: skip


@pytest.mark.parametrize("preset_name, task, change, seeds, peak", MEASURED)
def test_the_memory_estimate_is_at_least_every_peak_measured(preset_name, task, change, seeds, peak):
    """The estimate against the peaks measured on other machines (without measuring again: minutes each), made as
    tests/memory_peak.py makes its case."""
    from dataclasses import replace

    from engine.core.memory import GIB, estimate
    from engine.core.presets import preset

    cfg = preset(preset_name, task, "norm")
    model, task_change, train = change
    train = dict(steps=2, warmup_steps=1, group_size=seeds, **train)
    cfg = replace(cfg, model=replace(cfg.model, **model), task=replace(cfg.task, **task_change),
                  train=replace(cfg.train, **train))  # fmt: skip
    got = estimate(cfg, seeds, "cpu").peak_bytes / GIB
    assert got >= peak, f"estimate {got:.3f} GiB < {peak} GiB measured"
    if change == ({}, {}, {}) and preset_name != "smoke":  # a study's own group: within 1.5x (issue 41)
        assert got <= 1.5 * peak, f"estimate {got:.3f} GiB, more than 1.5x the {peak} GiB measured"


# ---------------------------------------------------------------- issue 60 item 7: data, never markup or authority

SHIPPED = REPO / "cached_results"
EVIL = "evil.example"
CRAFTED = [  # what a manifest, a probe record or a URL could hold: a link, an image, HTML, a bare web or mail address
    f"[click](https://{EVIL}/x)", f"![i](https://{EVIL}/i.png)", f"<img src=https://{EVIL}/p.png>",
    f"https://{EVIL}/bare", f"www.{EVIL}", f"someone@{EVIL}", f"<https://{EVIL}>",
]  # fmt: skip


def live_links(markdown: str) -> list[str]:
    """What a Markdown body would make live in Streamlit's renderer: links and images (CommonMark, markdown-it), and
    the web and mail addresses GitHub's autolinks find in the text once the escapes are resolved (Streamlit bundles
    mdast-util-gfm-autolink-literal, whose regular expressions read the resolved text; looser here: any `http://`,
    `www.` or `x@y.z` left in the text counts)."""
    import html
    import re

    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt().render(markdown)
    found = re.findall(r"<(?:a|img)\b[^>]*>", rendered)
    text = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<code>.*?</code>", " ", rendered, flags=re.S)))
    return found + re.findall(r"(?i)https?://\S*|www\.\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+", text)


def test_streamlit_still_autolinks_the_text_after_its_escapes():
    """The reason as_text breaks addresses: the installed Streamlit's Markdown carries GitHub's autolink-literal
    transform (a regular expression over the text nodes, after backslash escapes are resolved)."""
    import streamlit

    bundles = (Path(streamlit.__file__).parent / "static").rglob("StreamlitMarkdown*.js")
    assert any(r"(https?:\/\/|www(?=\.))" in p.read_text(errors="replace") for p in bundles)


@pytest.mark.parametrize("value", CRAFTED)
def test_as_text_leaves_no_link_an_image_or_an_address_to_follow(value):
    from dashboard import results

    shown = results.as_text(value, most=200)
    assert not live_links(shown), shown
    assert shown.replace(results.JOINER, "").replace("\\", "") == value.replace("\\", "")  # the same text to read


def ladder_folder(tmp_path: Path) -> Path:
    """A results folder holding the shipped `cpu-ladder` study (its table, verdicts, probe record and runs)."""
    root = tmp_path / "results"
    shutil.copytree(SHIPPED / "cpu-ladder", root / "cpu-ladder")
    return root


def craft_ladder(root: Path) -> None:
    """The values the run key does not cover made links and images: one run's device, GPU facts, dtype policy,
    commit, creation time and rows_added; the probe record's rule and outcomes."""
    store = Store(root / "cpu-ladder")
    path = store.run_dir(store.run_keys()[0]) / "manifest.json"
    m = json.loads(path.read_text())
    m |= dict(device=CRAFTED[0], dtype_policy=CRAFTED[1], git_commit=CRAFTED[3], created=CRAFTED[4],
              gpu={"name": CRAFTED[1], "driver": CRAFTED[2], "cuda": CRAFTED[5], "capability": CRAFTED[6]},
              rows_added=[{"git_commit": CRAFTED[0], "created": CRAFTED[3]}])  # fmt: skip
    path.write_text(json.dumps(m))
    assert store.status(store.run_keys()[0]) == "ok"  # the manifest is not checksummed: still a run
    probe = json.loads((root / "cpu-ladder" / "recipe-probe.json").read_text())
    probe["rule"] = " ".join(CRAFTED)
    for c, value in zip(probe["candidates"].values(), CRAFTED, strict=False):
        c["outcome"] = value
    (root / "cpu-ladder" / "recipe-probe.json").write_text(json.dumps(probe))


def markdown_on(at) -> list[str]:
    kinds = ("markdown", "caption", "warning", "info", "error", "success", "title", "header", "subheader")
    return [el.value for kind in kinds for el in at.get(kind)]


@pytest.mark.parametrize("page", ["overview", "agreement"])
def test_manifest_and_probe_values_are_shown_as_text_on_the_pages(monkeypatch, tmp_path, page):
    from streamlit.testing.v1 import AppTest

    root = ladder_folder(tmp_path)
    craft_ladder(root)
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=300)
    at.run()
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    bodies = markdown_on(at)
    assert any(EVIL in b.replace("\\", "") for b in bodies)  # the crafted values are on the page, as text
    assert not [(b[:160], live) for b in bodies if (live := live_links(b))]


def test_the_report_shows_manifest_and_probe_values_as_text(tmp_path):
    import re

    from dashboard import report

    root = ladder_folder(tmp_path)
    craft_ladder(root)
    page = report.html(root, "cpu-ladder")
    assert EVIL in page and not re.search(r"<(?:a|img)\b", page)


def test_a_table_named_as_markup_is_no_table_and_is_not_pulled(results, hub, capsys):
    from dashboard import results as found

    name = f"e5-![i](https:{EVIL}).parquet"
    (results / name).write_bytes((results / SMOKE / f"e5-{SMOKE}.parquet").read_bytes())
    (results / f"e5-www.{EVIL}.parquet").write_bytes((results / name).read_bytes())
    assert not [p for ps in found.catalog(results).values() for p in ps if EVIL in p]
    (hub / name).write_bytes((results / name).read_bytes())
    before = snapshot(results)
    assert cli.main(["pull", "--repo", "org/data", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "which is not a file of a results folder" in err and err.count("\n") == 1
    assert snapshot(results) == before


def test_a_pulled_verdicts_json_does_not_judge_the_tables_here(tmp_path, hub, capsys, monkeypatch):
    """The user's own e2-cpu.parquet, unchanged; the repo brings a verdicts.json whose entry for it has the table's
    checksum and every outcome flipped, with links: the folder keeps its own verdicts, judged from its table."""
    import streamlit as st

    from dashboard import results as found

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    here = tmp_path / "here"
    here.mkdir()
    shutil.copy2(SHIPPED / "e2-cpu.parquet", here / "e2-cpu.parquet")
    shutil.copy2(SHIPPED / "verdicts.json", here / "verdicts.json")
    own = found.claims("e2", "cpu", here)
    entry = json.loads((here / "verdicts.json").read_text())["tables"]["e2-cpu.parquet"]
    flipped = [c | {"outcome": "does NOT hold" if c["outcome"] == "holds" else "holds",
                    "measured": f"[see](https://{EVIL})"} for c in entry["found"]["claims"]]  # fmt: skip
    code = getattr(found, "_verdict_code", lambda: None)()  # the key of the code before issue 60, where it has one
    forged = entry | {"code": code, "found": entry["found"] | {"claims": flipped}}
    (hub / "verdicts.json").write_text(json.dumps({"tables": {"e2-cpu.parquet": forged}}))
    (hub / "e2-other.parquet").write_bytes((here / "e2-cpu.parquet").read_bytes())  # something to pull
    before = (here / "verdicts.json").read_bytes()
    assert cli.main(["pull", "--repo", "org/data", "--results", str(here)]) == 0
    assert "e2-other.parquet" in capsys.readouterr().out
    assert (here / "verdicts.json").read_bytes() == before
    st.cache_data.clear()
    assert found.claims("e2", "cpu", here) == own


def test_shipped_verdicts_are_bound_to_their_tables_not_to_source_files(tmp_path, monkeypatch):
    """Every shipped table's verdicts come from its folder's verdicts.json, whatever the engine's modules look like
    (keyed on the table's SHA-256 and RULES_VERSION), and equal a fresh computation: a rule change that does not bump
    RULES_VERSION (and reship) fails here."""
    import streamlit as st

    from dashboard import results as found

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    computed = []
    compute = found._compute_claims
    monkeypatch.setattr(found, "_compute_claims", lambda *a: computed.append(a) or compute(*a))
    st.cache_data.clear()
    tables = [(e, p) for e, ps in found.catalog(SHIPPED).items() for p in ps]
    shipped = {t: found.claims(*t, SHIPPED) for t in tables}
    assert computed == [] and len(tables) >= 9  # all served from verdicts.json, none stale
    for (experiment, preset_name), got in shipped.items():
        fresh = compute(found.table_path(SHIPPED, experiment, preset_name), experiment, preset_name)
        assert got == json.loads(json.dumps(fresh, default=lambda v: v.item())), (experiment, preset_name)


# ---------------------------------------------------------------- merge: a run that is not the study's own


def test_a_run_folder_holding_another_run_s_rows_is_refused(genuine, tmp_path, capsys):
    items = members(genuine["pack"])
    first, second = keys_of(items)[:2]
    set_rows(items, first, items[run_files(items, second)["rows"]][1])
    refused(capsys, write_pack(tmp_path / "p.tar.gz", items), tmp_path / "r", "rows are another run's")


def test_a_pack_labelled_as_another_study_is_refused(genuine, tmp_path, capsys):
    """gpu-smoke's runs under a pack that says cpu-ladder (a study of its own folder the pack would merge into)."""
    items = {}
    for name, (info, data) in members(genuine["pack"]).items():
        if name.startswith(f"{SMOKE}/e"):
            continue  # the tables: merge rebuilds them
        items[name.replace(f"{SMOKE}/", "cpu-ladder/", 1).replace(SMOKE, "cpu-ladder")] = (info, data)
    about = json.loads(items["gpu-study.json"][1]) | {"preset": "cpu-ladder"}
    items["gpu-study.json"] = (None, json.dumps(about).encode())
    refused(
        capsys, write_pack(tmp_path / "p.tar.gz", items), tmp_path / "r", "is not a run the cpu-ladder study trains"
    )


def test_a_merge_killed_midway_leaves_no_scratch_folder_past_the_next(genuine, results, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    shutil.rmtree(results / SMOKE / "runs" / Store(results / SMOKE).run_keys()[0])
    env = dict(os.environ, TMPDIR=str(tmp), LOOPSCOPE_FAULT=f"e5-{SMOKE}:1")
    merge = [sys.executable, "-m", "engine.cli", "merge", str(genuine["pack"]), "--results", str(results)]
    assert subprocess.run(merge, env=env, cwd=REPO, capture_output=True).returncode == -9
    assert list(tmp.glob("gpu-study-merge-*"))  # what the kill left
    env["LOOPSCOPE_FAULT"] = ""
    assert subprocess.run(merge, env=env, cwd=REPO, capture_output=True).returncode == 0
    assert not list(tmp.glob("gpu-study-merge-*"))


# ---------------------------------------------------------------- malformed manifests, checkpoints, probe records


def one_line(err: str) -> None:
    assert err.startswith("loopscope: ") and err.count("\n") == 1 and "Traceback" not in err, err


DEEP = "[" * 200_000 + "]" * 200_000


@pytest.mark.parametrize("change", [
    {"resumed_from_step": "x"}, {"final_loss": "[x](https://evil.example)"}, {"device": {"a": 1}},
    {"config": {"task": ["parity"], "model": 3}}, {"files_not_included": ["model.safetensors"]}, {"group": "all"},
    "deep",
])  # fmt: skip
def test_a_wrong_typed_or_deep_manifest_is_listed_as_damaged_and_the_runs_page_draws(results, capsys, change,
                                                                                     monkeypatch):  # fmt: skip
    from streamlit.testing.v1 import AppTest

    store = Store(results / SMOKE)
    key = store.run_keys()[0]
    path = store.run_dir(key) / "manifest.json"
    path.write_text(DEEP if change == "deep" else json.dumps(json.loads(path.read_text()) | change))
    assert cli.main(["list", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert key in out and "Traceback" not in out
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(results))
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=300)
    at.run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, [e.value for e in at.exception]


def checkpoint(path: Path, header, tensors=None) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    import torch

    save_file(tensors or {"losses": torch.zeros(1, 1)}, str(path), metadata={"loopscope": header})
    return path


def short_cfg(steps: int = 20):
    from dataclasses import replace

    from engine.core.presets import smoke

    cfg = smoke("parity")
    return replace(cfg, train=replace(cfg.train, steps=steps, group_size=1))


@pytest.mark.parametrize("header", ["deep", "not JSON", "a list", "no config.train", "step as text", "seeds as text"])
def test_list_with_a_malformed_checkpoint_says_so_in_one_sentence(tmp_path, capsys, header):
    cfg = short_cfg().to_dict()
    untrained = {k: v for k, v in cfg.items() if k != "train"}
    text = {
        "deep": DEEP, "not JSON": "{", "a list": "[1]",
        "no config.train": json.dumps({"step": 3, "seeds": [0], "config": untrained}),
        "step as text": json.dumps({"step": "3", "seeds": [0], "config": cfg}),
        "seeds as text": json.dumps({"step": 3, "seeds": "0", "config": cfg}),
    }[header]  # fmt: skip
    checkpoint(tmp_path / "r" / "jobs" / "ckpt" / "g.safetensors", text)
    assert cli.main(["list", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    one_line(err)
    assert "g.safetensors cannot be listed" in err


def interrupted(tmp_path: Path, at: int = 10):
    """A training of 20 steps checkpointed every 10, killed after the checkpoint of step `at`."""
    from engine.core.train import train_group

    cfg, ckpt = short_cfg(), tmp_path / "ckpt.safetensors"

    def kill(done, total, loss):
        if done == at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_group(cfg, [0], progress=False, checkpoint_path=ckpt, checkpoint_every=10, on_step=kill)
    return cfg, ckpt


def rewrite_checkpoint(path: Path, change) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["loopscope"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta, tensors = change(meta, tensors)
    save_file(tensors, str(path), metadata={"loopscope": json.dumps(meta)})


@pytest.mark.parametrize("how", ["step-is-total", "groups", "scheduler", "generator"])
def test_a_crafted_checkpoint_is_not_resumed_and_the_training_starts_again(tmp_path, capsys, how):
    """A checkpoint of this very run and seeds whose header or tensors are not what the training saved at its step:
    the step set to the total (losses padded to match: "finished"), the optimizer's groups or the scheduler of the
    wrong type, a generator state cut short. Not resumed (no traceback, no weights copied): trained from step 0, to
    the weights of a training never interrupted."""
    import torch

    from engine.core.train import train_group

    cfg, ckpt = interrupted(tmp_path)

    def change(meta, tensors):
        if how == "step-is-total":
            meta["step"], meta["scheduler"]["last_epoch"] = 20, 20
            meta["scheduler"]["_step_count"] = 21
            tensors["losses"] = torch.cat([tensors["losses"], tensors["losses"]])
        elif how == "groups":
            meta["param_groups"] = [{"betas": 5}]
        elif how == "scheduler":
            meta["scheduler"] = {"optimizer": "x", "last_epoch": 10}
        else:
            tensors["generator.0"] = tensors["generator.0"][:10]
        return meta, tensors

    rewrite_checkpoint(ckpt, change)
    capsys.readouterr()
    resumed = train_group(cfg, [0], progress=False, checkpoint_path=ckpt, checkpoint_every=10)
    assert resumed.resumed_from == 0 and "starting at step 0" in capsys.readouterr().err
    straight = train_group(cfg, [0], progress=False)
    assert all(torch.equal(v, straight.model.state_dict()[k]) for k, v in resumed.model.state_dict().items())


@pytest.mark.parametrize("record", [DEEP, json.dumps([1]), json.dumps({"adopted": {"x": 1}}),
                                    json.dumps({"adopted": ["R3"], "candidates": {}})])  # fmt: skip
def test_cpu_ladder_rungs_with_a_malformed_probe_record_ends_in_one_sentence(tmp_path, record):
    folder = tmp_path / "cpu-ladder"
    folder.mkdir()
    (folder / "recipe-probe.json").write_text(record)
    done = subprocess.run([sys.executable, "-m", "engine.runtime.cpu_ladder", "rungs", "--results", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2
    one_line(done.stderr)


@pytest.mark.parametrize("record", [
    DEEP, json.dumps({"candidates": {"R1": {"scores": ["0.5"]}}}), json.dumps({"candidates": {"R1": {"scores": [0.5]}},
                                                                              "adopted": ["R1"]}),
    json.dumps({"candidates": {"R1": {"scores": [0.5], "mean_range": "wide"}}, "seeds": 4}),
])  # fmt: skip
def test_the_report_with_a_malformed_probe_record_ends_in_one_sentence(tmp_path, capfd, record):
    root = ladder_folder(tmp_path)
    (root / "cpu-ladder" / "recipe-probe.json").write_text(record)
    out = tmp_path / "out"
    assert cli.main(["report", "--out", str(out), "--preset", "cpu-ladder", "--results", str(root)]) == 2
    err = capfd.readouterr().err
    one_line(err)
    assert "recipe-probe.json" in err and not out.exists()
