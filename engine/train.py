"""Training at the trained loop count, many seeds at once.

A group of seeds trains as one ensemble (engine.model's leading member dimension): one batched
forward and backward, one AdamW over stacked weights. Every piece that could couple seeds is kept
per member: initial weights (own generator), data (own generator), loss (summed, so each member's
gradient is its own), gradient clipping (per-member norm). AdamW is elementwise, so a member's
update does not see its neighbours either.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from engine import tasks
from engine.model import LoopedLM, build
from engine.presets import RunConfig


@dataclass
class TrainResult:
    model: LoopedLM  # the trained ensemble, one member per seed, on the CPU
    losses: torch.Tensor  # (steps, S) training loss of each member at each step
    wall_s: float
    device: str


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is visible; use --device cpu.")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}.")
    return device


def lr_lambda(cfg: RunConfig) -> Callable[[int], float]:
    """Linear warmup, then cosine decay to min_lr_ratio of the peak."""
    t = cfg.train

    def factor(step: int) -> float:
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def member_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each member over its supervised positions (and readout steps).

    logits (k, S, B, T, V), targets (S, B, T) -> (S,)
    """
    k, S = logits.shape[:2]
    tgt = targets.expand(k, *targets.shape)
    ce = F.cross_entropy(logits.float().flatten(0, -2), tgt.flatten(), ignore_index=tasks.IGNORE, reduction="none")
    ce = ce.view(k, S, -1).transpose(0, 1).flatten(1)  # (S, k*B*T)
    counts = (tgt != tasks.IGNORE).transpose(0, 1).flatten(1).sum(1)
    return ce.sum(1) / counts


def clip_per_member(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ applied to each member separately; returns the (S,) pre-clip norms."""
    sq = torch.stack([p.grad.float().pow(2).flatten(1).sum(1) for p in params]).sum(0)
    norms = sq.sqrt()
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(coef.view(-1, *[1] * (p.dim() - 1)).to(p.grad.dtype))
    return norms


def train_group(cfg: RunConfig, seeds: list[int], device: str = "cpu", progress: bool = True) -> TrainResult:
    device = resolve_device(device)
    t0 = time.perf_counter()
    model = build(cfg.model, seeds).to(device)
    decay = [p for p in model.parameters() if p.dim() == 3]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() != 3]  # RMSNorm gains
    t = cfg.train
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.lr,
        betas=(0.9, 0.95),
        foreach=True,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    generators = [tasks.train_generator(s) for s in seeds]
    schedule = tasks.difficulty_schedule(cfg.task, t.steps)
    params = list(model.parameters())
    losses = torch.empty(t.steps, len(seeds))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")

    bar = tqdm(range(t.steps), desc=f"train {cfg.task.name} x{len(seeds)} seeds", disable=not progress)
    for step in bar:
        batches = [tasks.sample(cfg.task, schedule[step], t.batch_size, g) for g in generators]
        tokens = torch.stack([b.tokens for b in batches]).to(device, non_blocking=True)
        targets = torch.stack([b.targets for b in batches]).to(device, non_blocking=True)
        with autocast:
            out = model(tokens, all_positions=True, readout_steps="all" if t.loss_over_steps else "last")
        loss = member_losses(out.logits, targets)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # each member's gradient is the gradient of its own loss
        clip_per_member(params, t.grad_clip)
        opt.step()
        sched.step()
        losses[step] = loss.detach().float().cpu()
        if step % 50 == 0 or step == t.steps - 1:
            bar.set_postfix(loss=f"{losses[step].mean():.4f}")
    return TrainResult(model.cpu(), losses, time.perf_counter() - t0, device)
