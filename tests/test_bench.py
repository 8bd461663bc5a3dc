"""`loopscope bench`'s counting and timing pieces: FLOPs by hand, recorded walls, page timings, the report."""

import json

import pytest

from engine.core import flops
from engine.core.model import ModelConfig
from engine.core.presets import smoke
from engine.runtime import bench
from tests.test_dashboard import smoke_results

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests


def test_forward_flops_by_hand():
    cfg = ModelConfig(vocab_size=10, d_model=4, n_heads=2, d_ff=6, layers_per_block=2, trained_loops=3)
    # per token and layer: 2 * (4*16 + 3*24) = 272 for the projections, 2*2*4*(5+1)/2 = 48 for attention
    assert flops.forward_flops(cfg, seq=5, loops=3, readout_positions=2) == 5 * 2 * 3 * (272 + 48) + 2 * 4 * 10 * 2


def test_training_and_run_all_flops_scale_with_seeds_and_steps():
    run = smoke("parity")
    one = flops.training_flops(run, 1, steps=5)
    assert flops.training_flops(run, 3, steps=5) == pytest.approx(3 * one)
    schedule = bench.tasks.difficulty_schedule(run.task, 5)
    assert one == pytest.approx(sum(flops.train_step_flops(run, flops.seq_len(run.task, d)) for d in schedule))
    total = bench.run_all_flops("smoke", seeds=2, task_names=("parity",))
    assert set(total) == {"e2", "e3", "e4"} and all(v > 0 for v in total.values())
    assert bench.run_all_flops("smoke", seeds=4, task_names=("parity",))["e2"] == pytest.approx(2 * total["e2"])


def test_recorded_walls_count_each_group_once(tmp_path):
    def manifest(folder, **m):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "manifest.json").write_text(json.dumps(m))

    for i in range(3):  # one group of three seeds: one wall
        manifest(f"runs/r{i}", experiment="e2", wall_time_s=100.0, group_size=3)
    manifest("runs/s0", experiment="e4", wall_time_s=40.0, group_size=1)
    for i in range(2):
        manifest(f"refits/f{i}", experiment="e3", wall_time_s={"head": 10.0, "head+last": 30.0}, group_size=2)
    assert bench.measured_walls(tmp_path) == {"e2": 100.0, "e3": 40.0, "e4": 40.0}


def test_page_timings_on_smoke_results(tmp_path_factory):
    timings = bench.bench_pages(smoke_results(tmp_path_factory), pages=("overview", "accuracy"))
    assert set(timings) == {"overview", "accuracy"}
    assert all(t["cold_s"] > 0 and t["warm_s"] > 0 for t in timings.values())


def test_report_names_every_figure():
    task = {
        "one_pass": {"ratio": 12.0},
        "group_training": {"ratio": 1.1, "cold_ratio": 0.9, "ceiling": 2.5},
        "mfu_cpu": {"mfu": 0.41},
        "mfu_cpu_one_seed": {"mfu": 0.4},
        "matmul_ceiling": {"mfu": 0.59},
        "workers": {"workers": 2, "mfu_one_process": 0.3, "mfu_workers": 0.36, "ratio": 1.2},
        "generation_share": 0.01,
        "profile": {"bmm": 0.4, "mul": 0.2},
    }
    flops = bench.run_all_flops("smoke", seeds=1, task_names=("parity",))
    result = {"matmul_peak_gflops": 100.0, "threads": 2, "parity": task, "chain": replace_ratio(task)}
    result |= {"mfu_paper": {"mfu": 0.8}, "matmul_ceiling_paper": {"mfu": 0.9}}
    result["pages"] = {"overview": {"cold_s": 0.2, "warm_s": 0.1}}
    result["run_all"] = {
        "flops": flops,
        "limit_minutes": 1.0,
        "at_cpu_mfu_minutes": 2.4,
        "at_workers_minutes": 2.1,
        "at_matmul_ceiling_minutes": 1.7,
        "recorded_minutes": {"e2": 3.0},
    }
    text = bench.format_report(result)
    for phrase in ("12.0x", "1.10x steady, 0.90x on the first", "ceiling 2.50x", "41.0%", "matmuls alone: 59.0%",
                   "one process 30.0% of peak, --workers 2 36.0% (1.20x)", "bmm 40%", "80.0%", "alone: 90.0%",
                   "physical limit 1.0 min", "2.4 min (one process), 2.1 min (--workers 2)",
                   "matmuls-alone FLOP/s: 1.7 min", "E2 3.0 min",
                   "page overview: cold 0.20 s", "0.83x"):  # fmt: skip
        assert phrase in text, phrase


