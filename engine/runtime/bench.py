"""`loopscope bench`: every fast path against its baseline, measured in one run on this machine.

Each figure is a ratio of two timings taken back to back in the same process, so a busy machine
slows both sides alike. FLOPs are counted from the config (matmuls and attention, loops included).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from engine.core import tasks
from engine.core.flops import eval_flops, train_step_flops, training_flops
from engine.core.model import build
from engine.core.presets import RunConfig, cpu, paper, preset
from engine.core.train import CPU_BF16_FLAGS, cpu_flags, member_losses, train_group
from engine.experiments import PAPER, e3
from engine.experiments import refit as rf
from engine.runtime.fanout import local_pool

GOALS = {
    "one_pass": 10.0,
    "group_training": 3.0,
    "mfu_cpu": 0.5,
    "mfu_paper": 0.8,
    "generation_share": 0.05,
    "run_all_minutes": 45.0,
}
PAGES = ("overview", "accuracy", "norms", "refit", "stacked", "ouro", "runs")
APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def timed(fn: Callable[[], object], repeat: int = 1, device: str = "cpu", trials: int = 1) -> float:
    """Seconds per call: after one warm-up call, the best of `trials` means over `repeat` calls (the best,
    because on a shared 2-core VM the noise only ever adds time)."""
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    fn()  # warm-up: allocator, kernels, caches (and compilation)
    sync()
    best = math.inf
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best


def matmul_peak(n: int = 2048, repeat: int = 5, device: str = "cpu", dtype=torch.float32, trials: int = 3) -> float:
    """This machine's matmul throughput (FLOP/s) at a size that saturates it: fp32 on the CPU; on a GPU
    the dtype training runs its matmuls in (bf16 under autocast). The best of `trials`."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / timed(lambda: a @ b, repeat, device, trials)


def bench_one_pass(run: RunConfig, n_max: int = 24) -> dict:
    model = build(run.model, [0]).eval()
    batch = tasks.eval_set(run.task, max(run.task.train_difficulties))
    x = batch.tokens[None]
    with torch.no_grad():
        one = timed(lambda: model(x, n_max), trials=3)
        separate = timed(lambda: [model(x, n) for n in range(1, n_max + 1)], trials=3)
    return {"one_pass_s": one, "separate_s": separate, "ratio": separate / one, "goal": GOALS["one_pass"]}


def bench_group(run: RunConfig, seeds: int = 16, steps: int = 30) -> dict:
    """16 seeds as one group against 16 one at a time, equal steps, each side run twice: the first (cold)
    pays one-off costs (a new tensor shape's first kernels and pages: about 1.5 s for a group of 16),
    the second (the ratio) is the steady state that a 2000-step run is made of."""
    run = replace(run, train=replace(run.train, steps=steps))

    def sides() -> tuple[float, float]:
        group = train_group(run, list(range(seeds)), progress=False).wall_s
        return group, sum(train_group(run, [s], progress=False).wall_s for s in range(seeds))

    (cold_group, cold_alone), (group, alone) = sides(), sides()
    return {
        "group_s": group,
        "one_at_a_time_s": alone,
        "ratio": alone / group,
        "cold_ratio": cold_alone / cold_group,
        "goal": GOALS["group_training"],
    }


def _train_wall(run: RunConfig, seeds: list[int]) -> float:
    return train_group(run, seeds, progress=False).wall_s


def bench_workers(run: RunConfig, peak: float, seeds: int = 16, steps: int = 30, workers: int = 2) -> dict:
    """`workers` groups of `seeds` on the preset's own difficulty schedule: one after another in this
    process (all its threads) against `run --workers` (engine.runtime.fanout: one process per group, cores/workers
    threads each); machine training FLOP/s over the peak for both."""

    run = replace(run, train=replace(run.train, steps=steps))
    groups = [list(range(i * seeds, (i + 1) * seeds)) for i in range(workers)]
    flops = sum(training_flops(run, len(g)) for g in groups)
    _train_wall(run, groups[0])  # warm-up
    start = time.perf_counter()
    for g in groups:
        _train_wall(run, g)
    serial = time.perf_counter() - start
    with local_pool(workers) as pool:
        for f in [pool.submit(_train_wall, run, g) for g in groups]:  # warm-up: imports and first shapes
            f.result()
        start = time.perf_counter()
        for f in [pool.submit(_train_wall, run, g) for g in groups]:
            f.result()
        parallel = time.perf_counter() - start
    return {
        "one_process_s": serial,
        "workers_s": parallel,
        "workers": workers,
        "ratio": serial / parallel,
        "mfu_one_process": flops / serial / peak,
        "mfu_workers": flops / parallel / peak,
    }


