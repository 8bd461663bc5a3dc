"""The GPU engine's device-independent logic, tested on the CPU (issue 29): the memory model, the presets' groups
fitting one 80 GB GPU, activation checkpointing that changes memory and not results, evaluation where the model
trained, the compile policy, and the bench's lever table."""

import os
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
    assert four.state_bytes == 4 * one.state_bytes == 4 * (16 + memory.CPU_OPTIMIZER_BYTES) * cfg.model.n_params
    assert memory.estimate(cfg, 1, "cuda").state_bytes == 16 * cfg.model.n_params  # the fused kernel: no temporaries
    saving = memory.estimate(cfg, 1, "cpu", checkpointed=True).state_bytes - one.state_bytes
    assert saving == memory.CPU_CHECKPOINT_BYTES * cfg.model.n_params


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


# ---------------------------------------------------------------- issue 45: the step off the host, the checkpoint term

# sha256 (first 16 hex digits) of a tiny training's losses and weights, and of an evaluation and a refit of it,
# computed with the code before issue 45 changed the step (HEAD f4b00a6, one thread), per CPU kernel level
# (torch.backends.cpu.get_cpu_capability(): the kernels, and so the bits, differ between them): the CPU path must
# reproduce them bit for bit (the shipped CPU results are made by it). AVX512: the Intel Xeon (AMX) it was written on;
# AVX2: an AMD EPYC, 2026-12-07, from a worktree of f4b00a6 (the test had failed there on the Xeon's digests).
BEFORE_ISSUE_45 = {
    "AVX512": {
        "norm": {"losses": "63edb68fab44ee93", "weights": "a1d1309c47164f0d"},
        "eval": "3eee3f876f553328",
        "refit": {"losses": "bf7f442cf3637010", "state": "e3f80d47dc4ad25a", "grids": "172fecd01140db14"},
        "none-layer": {"losses": "33e4f68db7479558", "weights": "03e90b46dfad2be6"},
        "norm-uniform:1-3": {"losses": "f1e74dcc64739c34", "weights": "1afb4b7f8cb6907e"},
    },
    "AVX2": {
        "norm": {"losses": "4835d526ae23835e", "weights": "6d731422d1dfc407"},
        "eval": "ab600a1c9668650b",
        "refit": {"losses": "db25672da143ac98", "state": "7fa52a07620e41c1", "grids": "172fecd01140db14"},
        "none-layer": {"losses": "193a1fcb24264b45", "weights": "764573cb370e1926"},
        "norm-uniform:1-3": {"losses": "9109e125ae4486c9", "weights": "15f5deb12f61071e"},
    },
}


def digest(*tensors) -> str:
    import hashlib

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def tiny(boundary: str, loops: str = "", checkpoint: str = ""):
    cfg = preset("smoke", "parity", boundary)
    return replace(cfg, train=replace(cfg.train, steps=30, warmup_steps=5, loops=loops, checkpoint=checkpoint))


def test_the_cpu_step_reproduces_the_code_before_issue_45_bit_for_bit():
    """Finiteness checked every N steps, foreach clipping, losses held on the device: on the CPU every loss, weight,
    evaluation row and refit is what the code before them computed (BEFORE_ISSUE_45; a run with check_every 7 too)."""
    from engine.core.evaluate import evaluate
    from engine.experiments import refit as rf

    level = torch.backends.cpu.get_cpu_capability()
    if level not in BEFORE_ISSUE_45:
        pytest.skip(f"no digests of the code before issue 45 on a {level} CPU (recorded: {', '.join(BEFORE_ISSUE_45)})")
    before = BEFORE_ISSUE_45[level]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = {}
        for name, cfg in (("norm", tiny("norm")), ("none-layer", tiny("none", checkpoint="layer")),
                          ("norm-uniform:1-3", tiny("norm", loops="uniform:1-3"))):  # fmt: skip
            for every in (0, 7):
                r = train_group(cfg, [0, 1], "cpu", progress=False, check_every=every)
                sd = r.model.state_dict()
                got[name] = {"losses": digest(r.losses), "weights": digest(*[sd[k] for k in sorted(sd)])}
                assert got[name] == before[name], (name, every)
            if name == "norm":
                rows = evaluate(r.model, cfg.task, 6, "none", progress=False)
                rows = rows[rows["metric"] != "margin"]  # added after issue 45 (docs/design.md §10); the rest as then
                assert digest(torch.tensor(rows["value"].to_numpy())) == before["eval"]
                res = rf.refit(r.model, cfg, [0, 1], "head", rf.RefitConfig(targets=("head",), schedule=(0, 5, 10)), 6)
                state, grids = [res.state[k] for k in sorted(res.state)], [res.grids[k] for k in sorted(res.grids)]
                got = {"losses": digest(res.losses), "state": digest(*state), "grids": digest(*grids)}
                assert got == before["refit"]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("every", [1, 4, 25])