def replace_ratio(task: dict) -> dict:
    return task | {"group_training": {"ratio": 0.83, "cold_ratio": 0.5, "ceiling": 2.5}}


def test_smoke_preset_is_not_the_cpu_one():  # the run-all figure counts the preset it names
    assert bench.run_all_flops("smoke", 1, ("parity",))["e2"] < bench.run_all_flops("cpu", 1, ("parity",))["e2"]


def test_device_report_names_every_figure():
    r = {"step_s": 0.05, "tokens_per_s": 1e6, "flop_per_s": 2e14, "mfu": 0.25}
    result = {"device": "NVIDIA X", "bf16_peak_tflops": 800.0}
    fast = r | {"step_s": 0.025, "mfu": 0.5, "peak_memory_gib": 60.0, "estimated_memory_gib": 70.0}
    ev = {"seeds": 4, "items": 128, "per_member_s": 0.4, "batched_s": 0.1, "ratio": 4.0, "group_eval_estimate_s": 30}
    result |= {t: {"16": {"eager_foreach": r, "compiled_fused": fast}, "eval": ev} for t in ("parity", "chain")}
    text = bench.format_device_report(result)
    for phrase in (
        "NVIDIA X: bf16 matmul peak 800.0",
        "chain, 16 seed(s), compiled_fused: 25.0 ms/step",
        "50.0 ms/step",
        "1,000,000 tokens/s",
        "50.0% of the peak, 2.00x eager, peak 60.0 GiB (estimated 70.0)",
        "400 ms for 4 members one at a time, 100 ms batched (4.0x)",
    ):
        assert phrase in text, phrase


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="with a GPU the command runs the benchmark")
def test_gpu_bench_without_a_gpu_is_one_sentence(capsys):
    from engine.cli import main

    assert main(["bench", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_compiled_training_follows_eager_training():
    """torch.compile (LOOPSCOPE_COMPILE=1) changes how the step runs, not what it computes."""
    from dataclasses import replace

    from engine.core.train import train_group

    run = smoke("parity")
    run = replace(run, train=replace(run.train, steps=4))
    eager = train_group(run, [0, 1], progress=False, compile=False)
    compiled = train_group(run, [0, 1], progress=False, compile=True)
    torch = __import__("torch")
    assert torch.allclose(eager.losses, compiled.losses, atol=1e-4)
    for k, v in eager.model.state_dict().items():
        assert torch.allclose(v, compiled.model.state_dict()[k], atol=1e-4), k


def test_matmul_ceiling_and_workers_measure_the_smoke_preset():
    run = smoke("parity")
    ceiling = bench.bench_matmul_ceiling(run, peak=1e12, seeds=2)
    assert ceiling["step_s"] > 0 and 0 < ceiling["mfu"] < 1
    workers = bench.bench_workers(run, peak=1e12, seeds=2, steps=3, workers=2)
    assert workers["workers_s"] > 0 and workers["one_process_s"] > 0
    assert workers["mfu_workers"] == pytest.approx(workers["mfu_one_process"] * workers["ratio"])


@pytest.mark.parametrize("flags", [set(), {"amx_bf16"}], ids=["emulated-bf16", "native-bf16"])
def test_the_precision_section_measures_one_size_and_says_why_on_a_cpu_without_native_bf16(monkeypatch, flags):
    """Issue 59: on an AVX2 CPU bf16 is emulated (40-200x slower than fp32; the section ran over 20 minutes in its
    first size): only the first size is measured, fp32 and bf16 once each, and one sentence says what was skipped.
    With native bf16 every size and lever is measured."""
    monkeypatch.setattr(bench, "cpu_flags", lambda: flags)
    toy = (("toy", 16, 2, 32, 1, 2, 2), ("toy2", 16, 2, 32, 1, 2, 2))
    result = bench.run_precision(quick=True, sizes=toy, steps=1, trials=1)
    text = bench.format_precision_report(result)
    if flags:
        assert list(result["sizes"]) == ["toy", "toy2"] and "skipped" not in result
        assert "attn_math_ratio" in result["sizes"]["toy"] and "levers: math attention" in text
    else:
        assert list(result["sizes"]) == ["toy"] and "attn_math_ratio" not in result["sizes"]["toy"]
        assert result["skipped"].startswith("this CPU has no native bf16") and "skipped: toy2 " in result["skipped"]
        assert text.endswith(result["skipped"]) and "levers: math" not in text
