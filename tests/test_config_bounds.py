"""Run configs (issue 33, item 1): every field has a type and a range (engine.core.limits.RANGES, in the README),
NaN and Infinity are refused, a group that cannot fit in memory is refused before anything is allocated, a
training whose loss turns non-finite stops and stores nothing, and manifests are strict JSON. Every refusal is
one sentence and exit 2, with nothing written."""

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from engine.cli import main
from engine.core import limits
from engine.core.presets import RunConfig, TrainConfig, smoke
from engine.core.store import Store
from engine.core.tasks import VOCAB_SIZE
from engine.runtime import jobs

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "cached_results"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, argv, res: Path, *phrases):
    """Exit 2, one line on stderr that holds every phrase, no traceback, no results folder."""
    code, _, err = run(capsys, *argv, "--results", str(res))
    assert code == 2, err
    assert err.startswith("loopscope: error:") and len(err.strip().splitlines()) == 1, err
    assert all(p in err for p in phrases), err
    assert not res.exists()  # nothing written
    return err


def config_file(tmp_path, change, name="config.json") -> Path:
    """The smoke parity config as JSON (as `loopscope list --json` gives it), changed by `change(dict)`; written
    with Python's json, which writes NaN and Infinity as the bare literals the issue found accepted."""
    d = json.loads(json.dumps(smoke("parity").to_dict()))
    change(d)
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


def setter(section, field, value):
    def change(d):
        (d if section is None else d[section])[field] = value

    return change


# ---------------------------------------------------------------- absurd values, wrong types, non-finite numbers


@pytest.mark.parametrize(
    "section, field, value, phrase",
    [
        ("train", "batch_size", 10**9, "train.batch_size must be an even integer from 2 to 65,536, got 1000000000."),
        ("model", "d_model", 65536, "model.d_model must be an integer from 2 to 8,192, got 65536."),
        ("model", "layers_per_block", 1000, "model.layers_per_block must be a positive integer at most 128"),
        ("train", "group_size", 10**6, "train.group_size must be a positive integer at most 1,024, got 1000000."),
        ("task", "eval_examples", 10**9, "task.eval_examples must be an even integer from 2 to 1,000,000"),
        ("task", "train_difficulties", [10**7], "task.train_difficulties must each be at least 1 and at most 1024"),
        ("task", "eval_difficulties", [1, 10**7], "(bits of parity), got 1..10000000."),
        (None, "max_eval_loops", 10**7, "max_eval_loops must be a positive integer at most 1,000, got 10000000."),
        ("train", "steps", 10**9, "train.steps must be a positive integer at most 1,000,000"),
        ("train", "loops", "uniform:1-100000", "loop counts at most 1000"),
        ("task", "variables", 10**6, "task.variables must be an integer from 2 to 32"),
    ],
)
def test_absurd_values_are_refused_with_their_range(tmp_path, capsys, section, field, value, phrase):
    path = config_file(tmp_path, setter(section, field, value))
    refused(capsys, ["train", "--config", str(path)], tmp_path / "res", phrase)


@pytest.mark.parametrize(
    "section, field, value",
    [
        ("train", "lr", math.inf),
        ("train", "lr", math.nan),
        ("train", "grad_clip", math.nan),
        ("model", "rope_theta", math.nan),
        ("train", "weight_decay", math.nan),
        ("train", "min_lr_ratio", -math.inf),
        ("task", "holdout", math.nan),
        ("model", "norm_eps", math.inf),
    ],
)
def test_nan_and_infinity_are_refused(tmp_path, capsys, section, field, value):
    path = config_file(tmp_path, setter(section, field, value))
    assert ("NaN" in path.read_text()) or ("Infinity" in path.read_text())  # the bare literals, as the issue sent
    refused(capsys, ["train", "--config", str(path)], tmp_path / "res", f"{section}.{field} must be a finite number")


@pytest.mark.parametrize(
    "section, field, value, phrase",
    [
        ("model", "d_model", 32.0, "model.d_model must be an integer from 2 to 8,192, got 32.0."),
        ("train", "steps", 300.0, "train.steps must be a positive integer at most 1,000,000, got 300.0."),
        ("train", "steps", 300.5, "got 300.5."),
        ("model", "n_heads", True, "model.n_heads must be a positive integer at most 128, got True."),
        ("train", "lr", "0.003", "train.lr must be a finite number in (0, 10], got '0.003'."),
        ("model", "tied", 1, "model.tied must be true or false, got 1."),
        ("task", "train_difficulties", [1.0, 2.0], "task.train_difficulties must be a list of integers"),
    ],
)
def test_wrong_types_are_refused_not_tracebacks(tmp_path, capsys, section, field, value, phrase):
    path = config_file(tmp_path, setter(section, field, value))
    refused(capsys, ["train", "--config", str(path)], tmp_path / "res", phrase)