def test_a_diverged_loss_still_stops_with_its_step_named_when_checked_every_n(every):
    from engine.core.train import NonFiniteLoss

    cfg = smoke("parity")  # lr 10, weight decay 1: NaN at step 20 (tests/test_config_bounds.py's diverging())
    cfg = replace(cfg, train=replace(cfg.train, steps=30, lr=10.0, weight_decay=1.0))
    with pytest.raises(NonFiniteLoss) as first:
        train_group(cfg, [0, 1], "cpu", progress=False, check_every=1)
    with pytest.raises(NonFiniteLoss) as late:
        train_group(cfg, [0, 1], "cpu", progress=False, check_every=every)
    assert late.value.step == first.value.step and late.value.seed == first.value.seed
    assert f"at step {first.value.step} of 30" in str(late.value)


def test_foreach_clipping_is_the_tensor_by_tensor_clip_and_stays_per_member():
    from engine.core.train import clip_per_member

    g = torch.Generator().manual_seed(0)
    shapes = [(3, 5, 7), (3, 4), (3, 2, 2, 2)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 3
    before = [p.grad.clone() for p in params]
    norms = clip_per_member(params, 1.0)
    expect = torch.stack([b.pow(2).flatten(1).sum(1) for b in before]).sum(0).sqrt()
    assert torch.equal(norms, expect)
    coef = (1.0 / (expect + 1e-6)).clamp(max=1.0)
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p.grad, b * coef.view(-1, *[1] * (b.dim() - 1)))
    params[0].grad[1].mul_(1e3)  # one member's gradient grows: the others' clipping does not move
    again = [p.grad.clone() for p in params]
    clip_per_member(params, 1.0)
    # member 0's norm is recomputed from its clipped gradient: equal to norms[0] * coef[0] up to rounding, whose last
    # bit differs between CPU kernels (exact on the AVX512 Xeon, one ulp off on an AVX2 EPYC, 2026-12-07)
    expected = again[1][0] * (1.0 / (norms[0] * coef[0] + 1e-6)).clamp(max=1.0)
    torch.testing.assert_close(params[1].grad[0], expected, rtol=1e-6, atol=0)


def test_batched_evaluation_gives_each_members_rows_up_to_rounding(monkeypatch):
    """On a GPU the group evaluates in one forward (evaluate.batched); on the CPU, forced, it matches one member at a
    time up to rounding, and the CPU default stays one member at a time."""
    from engine.core import evaluate as ev
    from engine.core import tasks

    cfg = tiny("norm")
    model = train_group(cfg, [0, 1, 2], "cpu", progress=False).model
    batch = tasks.eval_set(cfg.task, cfg.task.eval_difficulties[-1])
    assert not ev.batched(model)
    one = ev.step_metrics(model, batch, 6, "none")
    monkeypatch.setenv("LOOPSCOPE_EVAL_BATCHED", "1")
    assert ev.batched(model)
    together = ev.step_metrics(model, batch, 6, "none")
    for name in ("norm_pre", "norm_post"):
        assert torch.allclose(one[name], together[name], rtol=1e-4), name
    assert (one["accuracy"] - together["accuracy"]).abs().max() <= 2 / len(batch.answers)