def bench_matmul_ceiling(run: RunConfig, peak: float, seeds: int = 16, device: str = "cpu") -> dict:
    """The model's matmuls alone, forward and backward, at the hardest training batch: the same bmm shapes
    (projections, SwiGLU, attention scores and values, the head) and FLOPs as a training step, with every
    elementwise op (norms, RoPE, SiLU, softmax, the optimizer) left out. Its FLOP/s over the peak is the
    most any fusion of the elementwise work could reach on this machine."""
    m, S, B = run.model, seeds, run.train.batch_size
    tokens, _ = hardest_batch(run, seeds, device)
    T, d, f, H = tokens.shape[-1], m.d_model, m.d_ff, m.n_heads
    shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    g = torch.Generator().manual_seed(0)
    layers = [
        {k: (torch.randn(S, *sh, generator=g) * 0.05).to(device).requires_grad_() for k, sh in shapes.items()}
        for _ in range(m.layers_per_block)
    ]
    head = (torch.randn(S, d, m.vocab_size, generator=g) * 0.05).to(device).requires_grad_()
    h0 = torch.randn(S, B * T, d, generator=g).to(device).requires_grad_()

    def heads(x):  # (S, B*T, d) -> (S*B, H, T, d/H)
        return x.view(S * B, T, H, d // H).transpose(1, 2)

    def step():
        h = h0
        for _ in range(m.trained_loops):
            for w in layers:
                q, k, v = (heads(torch.bmm(h, w[n])) for n in "qkv")
                y = ((q @ k.transpose(-1, -2)) @ v).transpose(1, 2).reshape(S, B * T, d)
                h = h + torch.bmm(y, w["o"])
                h = h + torch.bmm(torch.bmm(h, w["gate"]) + torch.bmm(h, w["up"]), w["down"])
        torch.bmm(h, head).sum().backward()

    seconds = timed(step, 3, device, trials=3)
    # counts the full T x T score and value matmuls, where training FLOPs count the causal half
    flops = seeds * train_step_flops(run, T)
    return {"step_s": seconds, "mfu": flops / seconds / peak}


def hardest_batch(run: RunConfig, seeds: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """One training batch per seed at the hardest training difficulty: tokens and targets (S, B, T)."""
    d = max(run.task.train_difficulties)
    batches = [tasks.sample(run.task, d, run.train.batch_size, tasks.train_generator(s)) for s in range(seeds)]
    return tuple(torch.stack([getattr(b, k) for b in batches]).to(device) for k in ("tokens", "targets"))


def bench_mfu(
    run: RunConfig,
    peak: float,
    seeds: int,
    steps: int = 5,
    device: str = "cpu",
    compile=False,
    fused=None,
    recompute: bool = False,
) -> dict:
    """Achieved training FLOP/s over the matmul peak, at the hardest training difficulty (on CUDA under bf16
    autocast, as training runs there). compile: the decoder layers through torch.compile (train.compiled);
    fused: AdamW's fused kernel (default: as training picks it, train.adamw); recompute: activation
    checkpointing per layer. On CUDA also the peak memory, beside the estimate (engine.core.memory)."""
    from engine.core.memory import GIB, estimate
    from engine.core.train import adamw, compiled

    model = build(run.model, list(range(seeds))).to(device)
    forward = compiled(model) if compile else model
    params = list(model.parameters())
    if fused is None:
        opt = adamw([p for p in params if p.dim() == 3], [p for p in params if p.dim() != 3], 1e-4, 0.1)
    else:
        opt = torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if fused else {"foreach": True}))
    x, y = hardest_batch(run, seeds, device)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            out = forward(x, all_positions=True, readout_steps="last", recompute=recompute)
        opt.zero_grad(set_to_none=True)
        member_losses(out.logits, y).sum().backward()
        opt.step()

    seconds = timed(step, steps, device, trials=3 if device == "cpu" else 1)
    flops = seeds * train_step_flops(run, x.shape[-1])
    tokens = seeds * run.train.batch_size * x.shape[-1]
    out = {
        "seeds": seeds,
        "step_s": seconds,
        "tokens_per_s": tokens / seconds,
        "flop_per_s": flops / seconds,
        "mfu": flops / seconds / peak,
    }
    if device == "cuda":
        cfg = replace(run, train=replace(run.train, checkpoint="layer" if recompute else ""))
        out |= {
            "peak_memory_gib": torch.cuda.max_memory_allocated() / GIB,
            "estimated_memory_gib": estimate(cfg, seeds, "cuda").peak_bytes / GIB,
        }
    return out


