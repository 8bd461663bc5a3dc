"""Readout refit (E3): run norm-trained models without the norm, freeze the loop, refit the readout.

A refit target names the parameters that train; everything else keeps requires_grad False and stays
bit-identical (tested):

    head         lm_head only. The final RMSNorm gain is left frozen: it scales the state just before
                 the head, so Head(g * x) = x @ (diag(g) W) and refitting g as well adds nothing the
                 head cannot express (the readout is Norm + Head; the head is its only free map).
    head+last    lm_head and the block's last layer (index L-1)
    head+first   lm_head and the block's first layer (index 0); beyond the paper
    head+middle  lm_head and the block's middle layer (index L // 2); beyond the paper
    head+last.attn / head+last.mlp
                 lm_head and one half of the last layer: the attention sublayer with its two sandwich
                 norms, or the MLP sublayer with its two. Beyond the paper: with a 1-layer block (the
                 `cpu` preset) first = middle = last, and these halves are what still localises the damage.

A layer of the block is tied across loop steps, so refitting it changes every step that uses it. For
a 1-layer block first = middle = last: `distinct_targets` folds targets that name the same parameters,
and only one of them is computed.

The refit trains in `none` mode at n = T with the loss at the final step over the dense targets (as
in training), on the task's own training stream from a seed derived from ("refit", seed), so refit
data differ from training data. All seeds refit together as one ensemble: own data, per-member
clipping, elementwise AdamW over the refit parameters only. The learning rate warms up and then stays
constant, so the checkpoint at step s does not depend on how long the schedule runs.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from engine import paper
from engine.core import tasks
from engine.core.evaluate import step_metrics
from engine.core.model import LoopedLM
from engine.core.presets import RunConfig
from engine.core.train import adamw, member_losses, optimizer_step, resolve_device

TARGETS = ("head", "head+last", "head+first", "head+middle", "head+last.attn", "head+last.mlp")
SUBLAYERS = {  # parameter-name prefixes of each half of a sandwich layer (engine.core.model.Layer)
    "attn": ("input_layernorm.", "self_attn.", "input_layernorm_2."),
    "mlp": ("post_attention_layernorm.", "mlp.", "post_attention_layernorm_2."),
}
MIN_GAP = paper.MIN_REFIT_GAP  # acc_original - acc_removed below this: nothing to recover, recovery is NaN


@dataclass(frozen=True)
class RefitConfig:
    targets: tuple[str, ...] = TARGETS
    schedule: tuple[int, ...] = (0, 50, 100, 200, 400, 800, 1600)  # refit steps with a checkpoint
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0  # a pure refit: nothing pulls the readout towards zero
    grad_clip: float = 1.0
    batch_size: int = 0  # 0: the run's training batch size

    def __post_init__(self):
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"refit targets must be among {', '.join(TARGETS)}, got {unknown or 'none'}.")
        if list(self.schedule) != sorted(set(self.schedule)) or not self.schedule or self.schedule[0] != 0:
            raise ValueError(f"the refit schedule must start at 0 and increase, got {self.schedule}.")
        if self.lr <= 0 or self.grad_clip <= 0 or self.warmup_steps < 1 or self.batch_size % 2:
            raise ValueError("refit lr, grad_clip and warmup_steps must be positive, batch_size even.")


def layer_index(target: str, layers: int) -> int | None:
    """The block layer a target refits with the head (None for the head alone)."""
    base = target.split(".")[0]
    return {"head": None, "head+last": layers - 1, "head+first": 0, "head+middle": layers // 2}[base]


def part(target: str) -> str | None:
    """The half of the layer a target refits ("attn", "mlp"), or None for the whole layer."""
    return target.split(".")[1] if "." in target else None


def distinct_targets(targets: tuple[str, ...], layers: int) -> dict[str, list[str]]:
    """{computed target: the requested targets that name the same parameters (itself first)}."""
    out: dict[str, list[str]] = {}
    where = lambda t: (layer_index(t, layers), part(t))  # noqa: E731
    for t in targets:
        same = next((c for c in out if where(c) == where(t)), t)
        out.setdefault(same, []).append(t)
    return out


def refit_names(model: LoopedLM, target: str) -> list[str]:
    i, half = layer_index(target, model.cfg.layers_per_block), part(target)
    prefix = () if i is None else tuple(f"layers.{i}.{p}" for p in (SUBLAYERS[half] if half else ("",)))
    return [n for n, _ in model.named_parameters() if n == "lm_head.weight" or n.startswith(prefix)]


@torch.no_grad()
def accuracy_grid(model: LoopedLM, run: RunConfig, n_max: int, boundary: str) -> torch.Tensor:
    """Greedy accuracy (difficulties, n_max, S) on the fixed evaluation sets, one pass per difficulty."""
    grids = [
        step_metrics(model, tasks.eval_set(run.task, d), n_max, boundary)["accuracy"]
        for d in run.task.eval_difficulties
    ]
    return torch.stack(grids)


@dataclass
class RefitResult:
    state: dict[str, torch.Tensor]  # the refit copy's state dict (every member), on the CPU
    names: list[str]  # the parameters that were refit
    grids: dict[int, torch.Tensor]  # refit step (> 0) -> accuracy (difficulties, n_max, S) in none mode
    losses: torch.Tensor  # (steps, S)
    wall_s: float


def refit(
    model: LoopedLM,
    run: RunConfig,
    seeds: list[int],
    target: str,
    cfg: RefitConfig,
    n_max: int,
    device: str = "cpu",
    progress: bool = False,
) -> RefitResult:
    """Refit one target of a copy of `model` (left untouched); evaluate at every scheduled step > 0."""
    device, t0 = resolve_device(device), time.perf_counter()
    model = copy.deepcopy(model).to(device)
    names = refit_names(model, target)
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = adamw([p for p in params if p.dim() == 3], [p for p in params if p.dim() != 3], cfg.lr, cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps))
    steps, batch = cfg.schedule[-1], cfg.batch_size or run.train.batch_size
    generators = [tasks.train_generator(tasks.derive_seed("refit", s)) for s in seeds]
    difficulty = tasks.difficulty_schedule(run.task, steps)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
    losses, grids = torch.empty(steps, len(seeds), device=device), {}  # on the device until the end: no host wait
    for step in tqdm(range(1, steps + 1), desc=f"refit {run.task.name} {target}", disable=not progress):
        batches = [tasks.train_batch(run.task, difficulty[step - 1], batch, g) for g in generators]
        tokens = torch.stack([b.tokens for b in batches]).to(device)
        targets = torch.stack([b.targets for b in batches]).to(device)
        with autocast:
            out = model(tokens, run.model.trained_loops, "none", all_positions=True, readout_steps="last")
        loss = member_losses(out.logits, targets)
        optimizer_step(loss.sum(), opt, sched, params, cfg.grad_clip)
        losses[step - 1] = loss.detach().float()
        if step in cfg.schedule:
            grids[step] = accuracy_grid(model, run, n_max, "none")
    state = {n: p.detach().cpu() for n, p in model.state_dict().items()}
    return RefitResult(state, names, grids, losses.cpu(), time.perf_counter() - t0)


def recovery(acc_refit, acc_removed, acc_original, min_gap: float = MIN_GAP) -> np.ndarray:
    """(refit - removed) / (original - removed), elementwise; NaN where original - removed < min_gap."""
    refit_, removed, original = (np.asarray(a, dtype=float) for a in (acc_refit, acc_removed, acc_original))
    gap = original - removed
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(gap >= min_gap, (refit_ - removed) / gap, np.nan)