def test_the_vocabulary_must_be_the_tasks(tmp_path, capsys):
    def chain_with_five_tokens(d):
        d.update(json.loads(json.dumps(smoke("chain").to_dict())))
        d["model"]["vocab_size"] = 5

    path = config_file(tmp_path, chain_with_five_tokens)
    refused(capsys, ["train", "--config", str(path)], tmp_path / "res", f"model.vocab_size must be {VOCAB_SIZE}")


@pytest.mark.parametrize(
    "change, phrase",
    [
        (setter(None, "train", {}), "train lacks steps, batch_size, lr, min_lr_ratio, warmup_steps"),
        (lambda d: d.pop("task"), "the config lacks task;"),
        (lambda d: d["model"].pop("d_model"), "model lacks d_model;"),
        (setter("train", "learning_rate", 0.1), "train has unknown learning_rate;"),
        (setter(None, "seed", 3), "the config has unknown seed;"),
        (setter(None, "train", [1, 2]), "train must be a JSON object"),
    ],
)
def test_missing_and_unknown_fields_are_named(tmp_path, capsys, change, phrase):
    path = config_file(tmp_path, change)
    refused(capsys, ["train", "--config", str(path)], tmp_path / "res", phrase)


def test_a_config_that_is_not_json_says_so(tmp_path, capsys):
    path = tmp_path / "broken.json"
    path.write_text('{"model": ')
    refused(capsys, ["train", "--config", str(path)], tmp_path / "res", "is not JSON")


def test_group_size_flag_is_bounded_too(tmp_path, capsys):
    refused(capsys, ["train", "--preset", "smoke", "--group-size", "1000000"], tmp_path / "res",
            "--group-size: train.group_size must be a positive integer at most 1,024")  # fmt: skip


def test_ints_for_numbers_are_the_same_config_and_key():
    cfg = smoke("parity")
    d = json.loads(json.dumps(cfg.to_dict()))
    d["model"]["rope_theta"], d["train"]["grad_clip"] = 10000, 1
    same = RunConfig.from_dict(d)
    assert same == cfg and same.run_key(0) == cfg.run_key(0) and isinstance(same.model.rope_theta, float)


def test_every_table_entry_is_a_field_and_the_readme_shows_the_table():
    from dataclasses import fields

    from engine.core.model import ModelConfig
    from engine.core.tasks import TaskConfig

    for section, cls in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig), ("run", RunConfig)):
        names = {f.name for f in fields(cls)} - {"model", "task", "train"}
        assert set(limits.RANGES[section]) == names, section
    assert limits.table_markdown() in (REPO / "docs" / "commands.md").read_text()
    assert f"exactly {VOCAB_SIZE}" in limits.RANGES["model"]["vocab_size"].note


def test_presets_and_shipped_configs_pass_and_keep_their_keys():
    from engine.core.presets import PRESETS, preset, tasks_of

    for name in PRESETS:
        for task in tasks_of(name):  # the GPU study's presets define parity only
            for boundary in ("norm", "none"):
                for arch in ("looped", "stacked"):
                    preset(name, task, boundary, arch)
    checked = 0
    for path in sorted(SHIPPED.glob("runs/*/manifest.json")):
        m = json.loads(path.read_text())
        cfg = RunConfig.from_dict(m["config"])
        assert cfg.run_key(m["seed"]) == m["run_key"] == path.parent.name
        checked += 1
    assert checked > 0 or not SHIPPED.exists()


# ---------------------------------------------------------------- memory: refused before anything is allocated


def test_a_group_that_does_not_fit_is_refused_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOOPSCOPE_MEMORY_GB", "0.001")
    res = tmp_path / "res"
    code, _, err = run(capsys, "train", "--preset", "smoke", "--seeds", "2", "--device", "cpu", "--results", str(res))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "parity looped norm: a group of 2 seed(s) needs about" in err and "0.0 GiB are there" in err
    assert not (res / "runs").exists() and not (res / "jobs").exists()
    code, _, err = run(capsys, "run", "e2", "--preset", "smoke", "--seeds", "2", "--tasks", "parity", "--device",
                       "cpu", "--results", str(res))  # fmt: skip
    assert code == 2 and "a group of 2 seed(s) needs about" in err and not (res / "runs").exists()