def profile_step(run: RunConfig, seeds: int = 16, steps: int = 2, top: int = 8) -> dict[str, float]:
    """Share of a training step's CPU time per aten op (torch.profiler, self time), the largest first."""
    from torch.profiler import ProfilerActivity, profile

    model = build(run.model, list(range(seeds)))
    x, y = hardest_batch(run, seeds)

    def step():
        member_losses(model(x, all_positions=True, readout_steps="last").logits, y).sum().backward()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in ops)
    ranked = sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top]
    return {e.key.removeprefix("aten::"): e.self_cpu_time_total / total for e in ranked}


def bench_generation(run: RunConfig, seeds: int = 16, steps: int = 20) -> dict:
    """Data generation for a group's step, against the whole step (from the group benchmark)."""
    gens = [tasks.train_generator(s) for s in range(seeds)]
    schedule = tasks.difficulty_schedule(run.task, steps)
    start = time.perf_counter()
    for d in schedule:
        torch.stack([tasks.sample(run.task, d, run.train.batch_size, g).tokens for g in gens])
    per_step = (time.perf_counter() - start) / steps
    return {"generation_s_per_step": per_step}


def run_all_flops(preset_name: str = "cpu", seeds: int = 16, task_names=("parity", "chain")) -> dict[str, float]:
    """The model FLOPs of `loopscope run all --preset <name>`, per experiment: E2 trains both modes and
    evaluates each (norm runs twice: own mode and the surgery); E3 evaluates the original and the removed
    model, refits every distinct target (head alone: forward only; with a layer: forward + backward)
    and evaluates each checkpoint; E4 trains the stacked twins and evaluates them in both modes."""

    out = dict.fromkeys(PAPER, 0.0)
    cfg = e3.refit_config(preset_name)
    for task in task_names:
        for boundary, evals in (("norm", 2), ("none", 1)):
            run = preset(preset_name, task, boundary)
            out["e2"] += training_flops(run, seeds) + evals * eval_flops(run, seeds)
        run = preset(preset_name, task, "norm")
        targets = rf.distinct_targets(cfg.targets, run.model.layers_per_block)
        refit_run = replace(run, train=replace(run.train, batch_size=cfg.batch_size or run.train.batch_size))
        steps = cfg.schedule[-1]
        for target in targets:
            factor = 1 / 3 if target == "head" else 1.0  # the head alone: no backward through the loop
            out["e3"] += factor * training_flops(refit_run, seeds, steps)
        out["e3"] += (2 + len(targets) * (len(cfg.schedule) - 1)) * eval_flops(run, seeds)
        stacked = preset(preset_name, task, "norm", arch="stacked")
        out["e4"] += training_flops(stacked, seeds) + 2 * eval_flops(stacked, seeds)
    return out


def measured_walls(root: Path) -> dict[str, float]:
    """Seconds of training (E2, E4) and refitting (E3) recorded in the result manifests, one figure per
    group of seeds (every member of a group records the group's wall time); evaluation is not included."""
    out = dict.fromkeys(PAPER, 0.0)
    seen = set()
    for manifest in sorted(Path(root).glob("*/*/manifest.json")):
        m = json.loads(manifest.read_text())
        exp = m.get("experiment")
        if exp not in out:
            continue
        walls = m.get("wall_time_s")
        walls = walls if isinstance(walls, dict) else {"train": walls}
        for what, wall in walls.items():
            key = (exp, what, wall, m.get("group_size"))
            if wall is not None and key not in seen:
                seen.add(key)
                out[exp] += float(wall)
    return out


PAGE_TIMING = """
import json, sys, time
import streamlit  # a server has Streamlit imported before its first session
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=600)
if sys.argv[2] != "overview":
    at.switch_page(f"app_pages/{sys.argv[2]}.py")
start = time.perf_counter(); at.run(); cold = time.perf_counter() - start
start = time.perf_counter(); at.run(); warm = time.perf_counter() - start
heavy = [m for m in ("torch", "scipy", "altair", "pyarrow") if m in sys.modules]
print(json.dumps({"cold_s": cold, "warm_s": warm, "heavy_imports": heavy, "errors": [e.value for e in at.exception]}))
"""


def _page_timing(page: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PAGE_TIMING, str(APP), page], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"timing page {page} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_pages(root: Path, pages=PAGES) -> dict[str, dict]:
    """Seconds per dashboard page on the results in `root`, each page in a fresh Python process as a new server's
    first session would be (AppTest): cold = the first render (imports, reading and summarising the tables), warm
    = the next (Streamlit's caches); the heavy modules the page imported. The overview runs first, with an empty
    verdict cache (dashboard.results.cache_dir; a current verdicts.json in root is still read), and once more at
    the end, in a fresh process with the verdicts already on disk (`cold_cached_s`): what a restarted server
    shows."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, LOOPSCOPE_RESULTS=str(root), LOOPSCOPE_CACHE=cache)
        out = {page: _page_timing(page, env) for page in pages}
        if "overview" in out:
            again = _page_timing("overview", env)
            out["overview"] |= {"cold_cached_s": again["cold_s"], "cold_cached_heavy_imports": again["heavy_imports"]}
    return out


def _guarded(fn: Callable[[], dict]) -> dict:
    """A measurement, or what stopped it (out of memory is a result here, not a crash)."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return {"error": f"out of memory ({str(e).splitlines()[0][:120]})"}


