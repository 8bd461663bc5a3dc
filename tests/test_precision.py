"""train.precision (issue 44): fp32 keys, manifests and results unchanged; bf16 in the key and the manifest; auto's
decision; `loopscope bench --only precision` at a tiny size."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine import cli
from engine.core import train as tr
from engine.core.presets import RunConfig, TrainConfig, cpu, paper, precision_override, preset, smoke
from engine.runtime import bench

REPO = Path(__file__).resolve().parents[1]


def tiny(precision: str = "fp32", steps: int = 4) -> RunConfig:
    cfg = smoke("parity")
    return replace(cfg, train=replace(cfg.train, steps=steps, precision=precision),
                   task=replace(cfg.task, eval_examples=16))  # fmt: skip


def test_fp32_keys_and_configs_unchanged():
    cfg = cpu("parity")
    assert cfg.run_key(0) == "54cb465fa855929b"  # the shipped key of the `cpu` preset's parity seed 0
    assert "precision" not in cfg.to_dict()["train"]
    spelled = replace(cfg, train=replace(cfg.train, precision="fp32"))
    assert spelled == cfg and spelled.run_key(0) == cfg.run_key(0)
    for manifest in sorted((REPO / "cached_results" / "runs").glob("*/manifest.json"))[:40]:
        m = json.loads(manifest.read_text())
        assert RunConfig.from_dict(m["config"]).run_key(m["seed"]) == manifest.parent.name
        assert "precision" not in m["config"]["train"] and "dtype_policy" not in m


def test_bf16_is_in_the_key_and_round_trips():
    cfg, bf = tiny(), tiny("bf16")
    assert bf.to_dict()["train"]["precision"] == "bf16" and bf.run_key(0) != cfg.run_key(0)
    back = RunConfig.from_dict(json.loads(json.dumps(bf.to_dict())))
    assert back == bf and back.run_key(0) == bf.run_key(0)
    with pytest.raises(ValueError, match="train.precision must be fp32 or bf16"):
        TrainConfig(precision="fp16")


@pytest.mark.slow
def test_bf16_trains_with_fp32_master_weights_and_is_in_the_manifest():
    from engine.experiments.runs import train_and_evaluate

    cfg = tiny("bf16")
    result = tr.train_group(cfg, cfg.group(0), progress=False)
    assert torch.isfinite(result.losses).all() and "bf16 autocast" in result.policy
    assert all(p.dtype == torch.float32 for p in result.model.parameters())
    (_, manifest, weights, rows), _ = train_and_evaluate(cfg, cfg.group(0), "train", progress=False)
    assert "bf16 autocast" in manifest["dtype_policy"] and manifest["config"]["train"]["precision"] == "bf16"
    assert all(v.dtype == torch.float32 for v in weights.values()) and len(rows)
    (_, fp32_manifest, _, _), _ = train_and_evaluate(tiny(), [0, 1], "train", progress=False)
    assert "dtype_policy" not in fp32_manifest  # a CPU fp32 manifest is as it always was


def test_fp32_training_does_not_autocast(monkeypatch):
    seen = []
    real = torch.autocast

    def spy(device_type, *a, **kw):
        seen.append((device_type, kw.get("enabled")))
        return real(device_type, *a, **kw)

    monkeypatch.setattr(tr.torch, "autocast", spy)
    cfg = tiny(steps=1)
    tr.train_group(cfg, cfg.group(0), progress=False)
    assert ("cpu", False) in seen and all(enabled is False for _, enabled in seen)


def test_auto_decides_by_the_cpu_and_the_model(monkeypatch):
    big, small = paper("parity"), cpu("parity")
    monkeypatch.setattr(tr, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})  # an older CPU: no native bf16
    precision, why = tr.resolve_precision("auto", big)
    assert precision == "fp32" and "no native bf16" in why
    monkeypatch.setattr(tr, "cpu_flags", lambda: {"avx512f", "amx_bf16", "avx512_bf16"})
    assert tr.resolve_precision("auto", big)[0] == "bf16"
    precision, why = tr.resolve_precision("auto", small)
    assert precision == "fp32" and f"{tr.AUTO_BF16_MIN_PARAMS:,}" in why
    assert tr.resolve_precision("auto", big, "cuda")[0] == "fp32"  # a GPU is bf16 whatever the key says
    assert tr.resolve_precision("bf16", small) == ("bf16", "bf16 as asked")
    with pytest.raises(ValueError, match="fp32, bf16 or auto"):
        tr.resolve_precision("fp16", small)


def test_cli_precision_option(monkeypatch, capsys):
    args = cli.build_parser().parse_args(["train", "--preset", "smoke", "--precision", "auto", "--device", "cpu"])
    monkeypatch.setattr(tr, "cpu_flags", lambda: set())
    assert cli.precision_of(args, smoke("parity")) == "fp32" and "no native bf16" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["run", "e2", "--precision", "bf16"]).precision == "bf16"
    assert cli.build_parser().parse_args(["run", "e2"]).precision is None
    with pytest.raises(cli.UsageError):
        cli.build_parser().parse_args(["train", "--precision", "fp16"])
    with precision_override("bf16"):  # what `run --precision bf16` does: every preset config of the study
        assert {preset("cpu", t, b).train.precision for t in ("parity", "chain") for b in ("norm", "none")} == {"bf16"}
    assert preset("cpu").run_key(0) == "54cb465fa855929b"


@pytest.mark.slow
def test_bench_precision_section_at_a_tiny_size():
    sizes = (("tiny", 16, 2, 48, 1, 2, 2),)
    result = bench.run_precision(quick=True, sizes=sizes, steps=1, trials=1)
    r = result["sizes"]["tiny"]
    assert r["ratio"] == pytest.approx(r["fp32_step_s"] / r["bf16_step_s"])
    assert 0 < r["bf16_share_of_bf16_peak"] and r["attn_math_ratio"] > 0 and r["fused_adamw_ratio"] > 0
    assert result["bf16_peak_gflops"] > 0 and isinstance(result["flags"], list) and "loadavg" in r
    assert "ratio" in bench.format_precision_report(result)