def heap_in_use() -> int:
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                  "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_the_checkpoint_term_counts_what_the_checkpointed_forward_keeps_measured_on_the_cpu(kind):
    """What a checkpointed training forward keeps alive (glibc's bytes in use after it, at 256 and 512 items, under the
    device's dtype policy: bf16 autocast for `cuda`) against the estimate's per-item term for train.checkpoint "layer"
    without its recomputed layer: within 15%. Under autocast each layer's saved input is fp32, and so is the state the
    loop keeps outside the layers; the term before issue 45 counted bf16 layer inputs only (a fifth of it here)."""
    import gc

    if not hasattr(__import__("ctypes").CDLL("libc.so.6"), "mallinfo2"):
        pytest.skip("glibc's mallinfo2 (2.33+) measures the heap")
    from engine.core.model import build
    from engine.core.tasks import sample

    cfg = replace(smoke("parity", "norm"), max_eval_loops=1)
    cfg = replace(cfg, train=replace(cfg.train, checkpoint="layer"))
    seq = memory.longest_sequence(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def kept(items: int) -> int:
        model = build(cfg.model, [0])
        tokens = sample(cfg.task, max(cfg.task.train_difficulties), items, torch.Generator().manual_seed(0)).tokens
        gc.collect()
        before = heap_in_use()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "cuda"):
            out = model(tokens[:, :seq][None], cfg.model.trained_loops, all_positions=True, readout_steps="last",
                        recompute=True)  # fmt: skip
        used = heap_in_use() - before
        del out
        return used

    try:
        for _ in range(1):  # the allocator's first use is not steady
            kept(256), kept(512)
        measured = min((kept(512) - kept(256)) / 256 for _ in range(2))
    finally:
        torch.set_num_threads(threads)
    per_item, _ = memory.checkpointed_bytes_per_item(cfg, kind)
    assert per_item == pytest.approx(measured, rel=0.15)
    calls = cfg.model.layers_per_block * cfg.model.trained_loops
    old_term = calls * seq * cfg.model.d_model * (2 if kind == "cuda" else 4)
    assert per_item > 2 * old_term


def test_one_compilation_serves_every_group_size():
    """Issue 45: a new group size compiled again (parameters' shapes static); now one graph serves 4, 16 and 2
    members and two sequence lengths (Dynamo's eager backend: the graphs counted without Inductor's minutes)."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    from engine.core import tasks
    from engine.core.model import build
    from engine.core.train import compiled

    cfg = preset("smoke", "parity")
    dynamo.reset()
    counters.clear()
    static = dynamo.config.force_parameter_static_shapes
    try:
        for members in (4, 16, 2):
            model = compiled(build(cfg.model, list(range(members))), backend="eager")
            for difficulty in (2, 4):
                x = tasks.sample(cfg.task, difficulty, 8, torch.Generator().manual_seed(0)).tokens
                model(x.expand(members, *x.shape).contiguous(), 3)
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        dynamo.config.force_parameter_static_shapes = static
        dynamo.reset()


def test_a_compile_failure_on_demand_raises_at_the_first_forward_and_eager_still_trains(monkeypatch):
    """Issue 59: LOOPSCOPE_COMPILE_FAIL=1 makes the compile raise where a failing compile on a device would, at the
    first compiled forward; the same training eager (LOOPSCOPE_COMPILE=0, the session's fallback) runs as always."""
    import torch._dynamo as dynamo

    cfg = short(smoke("parity"), steps=2)
    monkeypatch.setenv("LOOPSCOPE_COMPILE_FAIL", "1")
    static = dynamo.config.force_parameter_static_shapes
    try:
        with pytest.raises(Exception, match="a compile failure, simulated"):
            train_group(cfg, [0, 1], progress=False, compile=True)
    finally:
        dynamo.config.force_parameter_static_shapes = static
        dynamo.reset()
    monkeypatch.setenv("LOOPSCOPE_COMPILE", "0")
    assert not compile_wanted("cuda")
    eager = train_group(cfg, [0, 1], progress=False)
    assert torch.isfinite(eager.losses).all() and "compile" not in eager.policy


def test_the_gpu_determinism_flags_are_torchs_and_cpu_training_leaves_them_off(monkeypatch):
    """Issue 59: a GPU training sets what torch offers for repeatable results; a CPU training sets none of it (its
    results stay bit for bit those of the shipped runs)."""
    import torch._inductor.config as inductor

    from engine.core.train import gpu_determinism

    train_group(short(smoke("parity"), steps=2), [0], progress=False)
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so that what gpu_determinism sets is undone
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, inductor.deterministic)
    try:
        gpu_determinism()
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark and inductor.deterministic
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, inductor.deterministic = before