def bench_eval_device(run: RunConfig, seeds: int, device: str, items: int = 128) -> dict:
    """Evaluation on the device: one difficulty's `items` (the hardest evaluated), every member one at a time (as
    evaluate() does, so a run's rows do not depend on its group) against all members in one batch."""
    from engine.core.evaluate import step_metrics

    model = build(run.model, list(range(seeds))).to(device).eval()
    batch = tasks.eval_set(run.task, max(run.task.eval_difficulties))
    batch = tasks.Batch(**{f: getattr(batch, f)[:items] for f in batch.__dataclass_fields__})
    n = run.max_eval_loops

    def batched():
        with torch.no_grad():
            model(batch.tokens[None].expand(seeds, -1, -1).to(device), n)

    per_member = timed(lambda: step_metrics(model, batch, n, run.model.boundary), 1, device)
    together = timed(batched, 1, device)
    group = run.train.group_size  # the preset's group, every member one at a time, every evaluated difficulty
    full = per_member / seeds * group * run.task.eval_examples / items * len(run.task.eval_difficulties)
    return {"seeds": seeds, "items": items, "per_member_s": per_member, "batched_s": together,
            "ratio": per_member / together, "group_eval_estimate_s": full}  # fmt: skip


def run_device(
    device: str = "cuda",
    compile: bool = True,
    steps: int = 10,
    seeds: int = 16,
    size: str = "paper",
    partial=None,
) -> dict:
    """The `paper` preset's training throughput on an accelerator, each lever as a ratio against the eager baseline
    measured in the same run: fused AdamW, torch.compile per decoder layer, activation checkpointing per layer
    (its cost), and batched evaluation; 1 seed and a group of `seeds`; against the device's bf16 matmul peak.
    `size`: the preset measured (`smoke` for a dry run of the script's logic on the CPU); partial(result so far) is
    called after every measurement (dev/checks/gpu-check.sh keeps what it measured if its time runs out)."""
    peak = matmul_peak(8192, 10, device, torch.bfloat16) if device == "cuda" else matmul_peak()
    out: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "bf16_peak_tflops": peak / 1e12,
    }
    for task in ("parity", "chain"):
        run, r = preset(size, task), {}
        for S in (1, seeds):
            m = lambda **kw: _guarded(lambda: bench_mfu(run, peak, S, steps, device, **kw))  # noqa: B023, E731
            levers = {"eager_foreach": {"fused": False}, "eager_fused": {"fused": True}}
            if compile:
                levers |= {"compiled_fused": {"compile": True, "fused": True},
                           "compiled_fused_recompute": {"compile": True, "fused": True, "recompute": True}}  # fmt: skip
            for name, kw in levers.items():
                r.setdefault(f"{S}", {})[name] = m(**kw)
                out[task] = r
                if partial is not None:
                    partial(out)
        r["eval"] = _guarded(lambda: bench_eval_device(run, 4, device))  # noqa: B023
        out[task] = r
        if partial is not None:
            partial(out)
    return out


def format_device_report(result: dict) -> str:
    lines = [f"{result['device']}: bf16 matmul peak {result['bf16_peak_tflops']:.1f} TFLOP/s"]
    for task in ("parity", "chain"):
        for seeds, hows in result[task].items():
            if seeds == "eval":
                e = hows
                lines.append(
                    f"{task}: evaluation of {e.get('items')} items at n = 1..3T on the device: "
                    + (
                        e["error"]
                        if "error" in e
                        else f"{e['per_member_s'] * 1e3:.0f} ms for {e['seeds']} members one "
                        f"at a time, {e['batched_s'] * 1e3:.0f} ms batched ({e['ratio']:.1f}x); a 16-seed group's "
                        f"evaluation at this rate: {e['group_eval_estimate_s'] * 4:.0f} s"
                    )  # fmt: skip
                )
                continue
            base = hows.get("eager_foreach", {}).get("step_s")
            for how, r in hows.items():
                if "error" in r:
                    lines.append(f"{task}, {seeds} seed(s), {how}: {r['error']}")
                    continue
                ratio = f", {base / r['step_s']:.2f}x eager" if base else ""
                mem = f", peak {r['peak_memory_gib']:.1f} GiB (estimated {r['estimated_memory_gib']:.1f})" \
                    if "peak_memory_gib" in r else ""  # fmt: skip
                lines.append(
                    f"{task}, {seeds} seed(s), {how}: {r['step_s'] * 1e3:.1f} ms/step, "
                    f"{r['tokens_per_s']:,.0f} tokens/s, {r['flop_per_s'] / 1e12:.1f} TFLOP/s = {r['mfu']:.1%} of "
                    f"the peak{ratio}{mem}"
                )
    return "\n".join(lines)


