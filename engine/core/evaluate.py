"""Accuracy versus depth from one forward pass of n_max loops.

For every (member, difficulty, loop step n) we record, on the fixed evaluation set:
  accuracy          greedy answer (argmax over the whole vocabulary) equals the label
  choice_accuracy   the larger of the two answer logits ("0" vs "1") is the label's
  top_token_share   share of the most frequent predicted token ("the head commits to one token")
  option_rate       share of greedy predictions that are one of the two answers ("0" or "1")
  top_token         that token's id (engine.core.tasks.VOCAB names it)
  margin            mean log p(right answer) - log p(wrong answer) under the readout's softmax: the difference of
                    the two answer logits, unbounded (a confident wrong answer is below zero; docs/design.md §10)
  norm_pre          mean ||Block(h_{t-1})|| at the answer position, before the boundary
  norm_post         mean ||h_t||, the state handed to step t+1

Mode `rescale` (model.py) takes each member's per-step scalars, (n_max, S); state_scales measures them.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from engine.core import tasks
from engine.core.model import LoopedLM
from engine.core.tasks import TaskConfig

METRICS = (
    "accuracy",
    "choice_accuracy",
    "top_token_share",
    "option_rate",
    "top_token",
    "norm_pre",
    "norm_post",
    "margin",
)


def _one(model: LoopedLM, i: int) -> LoopedLM:
    return model.member(i) if model.members > 1 else model


def batched(model: LoopedLM) -> bool:
    """Whether step_metrics evaluates the whole group in one forward: on a GPU ($LOOPSCOPE_EVAL_BATCHED=0 or 1
    overrides; the CPU keeps one member at a time, as every shipped row was computed)."""
    env = os.environ.get("LOOPSCOPE_EVAL_BATCHED")
    return env == "1" if env in ("0", "1") else next(model.parameters()).is_cuda


@contextmanager
def tf32():
    """TF32 matmuls and convolutions on a GPU inside the block (fp32 elsewhere): the evaluation's precision there."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@torch.no_grad()
def step_metrics(
    model: LoopedLM, batch: tasks.Batch, n_max: int, boundary: str, chunk: int = 256, scales: Tensor | None = None
) -> dict[str, Tensor]:
    """Each metric as an (n_max, S) tensor. On the CPU members are evaluated one at a time: batched kernels round
    differently for different ensemble sizes, and a run's rows must not depend on what shares its batch. On a GPU
    the whole group is one forward (batched(): one launch per op for all members, under TF32 matmuls); its rows are
    reproducible for the group, which the config fixes (RunConfig.group), as its training is."""
    if batched(model):
        with tf32():
            return _member_metrics(model, batch, n_max, boundary, chunk, scales)
    cut = lambda i: None if scales is None else scales[:, i : i + 1]  # noqa: E731
    per_member = [_member_metrics(_one(model, i), batch, n_max, boundary, chunk, cut(i)) for i in range(model.members)]
    return {name: torch.cat([m[name] for m in per_member], 1) for name in per_member[0]}


@torch.no_grad()
def state_scales(model: LoopedLM, task: TaskConfig, n_max: int, examples: int = 256, seed: int = 0) -> Tensor:
    """The scalars of mode `rescale`: per member and step t = 1..n_max, the mean RMS of the state before the
    boundary, Block(h_{t-1}), over every position of `examples` training items per training difficulty (the
    same items for every member, drawn as training draws them: never a held-out one), run in `norm` mode.
    Returns (n_max, S). The boundary norm sees that state once per step; a hook on it reads it."""
    g = torch.Generator().manual_seed(tasks.derive_seed("state-scales", task.name, seed))
    batches = [tasks.train_batch(task, d, examples, g).tokens for d in task.train_difficulties]
    device, out, seen = next(model.parameters()).device, [], []
    for i in range(model.members):
        one = _one(model, i)
        hook = one.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0].float().pow(2).mean(-1)))
        try:
            per_difficulty = []
            for tokens in batches:
                seen.clear()
                one(tokens[None].to(device), n_max, "norm", readout_steps="last")
                assert len(seen) == n_max, "the boundary norm runs once per loop step"
                per_difficulty.append(torch.stack([ms.sqrt().mean() for ms in seen]))
        finally:
            hook.remove()
        out.append(torch.stack(per_difficulty).mean(0).cpu())
    return torch.stack(out, 1)