def test_an_absurd_model_inside_the_bounds_is_refused_without_building_it(tmp_path, capsys):
    def huge(d):
        d["model"].update(d_model=8192, n_heads=64, d_ff=32768, layers_per_block=128)

    path = config_file(tmp_path, huge)
    refused(capsys, ["train", "--config", str(path), "--device", "cpu"], tmp_path / "res", "needs more than",
            "GiB are there; use a smaller train.group_size")  # fmt: skip


def test_cached_runs_are_not_refused_for_memory(tmp_path, capsys, monkeypatch):
    res = tmp_path / "res"
    cfg = replace(smoke("parity"), train=replace(smoke("parity").train, steps=20))
    path = tmp_path / "short.json"
    path.write_text(json.dumps(cfg.to_dict()))
    code, _, err = run(capsys, "train", "--config", str(path), "--seeds", "2", "--device", "cpu", "--results", str(res))
    assert code == 0, err
    monkeypatch.setenv("LOOPSCOPE_MEMORY_GB", "0.001")  # nothing left to train: nothing to refuse
    code, _, err = run(capsys, "train", "--config", str(path), "--seeds", "2", "--device", "cpu", "--results", str(res))
    assert code == 0, err


def test_verify_and_restore_refuse_before_retraining(tmp_path, capsys, monkeypatch):
    manifests = sorted(SHIPPED.glob("runs/*/manifest.json"))
    weightless = [p for p in manifests if not list(p.parent.glob("model-*.safetensors"))]
    if not weightless:
        pytest.skip("no shipped run without its weights")
    source = weightless[0].parent
    res = tmp_path / "res"
    shutil.copytree(source, res / "runs" / source.name)
    before = sorted(p.name for p in (res / "runs").rglob("*"))
    monkeypatch.setenv("LOOPSCOPE_MEMORY_GB", "0.001")
    code, _, err = run(capsys, "restore", source.name, "--device", "cpu", "--results", str(res))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "seed(s) needs more than" in err, err
    assert sorted(p.name for p in (res / "runs").rglob("*")) == before
    code, _, err = run(capsys, "verify", "e2", "--preset", "cpu", "--seeds", "1", "--task", "parity", "--boundary",
                       "norm", "--arch", "looped", "--device", "cpu", "--results", str(SHIPPED))  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "a group of 16 seed(s) needs more than" in err, err
    assert "MiB on cpu and 1.0 MiB are there" in err


def test_workers_that_do_not_fit_together_are_refused_before_training(tmp_path, capsys, monkeypatch):
    """--workers N trains N groups at once: their estimates must fit together, not one at a time."""
    from engine.core.memory import estimate
    from engine.errors import UsageError
    from engine.inputs import check_memory

    one = estimate(smoke("parity"), 2, "cpu").peak_bytes
    monkeypatch.setenv("LOOPSCOPE_MEMORY_GB", str(1.5 * one / 1e9))  # one group fits, two do not
    err = refused(capsys, ["run", "e2", "--preset", "smoke", "--seeds", "4", "--tasks", "parity", "--workers", "2",
                           "--device", "cpu"], tmp_path / "res", "--workers 2 trains 2 groups at once",
                  "use --workers 1 or fewer")  # fmt: skip
    assert "together on cpu" in err
    check_memory([(smoke("parity"), range(4))], "cpu", workers=1)  # one at a time: fits
    check_memory([(smoke("parity"), range(2))], "cpu", workers=2)  # a single group to train: fits
    store = Store(tmp_path / "cached")
    with pytest.raises(UsageError, match="2 groups at once"):
        check_memory([(smoke("parity"), range(4)), (smoke("parity"), range(4))], "cpu", store, workers=4)