def run_all(peak: float | None = None, quick: bool = False, results: Path | None = None) -> dict:
    peak = peak or matmul_peak()
    out: dict = {"matmul_peak_gflops": peak / 1e9, "threads": torch.get_num_threads()}
    seeds, steps = (4, 3) if quick else (16, 30)
    for task in ("parity", "chain"):
        run = cpu(task)
        group = bench_group(run, seeds=seeds, steps=steps)
        gen = bench_generation(run)
        one = bench_mfu(run, peak, seeds=1, steps=2 if quick else 5)
        out[task] = {
            "one_pass": bench_one_pass(run),
            "group_training": group | {"ceiling": 1 / one["mfu"]},
            "mfu_cpu": bench_mfu(run, peak, seeds=seeds, steps=2 if quick else 5),
            "mfu_cpu_one_seed": one,
            "matmul_ceiling": bench_matmul_ceiling(run, peak, seeds=seeds),
            "workers": bench_workers(run, peak, seeds=seeds, steps=steps),
            "generation_share": gen["generation_s_per_step"] / (group["group_s"] / steps),
            "profile": profile_step(run, seeds=seeds, steps=1 if quick else 2),
        }
    if not quick:
        out["mfu_paper"] = bench_mfu(paper("parity"), peak, seeds=1, steps=2)
        out["matmul_ceiling_paper"] = bench_matmul_ceiling(paper("parity"), peak, seeds=1)
    flops = run_all_flops("cpu")
    limit = sum(flops.values()) / peak / 60
    worst = lambda key, field: min(out[t][key][field] for t in ("parity", "chain"))  # noqa: E731
    out["run_all"] = {
        "flops": flops,
        "limit_minutes": limit,
        "at_cpu_mfu_minutes": limit / worst("workers", "mfu_one_process"),  # on the schedule, not the hardest batch
        "at_workers_minutes": limit / worst("workers", "mfu_workers"),
        "at_matmul_ceiling_minutes": limit / worst("matmul_ceiling", "mfu"),
        "goal": GOALS["run_all_minutes"],
    }
    if results is not None and Path(results).exists():
        out["run_all"]["recorded_minutes"] = {k: v / 60 for k, v in measured_walls(results).items()}
        out["pages"] = bench_pages(Path(results))
    return out


def format_report(result: dict) -> str:
    lines = [f"fp32 matmul peak: {result['matmul_peak_gflops']:.1f} GFLOP/s ({result.get('threads', '?')} threads)"]
    for task in ("parity", "chain"):
        r = result[task]
        g, w = r["group_training"], r["workers"]
        lines += [
            f"{task}: one pass of 24 loops vs 24 forwards: {r['one_pass']['ratio']:.1f}x (goal >= 10x)",
            f"{task}: 16 seeds as one group vs one at a time: {g['ratio']:.2f}x steady, {g['cold_ratio']:.2f}x on "
            f"the first run (goal >= 3x; ceiling {g['ceiling']:.2f}x = peak / one seed's FLOP/s, "
            f"{r['mfu_cpu_one_seed']['mfu']:.1%} of peak)",
            f"{task}: training FLOP/s / peak (cpu preset, hardest batch): {r['mfu_cpu']['mfu']:.1%} (goal >= 50%); "
            f"its matmuls alone: {r['matmul_ceiling']['mfu']:.1%}",
            f"{task}: on the training schedule, {w['workers']} groups: one process {w['mfu_one_process']:.1%} of peak, "
            f"--workers {w['workers']} {w['mfu_workers']:.1%} ({w['ratio']:.2f}x)",
            f"{task}: task generation / training step: {r['generation_share']:.1%} (goal <= 5%)",
            f"{task}: profile (self CPU time): "
            + ", ".join(f"{op} {share:.0%}" for op, share in list(r["profile"].items())[:5]),
        ]
    if "mfu_paper" in result:
        lines.append(
            f"paper preset: training FLOP/s / peak: {result['mfu_paper']['mfu']:.1%} (goal >= 80%); its matmuls "
            f"alone: {result['matmul_ceiling_paper']['mfu']:.1%}"
        )
    ra = result["run_all"]
    lines.append(
        f"run all --preset cpu: {sum(ra['flops'].values()) / 1e12:.1f} TFLOP "
        f"(E2 {ra['flops']['e2'] / 1e12:.1f}, E3 {ra['flops']['e3'] / 1e12:.1f}, E4 {ra['flops']['e4'] / 1e12:.1f}); "
        f"physical limit {ra['limit_minutes']:.1f} min; at the FLOP/s measured on the training schedule: "
        f"{ra['at_cpu_mfu_minutes']:.1f} min (one process), {ra['at_workers_minutes']:.1f} min (--workers 2); at the "
        f"matmuls-alone FLOP/s: {ra['at_matmul_ceiling_minutes']:.1f} min (goal <= 45 min)"
    )
    if "recorded_minutes" in ra:
        rec = ra["recorded_minutes"]
        lines.append(
            "  recorded in the result manifests (training and refits, no evaluation, as they ran): "
            + ", ".join(f"{k.upper()} {v:.1f} min" for k, v in rec.items())
        )
    pages = format_report_pages(result)
    return "\n".join(lines + ([pages] if pages else []))


