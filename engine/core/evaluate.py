"""Accuracy versus depth from one forward pass of n_max loops.

For every (member, difficulty, loop step n) we record, on the fixed evaluation set:
  accuracy          greedy answer (argmax over the whole vocabulary) equals the label
  choice_accuracy   the larger of the two answer logits ("0" vs "1") is the label's
  top_token_share   share of the most frequent predicted token ("the head commits to one token")
  option_rate       share of greedy predictions that are one of the two answers ("0" or "1")
  top_token         that token's id (engine.core.tasks.VOCAB names it)
  norm_pre          mean ||Block(h_{t-1})|| at the answer position, before the boundary
  norm_post         mean ||h_t||, the state handed to step t+1
"""

from __future__ import annotations

import pandas as pd
import torch
from tqdm.auto import tqdm

from engine.core import tasks
from engine.core.model import LoopedLM
from engine.core.tasks import TaskConfig

METRICS = ("accuracy", "choice_accuracy", "top_token_share", "option_rate", "top_token", "norm_pre", "norm_post")


@torch.no_grad()
def step_metrics(
    model: LoopedLM, batch: tasks.Batch, n_max: int, boundary: str, chunk: int = 256
) -> dict[str, torch.Tensor]:
    """Each metric as an (n_max, S) tensor. Members are evaluated one at a time: batched kernels round
    differently for different ensemble sizes, and a run's rows must not depend on what shares its batch."""
    per_member = [_member_metrics(model.member(i) if model.members > 1 else model, batch, n_max, boundary, chunk)
                  for i in range(model.members)]  # fmt: skip
    return {name: torch.cat([m[name] for m in per_member], 1) for name in per_member[0]}


def _member_metrics(model: LoopedLM, batch: tasks.Batch, n_max: int, boundary: str, chunk: int):
    """step_metrics of a one-member model: each metric as an (n_max, 1) tensor."""
    V = model.cfg.vocab_size
    device = next(model.parameters()).device
    preds, choice, pre, post = [], [], [], []
    for start in range(0, len(batch.answers), chunk):
        tokens = batch.tokens[start : start + chunk].to(device)
        out = model(tokens[None], n_max, boundary)
        logits = out.logits[:, :, :, -1].float()  # (n, 1, B, V)
        preds.append(logits.argmax(-1))
        choice.append(logits[..., [tasks.ZERO, tasks.ONE]].argmax(-1))
        pre.append(out.norm_pre)
        post.append(out.norm_post)
    preds, choice = torch.cat(preds, -1).cpu(), torch.cat(choice, -1).cpu()  # (n, 1, B)
    answers = batch.answers  # token ids of "0"/"1" equal the bits
    counts = torch.nn.functional.one_hot(preds, V).sum(-2)  # (n, 1, V)
    top_count, top_token = counts.max(-1)
    return {
        "accuracy": (preds == answers).float().mean(-1),
        "choice_accuracy": (choice == answers).float().mean(-1),
        "top_token_share": top_count.float() / preds.shape[-1],
        "option_rate": ((preds == tasks.ZERO) | (preds == tasks.ONE)).float().mean(-1),
        "top_token": top_token.float(),
        "norm_pre": torch.cat(pre, -1).float().mean(-1).cpu(),
        "norm_post": torch.cat(post, -1).float().mean(-1).cpu(),
    }


def evaluate(
    model: LoopedLM,
    task: TaskConfig,
    n_max: int,
    boundary: str,
    loops: list[int] | None = None,
    difficulties: tuple[int, ...] | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Tidy rows (member, difficulty, eval_loops, metric, value) for the requested loop counts."""
    loops = loops or list(range(1, n_max + 1))
    difficulties = difficulties or task.eval_difficulties
    frames = []
    for d in tqdm(difficulties, desc=f"eval {task.name} n<={n_max} {boundary}", disable=not progress):
        metrics = step_metrics(model, tasks.eval_set(task, d), n_max, boundary)
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
