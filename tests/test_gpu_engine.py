"""The GPU engine's device-independent logic, tested on the CPU (issue 29): the memory model, the presets' groups
fitting one 80 GB GPU, activation checkpointing that changes memory and not results, evaluation where the model
trained, the compile policy, and the bench's lever table."""

from dataclasses import replace

import pytest
import torch

from engine.core import memory
from engine.core.presets import PRESETS, preset, smoke, tasks_of
from engine.core.train import compile_wanted, dtype_policy, train_group
from engine.experiments import runs

GB = 1e9


def short(cfg, steps=20):
    return replace(cfg, train=replace(cfg.train, steps=steps, warmup_steps=5))


def raw(cfg, members: int) -> float:
    """The estimate without its margin and fixed costs: what torch.cuda.max_memory_allocated measures."""
    e = memory.estimate(cfg, members, "cuda")
    return (e.state_bytes + e.activation_bytes) / GB


@pytest.mark.slow
def test_the_estimate_matches_what_an_h200_measured():
    """Issue 29's H200 measurements (eager, bf16 autocast, the bench's hardest batch): 64.8 GB for the paper parity
    group of 16, 58.5 GB for 4 chain seeds (both without activation checkpointing)."""
    parity, chain = preset("paper", "parity"), preset("paper", "chain")
    chain = replace(chain, train=replace(chain.train, checkpoint=""))
    assert raw(parity, 16) == pytest.approx(64.8, rel=0.03)
    assert raw(chain, 4) == pytest.approx(58.5, rel=0.03)


def test_activations_scale_with_members_and_batch():
    cfg = preset("cpu", "parity")
    one, four = memory.estimate(cfg, 1, "cpu"), memory.estimate(cfg, 4, "cpu")
    assert four.activation_bytes == pytest.approx(4 * one.activation_bytes, rel=1e-6)
    assert four.state_bytes == 4 * one.state_bytes == 4 * 16 * cfg.model.n_params


@pytest.mark.slow
def test_every_presets_default_group_fits_one_80_gb_gpu(monkeypatch):
    monkeypatch.setenv("LOOPSCOPE_MEMORY_GB", "80")
    for name in PRESETS:
        for task in tasks_of(name):  # the GPU study's presets define parity only
            for arch in ("looped", "stacked"):
                cfg = preset(name, task, "norm", arch)
                memory.check_fits(cfg, cfg.train.group_size, "cuda")  # raises if not


def test_a_group_that_cannot_fit_is_refused_in_one_sentence_before_any_work(monkeypatch, tmp_path, capsys):
    from engine import cli

    monkeypatch.setenv("LOOPSCOPE_MEMORY_GB", "0.001")
    with pytest.raises(ValueError, match=r"needs about .* GiB on cpu and 0\.0 GiB are there; use a smaller"):
        train_group(short(smoke("parity")), [0, 1], progress=False)
    assert cli.main(["train", "--preset", "smoke", "--seeds", "2", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "GiB" in err and "Traceback" not in err and err.count("\n") == 0
    assert not (tmp_path / "r" / "runs").exists()


@pytest.mark.slow
def test_checkpointing_per_layer_changes_memory_not_results():
    base = short(smoke("parity"))
    ckpt = replace(base, train=replace(base.train, checkpoint="layer"))
    a, b = train_group(base, [0, 1], progress=False), train_group(ckpt, [0, 1], progress=False)
    assert torch.equal(a.losses, b.losses)
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())
    assert ckpt.run_key(0) != base.run_key(0) and "checkpoint" not in base.to_dict()["train"]
    big = preset("paper", "chain")
    assert (
        memory.estimate(big, 16, "cuda").activation_bytes
        < memory.estimate(replace(big, train=replace(big.train, checkpoint="")), 16, "cuda").activation_bytes / 5
    )


def test_a_group_is_evaluated_where_it_trained_and_stored_from_the_cpu(monkeypatch):
    cfg = short(smoke("parity"))
    seen = {}
    real = runs.evaluate

    def spy(model, *args, **kwargs):
        seen["device"] = next(model.parameters()).device
        seen["model"] = model
        return real(model, *args, **kwargs)

    monkeypatch.setattr(runs, "evaluate", spy)
    out = runs.train_and_evaluate(cfg, [0, 1], "train", "cpu", progress=False)
    assert seen["device"].type == "cpu"  # the device train_group trained on ("cuda" there)
    for _, manifest, state, _ in out:
        assert all(t.device.type == "cpu" for t in state.values())
        assert manifest["eval_wall_s"] >= 0 and "dtype_policy" not in manifest  # a CPU run's manifest as before


def test_compile_and_dtype_policy(monkeypatch):
    monkeypatch.delenv("LOOPSCOPE_COMPILE", raising=False)
    assert compile_wanted("cuda") and not compile_wanted("cpu")
    monkeypatch.setenv("LOOPSCOPE_COMPILE", "0")
    assert not compile_wanted("cuda")
    assert "bf16 autocast" in dtype_policy("cuda", True) and "compile" in dtype_policy("cuda", True)
    assert dtype_policy("cpu", False) == "cpu: fp32 throughout"


@pytest.mark.slow
def test_the_device_bench_measures_every_lever_at_smoke_size_on_the_cpu():
    from engine.runtime import bench

    r = bench.run_device("cpu", compile=False, steps=1, seeds=2, size="smoke")
    for task in ("parity", "chain"):
        assert set(r[task]) == {"1", "2", "eval"}
        assert set(r[task]["2"]) == {"eager_foreach", "eager_fused"} and r[task]["2"]["eager_fused"]["mfu"] > 0
        assert r[task]["eval"]["ratio"] > 0
    assert "chain, 2 seed(s), eager_fused" in bench.format_device_report(r)