# ---------------------------------------------------------------- `--only precision`: the CPU's fp32 against its bf16

# (name, d_model, n_heads, d_ff, layers_per_block, seeds, quick seeds): the `cpu` preset's model and group, E5's
# 1.6M rung (d 256, L 2; 1,627,392 parameters), the paper's 19M model; each at its hardest training batch of 64. The
# paper size runs 2 seeds (the same matmul shapes per member as 4, half the time) so that the whole section stays
# within about 2-3 minutes on 2 idle cores: 5 step variants x 3 calls each per size.
PRECISION_SIZES = (
    ("cpu", 64, 4, 176, 2, 16, 4),
    ("1.6M", 256, 8, 704, 2, 4, 2),
    ("paper", 512, 8, 1376, 6, 2, 1),
)
EMULATED_N = 512  # the bf16 matmul peak's size on a CPU without native bf16 (2,048 takes seconds a call there)


def precision_step(
    run: RunConfig, seeds: int, precision: str, math_attention=True, fused_adamw=None, cast_cache=True, inductor=False
):
    """One whole training step as train_group takes it at the hardest training batch (autocast in bf16, the loss,
    backward, per-member clipping, AdamW) and its FLOPs. math_attention, fused_adamw: the bf16 levers (default: as
    training has them, engine.core.model.CPU_BF16_MATH_ATTENTION and engine.core.train.CPU_BF16_FUSED_ADAMW);
    cast_cache: autocast's cache of the weights' bf16 copies (True, as training runs: each weight is cast once per
    step, not once per loop step); inductor: the decoder layers through torch.compile (engine.core.train.compiled,
    Inductor's C++ backend on the CPU; as `LOOPSCOPE_COMPILE=1` trains)."""
    from engine.core import model as model_module
    from engine.core import train as tr

    model = build(run.model, list(range(seeds)))
    forward = tr.compiled(model) if inductor else model
    params = list(model.parameters())
    bf16 = precision == "bf16"
    fused = (tr.CPU_BF16_FUSED_ADAMW if fused_adamw is None else fused_adamw) if bf16 else None
    opt = tr.adamw([p for p in params if p.dim() == 3], [p for p in params if p.dim() != 3], 1e-4, 0.1, fused=fused)
    x, y = hardest_batch(run, seeds)

    def step():
        before, model_module.CPU_BF16_MATH_ATTENTION = model_module.CPU_BF16_MATH_ATTENTION, math_attention
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16, cache_enabled=cast_cache):
                out = forward(x, all_positions=True, readout_steps="last")
        finally:
            model_module.CPU_BF16_MATH_ATTENTION = before
        opt.zero_grad(set_to_none=True)
        member_losses(out.logits, y).sum().backward()
        tr.clip_per_member(params, 1.0)
        opt.step()

    return step, seeds * train_step_flops(run, x.shape[-1])


def interleaved(fns: dict[str, Callable[[], object]], repeat: int, trials: int) -> dict[str, float]:
    """Seconds per call of each function: one warm-up call each, then `trials` rounds that run every function
    `repeat` times in turn (so a load that comes and goes reaches every side alike); the best round of each."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, math.inf)
    for _ in range(trials):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / repeat)
    return best


def cpu_description() -> dict:
    """The CPU's model name, its bf16-relevant flags and the load while measuring (/proc; empty elsewhere)."""

    name = ""
    try:
        name = next((ln.partition(":")[2].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "")  # fmt: skip
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    flags = cpu_flags()
    shown = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "avx_vnni")
    return {
        "cpu_model": name,
        "flags": [f for f in shown if f in flags],
        "native_bf16": bool(set(CPU_BF16_FLAGS) & flags),
        "threads": torch.get_num_threads(),
        "loadavg": [float(v) for v in load],
    }


