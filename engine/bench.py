"""`loopscope bench`: every fast path against its baseline, measured in one run on this machine.

Each figure is a ratio of two timings taken back to back in the same process, so a busy machine
slows both sides alike. FLOPs are counted from the config (matmuls and attention, loops included).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from engine import tasks
from engine.model import ModelConfig, build
from engine.presets import RunConfig, cpu, paper
from engine.train import member_losses, train_group

GOALS = {"one_pass": 10.0, "group_training": 3.0, "mfu_cpu": 0.5, "mfu_paper": 0.8, "generation_share": 0.05}


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    fn()  # warm-up: allocator, kernels, caches
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def matmul_peak(n: int = 2048, repeat: int = 5) -> float:
    """This machine's fp32 matmul throughput (FLOP/s) at a size that saturates it."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / timed(lambda: a @ b, repeat)


def forward_flops(cfg: ModelConfig, seq: int, loops: int, readout_positions: int) -> float:
    """Matmul and attention FLOPs of one forward over one sequence."""
    d, f = cfg.d_model, cfg.d_ff
    per_token_layer = 2 * (4 * d * d + 3 * d * f) + 2 * 2 * d * (seq + 1) / 2  # projections + causal attention
    return seq * cfg.layers_per_block * loops * per_token_layer + 2 * d * cfg.vocab_size * readout_positions


def train_step_flops(run: RunConfig, seq: int) -> float:
    """Forward and backward (2x forward) for one batch of one member; the loss reads every position."""
    return 3 * run.train.batch_size * forward_flops(run.model, seq, run.model.trained_loops, seq)


def bench_one_pass(run: RunConfig, n_max: int = 24) -> dict:
    model = build(run.model, [0]).eval()
    batch = tasks.eval_set(run.task, max(run.task.train_difficulties))
    x = batch.tokens[None]
    with torch.no_grad():
        one = timed(lambda: model(x, n_max))
        separate = timed(lambda: [model(x, n) for n in range(1, n_max + 1)])
    return {"one_pass_s": one, "separate_s": separate, "ratio": separate / one, "goal": GOALS["one_pass"]}


def bench_group(run: RunConfig, seeds: int = 16, steps: int = 10) -> dict:
    run = replace(run, train=replace(run.train, steps=steps))
    group = train_group(run, list(range(seeds)), progress=False).wall_s
    alone = sum(train_group(run, [s], progress=False).wall_s for s in range(seeds))
    return {"group_s": group, "one_at_a_time_s": alone, "ratio": alone / group, "goal": GOALS["group_training"]}


def bench_mfu(run: RunConfig, peak: float, seeds: int, steps: int = 5) -> dict:
    """Achieved training FLOP/s over the fp32 matmul peak, at the hardest training difficulty."""
    model = build(run.model, list(range(seeds)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    d = max(run.task.train_difficulties)
    batches = [tasks.sample(run.task, d, run.train.batch_size, tasks.train_generator(s)) for s in range(seeds)]
    x, y = torch.stack([b.tokens for b in batches]), torch.stack([b.targets for b in batches])

    def step():
        out = model(x, all_positions=True, readout_steps="last")
        opt.zero_grad(set_to_none=True)
        member_losses(out.logits, y).sum().backward()
        opt.step()

    seconds = timed(step, steps)
    flops = seeds * train_step_flops(run, x.shape[-1])
    return {"step_s": seconds, "flop_per_s": flops / seconds, "mfu": flops / seconds / peak}


def bench_generation(run: RunConfig, seeds: int = 16, steps: int = 20) -> dict:
    """Data generation for a group's step, against the whole step (from the group benchmark)."""
    gens = [tasks.train_generator(s) for s in range(seeds)]
    schedule = tasks.difficulty_schedule(run.task, steps)
    start = time.perf_counter()
    for d in schedule:
        torch.stack([tasks.sample(run.task, d, run.train.batch_size, g).tokens for g in gens])
    per_step = (time.perf_counter() - start) / steps
    return {"generation_s_per_step": per_step}


def run_all(peak: float | None = None, quick: bool = False) -> dict:
    peak = peak or matmul_peak()
    out: dict = {"matmul_peak_gflops": peak / 1e9}
    for task in ("parity", "chain"):
        run = cpu(task)
        group = bench_group(run, seeds=4 if quick else 16, steps=3 if quick else 10)
        gen = bench_generation(run)
        step_s = group["group_s"] / (3 if quick else 10)
        out[task] = {
            "one_pass": bench_one_pass(run),
            "group_training": group,
            "mfu_cpu": bench_mfu(run, peak, seeds=4 if quick else 16, steps=2 if quick else 5),
            "generation_share": gen["generation_s_per_step"] / step_s,
        }
    if not quick:
        out["mfu_paper"] = bench_mfu(paper("parity"), peak, seeds=1, steps=2)
    return out


def format_report(result: dict) -> str:
    lines = [f"fp32 matmul peak: {result['matmul_peak_gflops']:.1f} GFLOP/s"]
    for task in ("parity", "chain"):
        r = result[task]
        lines += [
            f"{task}: one pass of 24 loops vs 24 forwards: {r['one_pass']['ratio']:.1f}x (goal >= 10x)",
            f"{task}: 16 seeds as one group vs one at a time: {r['group_training']['ratio']:.2f}x (goal >= 3x)",
            f"{task}: training FLOP/s / peak (cpu preset): {r['mfu_cpu']['mfu']:.1%} (goal >= 50%)",
            f"{task}: task generation / training step: {r['generation_share']:.1%} (goal <= 5%)",
        ]
    if "mfu_paper" in result:
        lines.append(f"paper preset: training FLOP/s / peak: {result['mfu_paper']['mfu']:.1%} (goal >= 80%)")
    return "\n".join(lines)
