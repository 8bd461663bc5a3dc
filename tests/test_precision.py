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
def test_bench_precision_section_at_a_tiny_size(monkeypatch):
    monkeypatch.setattr(bench, "cpu_flags", lambda: {"amx_bf16"})  # every lever, whatever this CPU (issue 59)
    sizes = (("tiny", 16, 2, 48, 1, 2, 2),)
    result = bench.run_precision(quick=True, sizes=sizes, steps=1, trials=1)
    r = result["sizes"]["tiny"]
    assert r["ratio"] == pytest.approx(r["fp32_step_s"] / r["bf16_step_s"])
    assert 0 < r["bf16_share_of_bf16_peak"] and r["attn_math_ratio"] > 0 and r["fused_adamw_ratio"] > 0
    assert r["cast_cache_ratio"] > 0 and "inductor_ratio" not in r  # Inductor only when asked (minutes of compiling)
    assert result["bf16_peak_gflops"] > 0 and isinstance(result["flags"], list) and "loadavg" in r
    assert 0 < result["wall_s"] and "ratio" in bench.format_precision_report(result)


# The model as it was before issue 44's levers (the last commit before them): the code that made every shipped fp32 run
BEFORE_LEVERS = "546a057"


def model_before_levers():
    """engine/core/model.py at BEFORE_LEVERS as its own module, or None where git or that commit is not here."""
    import importlib.util
    import subprocess
    import sys

    try:
        source = subprocess.run(["git", "show", f"{BEFORE_LEVERS}:engine/core/model.py"], cwd=REPO,
                                capture_output=True, check=True, text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    spec = importlib.util.spec_from_loader("loopscope_model_before_levers", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{BEFORE_LEVERS}:engine/core/model.py", "exec"), module.__dict__)
    return module


def trained(cfg: RunConfig, monkeypatch=None, build=None):
    if build is not None:
        monkeypatch.setattr(tr, "build", build)
    result = tr.train_group(cfg, cfg.group(0), progress=False)
    return result.losses, result.model.state_dict()


def assert_bit_identical(a, b):
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1]), "weights differ"


def test_fp32_training_is_bit_identical_to_the_model_before_the_levers(monkeypatch):
    """Shipped results depend on it: fp32 training through today's model equals, bit for bit (losses and every
    weight after training), the same training through engine/core/model.py as it was before issue 44."""
    old = model_before_levers()
    if old is None:
        pytest.skip(f"needs git and commit {BEFORE_LEVERS} (a clone with its history)")
    cfg = tiny(steps=6)
    now = trained(cfg)

    def old_build(model_cfg, seeds):
        from dataclasses import asdict

        model = old.LoopedLM(old.ModelConfig(**asdict(model_cfg)), members=len(seeds))
        model.init_members(seeds)
        return model

    before = trained(cfg, monkeypatch, old_build)
    assert_bit_identical(now, before)
    # and the comparison can fail: the same training in bf16 is not bit-identical
    bf = trained(tiny("bf16", steps=6))
    assert not torch.equal(bf[0], now[0])


def test_fp32_training_never_enters_a_bf16_lever(monkeypatch):
    """Without git history too: fp32 training with every bf16 lever made to fail when entered (SDPA's math backend,
    Inductor, the fused AdamW) runs, and gives the same losses and weights as with the levers left alone."""
    from engine.core import model as model_module

    cfg = tiny(steps=4)
    now = trained(cfg)

    def refused(*a, **kw):
        raise AssertionError("an fp32 step entered a bf16 lever")

    monkeypatch.setattr(model_module, "sdpa_kernel", refused)
    monkeypatch.setattr(tr, "compiled", refused)
    real_adamw = tr.adamw
    monkeypatch.setattr(tr, "adamw", lambda *a, fused=None: refused() if fused else real_adamw(*a, fused=fused))
    assert_bit_identical(now, trained(cfg))
    with pytest.raises(AssertionError, match="bf16 lever"):  # the trap works: bf16 enters the math backend
        trained(tiny("bf16", steps=1))


def test_precision_agreement_per_n():
    """Item 4's check on stored rows: a group drawn from the reference's own seeds is within at every n; a group
    whose accuracy fell is not (the test can fail)."""
    import numpy as np
    import pandas as pd

    cfg = cpu("parity")
    rng = np.random.default_rng(0)
    rows = [
        {"metric": "accuracy", "boundary": "norm", "difficulty": d, "seed": s, "eval_loops": n,
         "value": float(np.clip(0.95 - 0.05 * max(0, n - 4) + rng.normal(0, 0.01), 0, 1))}
        for s in range(16) for n in range(1, 9) for d in (*cfg.task.train_difficulties, 16)
    ]  # fmt: skip
    ref = pd.DataFrame(rows)
    same = ref[ref["seed"] < 4]
    table = bench.precision_agreement(ref, same, cfg)
    assert list(table["n"]) == list(range(1, 9)) and table["within"].all() and table["inside"].all()
    assert (table["seeds"] == 4).all() and (table["reference_seeds"] == 16).all()
    worse = same.assign(value=same["value"] - 0.2 * (same["eval_loops"] >= 4))
    table = bench.precision_agreement(ref, worse, cfg)
    assert table.set_index("n")["within"].to_dict() == {n: n < 4 for n in range(1, 9)}