def _member_metrics(model: LoopedLM, batch: tasks.Batch, n_max: int, boundary: str, chunk: int, scales=None):
    """step_metrics of a model of S members on the same items: each metric as an (n_max, S) tensor."""
    V, S = model.cfg.vocab_size, model.members
    device = next(model.parameters()).device
    preds, choice, margin, pre, post = [], [], [], [], []
    for start in range(0, len(batch.answers), chunk):
        tokens = batch.tokens[start : start + chunk].to(device)
        tokens = tokens[None].expand(S, *tokens.shape)
        out = model(tokens, n_max, boundary, scales=None if scales is None else scales.to(device))
        logits = out.logits[:, :, :, -1].float()  # (n, S, B, V)
        preds.append(logits.argmax(-1))
        options = logits[..., [tasks.ZERO, tasks.ONE]]  # (n, S, B, 2)
        choice.append(options.argmax(-1))
        right = batch.answers[start : start + chunk].to(device).float() * 2 - 1  # +1 where the answer is "1"
        margin.append((options[..., 1] - options[..., 0]) * right)  # log p(right) - log p(wrong): logits' difference
        pre.append(out.norm_pre)
        post.append(out.norm_post)
    preds, choice = torch.cat(preds, -1).cpu(), torch.cat(choice, -1).cpu()  # (n, S, B)
    answers = batch.answers  # token ids of "0"/"1" equal the bits
    counts = torch.nn.functional.one_hot(preds, V).sum(-2)  # (n, S, V)
    top_count, top_token = counts.max(-1)
    return {
        "accuracy": (preds == answers).float().mean(-1),
        "choice_accuracy": (choice == answers).float().mean(-1),
        "top_token_share": top_count.float() / preds.shape[-1],
        "option_rate": ((preds == tasks.ZERO) | (preds == tasks.ONE)).float().mean(-1),
        "top_token": top_token.float(),
        "norm_pre": torch.cat(pre, -1).float().mean(-1).cpu(),
        "norm_post": torch.cat(post, -1).float().mean(-1).cpu(),
        "margin": torch.cat(margin, -1).mean(-1).cpu(),
    }


def evaluate(
    model: LoopedLM,
    task: TaskConfig,
    n_max: int,
    boundary: str,
    loops: list[int] | None = None,
    difficulties: tuple[int, ...] | None = None,
    progress: bool = True,
    scales: Tensor | None = None,
) -> pd.DataFrame:
    """Tidy rows (member, difficulty, eval_loops, metric, value) for the requested loop counts (`scales`: the
    (n_max, S) per-step scalars of mode `rescale`)."""
    loops = loops or list(range(1, n_max + 1))
    difficulties = difficulties or task.eval_difficulties
    frames = []
    for d in tqdm(difficulties, desc=f"eval {task.name} n<={n_max} {boundary}", disable=not progress):
        metrics = step_metrics(model, tasks.eval_set(task, d), n_max, boundary, scales=scales)
        for name, values in metrics.items():  # values: (n_max, S)
            n_idx, member = torch.meshgrid(torch.arange(n_max), torch.arange(model.members), indexing="ij")
            frames.append(
                pd.DataFrame(
                    {
                        "member": member.flatten().numpy(),
                        "difficulty": d,
                        "eval_loops": (n_idx + 1).flatten().numpy(),
                        "metric": name,
                        "value": values.flatten().double().numpy(),
                        "split": tasks.split_of(task, d),
                    }
                )
            )
    rows = pd.concat(frames, ignore_index=True)
    return rows[rows["eval_loops"].isin(loops)].reset_index(drop=True)