def test_a_ray_cluster_without_a_node_large_enough_is_refused_before_dispatch(tmp_path):
    """Ray places each CPU task by its group's estimated peak (its `memory` resource); a group no live node can
    hold is refused at once instead of waiting for ever."""
    from engine.core.memory import estimate
    from engine.errors import UsageError
    from engine.runtime.fanout import node_memory_needs

    cfg, store = smoke("parity"), Store(tmp_path / "res")
    need = estimate(cfg, 2, "cpu").peak_bytes
    units = [(cfg, [0, 1], "e2")]
    node = lambda memory, alive=True: {"Alive": alive, "Resources": {"memory": memory}}  # noqa: E731
    assert node_memory_needs(units, store, "cpu", [node(need // 2), node(need * 4)]) == {cfg: need}
    assert node_memory_needs(units, store, "cuda", [node(0)]) == {}  # a GPU's memory is the task's own check
    for nodes in ([node(need // 2)], [node(need * 4, alive=False)], []):
        with pytest.raises(UsageError, match="the largest node of the Ray cluster offers"):
            node_memory_needs(units, store, "cpu", nodes)


def test_a_background_job_that_does_not_fit_is_refused_before_it_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPSCOPE_MEMORY_GB", "0.001")
    with pytest.raises(ValueError, match=r"a group of 2 seed\(s\) needs about"):
        jobs.submit(jobs.TrainSpec(smoke("parity"), (0, 1), "cpu"), tmp_path)
    with pytest.raises(ValueError, match="GiB are there"):
        jobs.submit(jobs.ExperimentSpec("e2", "smoke", (0,), ("parity",), "cpu"), tmp_path)
    assert not jobs.jobs_dir(tmp_path).exists()


# ---------------------------------------------------------------- a loss that turns non-finite


def diverging(steps: int = 60) -> RunConfig:
    """Smoke parity with lr 10 and weight decay 1 (inside the bounds): AdamW multiplies every matrix by
    1 - lr x weight_decay = -9 each step, and the loss is NaN at step 20 (the end of the warm-up)."""
    cfg = smoke("parity")
    return replace(cfg, train=replace(cfg.train, steps=steps, lr=10.0, weight_decay=1.0))


def test_a_diverging_training_stops_says_the_step_and_stores_nothing(tmp_path, capsys):
    path = tmp_path / "diverging.json"
    path.write_text(json.dumps(diverging().to_dict()))
    res = tmp_path / "res"
    code, _, err = run(capsys, "train", "--config", str(path), "--seeds", "2", "--device", "cpu", "--results", str(res))
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err, err
    assert last.startswith("loopscope: error: training diverged: the loss of seed 0 became nan at step 20 of 60")
    assert "nothing of its group (seeds 0-1) was stored" in last
    store = Store(res)
    assert [k for k in store.run_keys() if store.status(k) == "ok"] == []
    assert not (res / "runs").exists() or not list((res / "runs").iterdir())
    code, _, err = run(capsys, "train", "--config", str(path), "--seeds", "2", "--device", "cpu", "--results", str(res))
    assert code == 2 and "at step 20" in err  # not cached as "ok": asked again, it diverges again


@pytest.mark.slow
def test_a_diverging_background_job_ends_failed_with_the_step(tmp_path):
    jid = jobs.submit(jobs.TrainSpec(diverging(), (0, 1), "cpu"), tmp_path)
    job = jobs.wait(jid, tmp_path, timeout_s=240)
    assert job.state == "failed" and "training diverged" in job.message and "at step 20 of 60" in job.message
    store = Store(tmp_path)
    assert [k for k in store.run_keys() if store.status(k) == "ok"] == []


# ---------------------------------------------------------------- manifests are strict JSON


def strict(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_manifests_are_strict_json(tmp_path):
    store = Store(tmp_path)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="not JSON compliant"):
            store.commit("0123456789abcdef", {"final_loss": bad, "loss_curve": [0.5, bad]}, {})
        with pytest.raises(ValueError, match="not JSON compliant"):
            store.write_probe("e1-probe", pd.DataFrame({"a": [1]}), {"x": bad})
    assert not list(tmp_path.rglob("*"))  # refused before any file was written
    store.commit("0123456789abcdef", {"final_loss": 0.5}, {})
    strict((tmp_path / "runs" / "0123456789abcdef" / "manifest.json").read_text())


def test_a_trained_run_s_manifest_is_strict_json_and_every_shipped_one_is(tmp_path, capsys):
    res = tmp_path / "res"
    cfg = replace(smoke("parity"), train=replace(smoke("parity").train, steps=5, group_size=1))
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg.to_dict()))
    code, _, err = run(capsys, "train", "--config", str(path), "--device", "cpu", "--results", str(res))
    assert code == 0, err
    (manifest,) = (res / "runs").glob("*/manifest.json")
    assert all(math.isfinite(v) for v in strict(manifest.read_text())["loss_curve"])
    for path in SHIPPED.rglob("*.json"):
        strict(path.read_text())