def run_precision(
    quick: bool = False, sizes=PRECISION_SIZES, steps: int | None = None, trials: int = 2, inductor: bool = False
) -> dict:
    """fp32 against bf16 training steps in one process, at each size of `sizes` (PRECISION_SIZES): the time of a
    whole step, `ratio` = fp32 time / bf16 time, each step's FLOP/s as a share of the fp32 and bf16 matmul peaks
    measured in the same run, and the bf16 levers each as a ratio of the step without the lever to the step as
    training takes it (attn_math_ratio: SDPA's flash kernel / its math backend; fused_adamw_ratio: foreach AdamW /
    fused; cast_cache_ratio: every weight cast at each use / once per step), with the CPU's flags and load. inductor
    (off by default: its compilations take minutes on 2 loaded cores): also the bf16 step with the decoder layers
    through torch.compile, inductor_ratio = eager time / compiled time, and each compilation's seconds. On a CPU
    without native bf16 (emulated: 40-200x slower than fp32, issue 59) only the first size is measured, fp32 and
    bf16 once each at its quick seeds, and `skipped` says so in one sentence."""
    started = time.perf_counter()
    out: dict = cpu_description()
    native = out["native_bf16"]
    n = 1024 if quick else 2048
    out["fp32_peak_gflops"] = matmul_peak(n, 3, trials=2) / 1e9
    out["bf16_peak_gflops"] = matmul_peak(n if native else EMULATED_N, 3, dtype=torch.bfloat16, trials=2) / 1e9
    skipped = [s[0] for s in sizes[1:]]
    if not native:
        quick, sizes, steps, trials, inductor = True, sizes[:1], 1, 1, False
    base, out["sizes"] = cpu("parity"), {}
    for name, d, heads, ff, layers, seeds, quick_seeds in sizes:
        model = replace(base.model, d_model=d, n_heads=heads, d_ff=ff, layers_per_block=layers)
        run = replace(base, model=model)
        seeds = quick_seeds if quick else seeds
        sides = {"fp32": precision_step(run, seeds, "fp32"), "bf16": precision_step(run, seeds, "bf16")}
        if native:
            sides |= {
                "bf16_flash_attention": precision_step(run, seeds, "bf16", math_attention=False),
                "bf16_foreach_adamw": precision_step(run, seeds, "bf16", fused_adamw=False),
                "bf16_uncached_casts": precision_step(run, seeds, "bf16", cast_cache=False),
            }
        if inductor:
            sides["bf16_inductor"] = precision_step(run, seeds, "bf16", inductor=True)
        flops = sides["fp32"][1]
        fns = {k: fn for k, (fn, _) in sides.items()}
        compile_s = None
        if inductor:  # the first call compiles (forward and backward); timed apart, then the step as the others
            start = time.perf_counter()
            fns["bf16_inductor"]()
            compile_s = time.perf_counter() - start
        t = interleaved(fns, steps or (1 if quick or d >= 512 else 2), trials)
        out["sizes"][name] = {
            "params": model.n_params,
            "seeds": seeds,
            "fp32_step_s": t["fp32"],
            "bf16_step_s": t["bf16"],
            "ratio": t["fp32"] / t["bf16"],
            "fp32_gflops": flops / t["fp32"] / 1e9,
            "bf16_gflops": flops / t["bf16"] / 1e9,
            "fp32_share_of_fp32_peak": flops / t["fp32"] / 1e9 / out["fp32_peak_gflops"],
            "bf16_share_of_bf16_peak": flops / t["bf16"] / 1e9 / out["bf16_peak_gflops"],
            "loadavg": cpu_description()["loadavg"],
        }
        if native:
            out["sizes"][name] |= {
                "attn_math_ratio": t["bf16_flash_attention"] / t["bf16"],
                "fused_adamw_ratio": t["bf16_foreach_adamw"] / t["bf16"],
                "cast_cache_ratio": t["bf16_uncached_casts"] / t["bf16"],
            }
        if inductor:
            out["sizes"][name] |= {"inductor_ratio": t["bf16"] / t["bf16_inductor"], "inductor_first_call_s": compile_s}
    if not native:
        name, first = next(iter(out["sizes"].items()))
        out["skipped"] = (
            f"this CPU has no native bf16 ({' or '.join(CPU_BF16_FLAGS)} is not among its flags), so bf16 is "
            f"emulated, {first['ratio']:.2f}x fp32's speed at the {name} size; skipped: {', '.join(skipped) or 'none'} "
            "(emulated bf16 ran them for over 20 minutes) and the bf16 levers; `--precision auto` trains fp32 here"
        )
    out["wall_s"] = time.perf_counter() - started
    return out


