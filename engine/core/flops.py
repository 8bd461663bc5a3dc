"""Model FLOPs of a forward, a training step, a training run and an evaluation (the bench's MFU figures and the
fan-outs' cost model: the costliest job goes first)."""

from __future__ import annotations

from functools import cache

import torch

from engine.core import tasks
from engine.core.model import ModelConfig
from engine.core.presets import RunConfig
from engine.core.train import loop_schedule


def forward_flops(cfg: ModelConfig, seq: int, loops: int, readout_positions: int) -> float:
    """Matmul and attention FLOPs of one forward over one sequence."""
    d, f = cfg.d_model, cfg.d_ff
    per_token_layer = 2 * (4 * d * d + 3 * d * f) + 2 * 2 * d * (seq + 1) / 2  # projections + causal attention
    return seq * cfg.layers_per_block * loops * per_token_layer + 2 * d * cfg.vocab_size * readout_positions


def train_step_flops(run: RunConfig, seq: int, loops: int | None = None) -> float:
    """Forward and backward (2x forward) for one batch of one member; the loss reads every position."""
    return 3 * run.train.batch_size * forward_flops(run.model, seq, loops or run.model.trained_loops, seq)


@cache
def seq_len(task: tasks.TaskConfig, difficulty: int) -> int:
    return tasks.sample(task, difficulty, 2, torch.Generator().manual_seed(0)).tokens.shape[-1]


def training_flops(run: RunConfig, seeds: int, steps: int | None = None) -> float:
    """Forward + backward FLOPs of training `seeds` models, following the preset's difficulty and loop schedules."""
    steps = steps or run.train.steps
    schedule = zip(tasks.difficulty_schedule(run.task, steps), loop_schedule(run.train_loops, steps), strict=True)
    return seeds * sum(train_step_flops(run, seq_len(run.task, d), n) for d, n in schedule)


def eval_flops(run: RunConfig, seeds: int, n_max: int | None = None) -> float:
    """One pass to n_max over every evaluation set, reading out the answer position at every step."""
    n = n_max or run.max_eval_loops
    sets = run.task.eval_difficulties
    return seeds * run.task.eval_examples * sum(forward_flops(run.model, seq_len(run.task, d), n, n) for d in sets)


def refit_flops(run: RunConfig, targets, schedule, seeds: int) -> float:
    """E3's refit of `targets` over `schedule` (refit steps with an evaluation), estimated: the head alone needs no
    backward through the frozen loop (about a forward a step), a target with a layer of the loop a full backward
    (about a training step); every scheduled step is one evaluation of the refit model, plus the original and the
    model without the norm."""
    steps, task = schedule[-1], run.task
    per_step = sum(train_step_flops(run, seq_len(task, d)) for d in task.train_difficulties) / len(
        task.train_difficulties
    )
    train = sum(steps * per_step / (3 if t == "head" else 1) for t in targets)
    evals = (2 + len(targets) * (len(schedule) - 1)) * eval_flops(run, 1)
    return seeds * (train + evals)