def precision_agreement(reference_rows, rows, cfg: RunConfig):
    """Issue 44 item 4, `verify`'s test per n: the seeds of `rows` (trained in another precision) against the seeds
    of `reference_rows` (the shipped fp32 study), on held-out accuracy averaged over the judged difficulties
    (engine.runtime.verify.judged_accuracy) in cfg's trained mode. Per n: both means, the reference's min and max,
    whether every seed of `rows` lies inside them, Mann-Whitney's two-sided p, and within = p >= paper.ALPHA."""
    import pandas as pd

    from engine import paper
    from engine.core import stats
    from engine.runtime.verify import judged_accuracy

    ref, new = judged_accuracy(reference_rows, cfg), judged_accuracy(rows, cfg)
    per_n = []
    for n, here in new.groupby("eval_loops"):
        there = ref[ref["eval_loops"] == n]["value"].to_numpy()
        if not len(there):
            continue
        p = stats.mann_whitney_p(here["value"].to_numpy(), there)
        per_n.append({
            "n": int(n), "seeds": len(here), "reference_seeds": len(there), "mean": here["value"].mean(),
            "reference_mean": there.mean(), "reference_min": there.min(), "reference_max": there.max(),
            "inside": bool(((here["value"] >= there.min()) & (here["value"] <= there.max())).all()),
            "mann_whitney_p": p, "within": bool(p >= paper.ALPHA),
        })  # fmt: skip
    return pd.DataFrame(per_n)


def format_precision_report(result: dict) -> str:
    lines = [
        f"{result['cpu_model'] or 'this CPU'} ({result['threads']} threads), flags "
        f"{' '.join(result['flags']) or 'none'}; native bf16: {'yes' if result['native_bf16'] else 'no'}; "
        f"load {result['loadavg']}",
        f"matmul peaks: fp32 {result['fp32_peak_gflops']:.0f} GFLOP/s, bf16 {result['bf16_peak_gflops']:.0f} GFLOP/s",
    ]
    if "wall_s" in result:
        lines[0] += f"; the section took {result['wall_s']:.0f} s"
    for name, r in result["sizes"].items():
        levers = (
            f"; levers: math attention {r['attn_math_ratio']:.2f}x, fused AdamW {r['fused_adamw_ratio']:.2f}x, weights "
            f"cast once per step {r['cast_cache_ratio']:.2f}x"
            if "attn_math_ratio" in r
            else ""
        )
        lines.append(
            f"{name} ({r['params']:,} parameters, {r['seeds']} seeds): fp32 {r['fp32_step_s'] * 1e3:.0f} ms/step "
            f"({r['fp32_gflops']:.1f} GFLOP/s, {r['fp32_share_of_fp32_peak']:.0%} of fp32 peak), bf16 "
            f"{r['bf16_step_s'] * 1e3:.0f} ms/step ({r['bf16_gflops']:.1f} GFLOP/s, "
            f"{r['bf16_share_of_bf16_peak']:.0%} of bf16 peak): ratio {r['ratio']:.2f}x{levers}"
            + (
                f", Inductor {r['inductor_ratio']:.2f}x (first call {r['inductor_first_call_s']:.0f} s)"
                if "inductor_ratio" in r
                else ""
            )  # fmt: skip
            + f"; load {r['loadavg']}"
        )
    if "skipped" in result:
        lines.append(result["skipped"])
    return "\n".join(lines)


def format_report_pages(result: dict) -> str:
    lines = []
    for page, t in result.get("pages", {}).items():
        heavy = lambda names: f" (imports {', '.join(names)})" if names else " (nothing heavy imported)"  # noqa: E731
        cached = ""
        if "cold_cached_s" in t:
            cached = f"; with its verdicts cached on disk {t['cold_cached_s']:.2f} s"
            cached += heavy(t.get("cold_cached_heavy_imports"))
        line = f"page {page}: cold {t['cold_s']:.2f} s{heavy(t.get('heavy_imports'))}, warm {t['warm_s']:.2f} s"
        lines.append(line + cached)
    return "\n".join(lines)


if __name__ == "__main__":  # the page timings alone: python -m engine.runtime.bench pages [RESULTS] [--json]
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engine.runtime.bench", description="dashboard page timings")
    parser.add_argument("what", choices=["pages"])
    parser.add_argument("results", nargs="?", default=os.environ.get("LOOPSCOPE_RESULTS", "cached_results"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    pages = {"pages": bench_pages(Path(args.results))}
    print(json.dumps(pages, indent=1) if args.json else format_report_pages(pages))
