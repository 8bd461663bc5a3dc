"""One input through the loop: what the readout says at every loop step n = 1..N, in each mode a run can be run in.

One forward pass of N loops per mode reads out every step (engine.core.model.LoopedLM). Per (mode, n) a row holds:
  answer      the larger of the two answer logits, "0" or "1" (evaluate.py's choice_accuracy counts it right or not)
  correct     whether that answer is the input's label
  top_token   the most likely token over the whole vocabulary (engine.core.tasks.VOCAB names it; accuracy's greedy
              prediction, which need not be an answer token)
  top_share   its probability under the readout's softmax
  margin      log p(right answer) - log p(wrong answer): the difference of the two answer logits (evaluate.py)
  norm_pre    ||Block(h_{n-1})|| at the answer position, before the boundary
  norm_post   ||h_n||, the state handed to step n+1
A mode's label is the trained mode (`norm`, `none`) or `trained->run` for a surgery (`norm->none`, `none->norm`,
`norm->rescale`), as the stored rows label them (engine.experiments.runs.boundary_label).
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from engine.core import tasks
from engine.core.model import BOUNDARIES, LoopedLM
from engine.core.tasks import TaskConfig
from engine.errors import UsageError

COLUMNS = ("mode", "n", "answer", "correct", "top_token", "top_share", "margin", "norm_pre", "norm_post")


class BadInput(UsageError, ValueError):
    """An input the run's task does not take; the message says what is wrong and what to type instead."""


def run_modes(trained: str, rescale: bool) -> dict[str, str]:
    """{label: run mode} a model trained in `trained` can be run in: as trained, with the other boundary (the
    surgery), and for a norm-trained model with stored rescale scalars (`rescale`), the rescale surgery."""
    other = next(b for b in BOUNDARIES if b != trained)
    modes = {trained: trained, f"{trained}->{other}": other}
    return modes | ({f"{trained}->rescale": "rescale"} if rescale and trained == "norm" else {})


def lengths(task: TaskConfig) -> list[int]:
    """The parity lengths a run takes: those it was trained or evaluated at."""
    return sorted({*task.train_difficulties, *task.eval_difficulties})


def span(values: list[int]) -> str:
    return (
        f"{values[0]}–{values[-1]}" if values == list(range(values[0], values[-1] + 1)) else ", ".join(map(str, values))
    )


def parity_input(text: str, task: TaskConfig) -> tuple[Tensor, int]:
    """A typed bit string (spaces ignored) as the task's tokens, `bits =`, and its label; BadInput if it is not one
    of the run's lengths or holds anything but 0 and 1."""
    if task.name != "parity":
        raise BadInput(f"a typed bit string is a parity input; this run's task is {task.name}: pick one of its items.")
    bits, allowed = "".join(str(text).split()), lengths(task)
    example = "1011001011"[: allowed[0]].ljust(allowed[0], "0")
    if not bits or set(bits) - {"0", "1"}:
        what = "is empty" if not bits else f"holds {len([c for c in bits if c not in '01'])} character(s) not 0 or 1"
        raise BadInput(f"The input {what}: type a string of {span(allowed)} bits, e.g. {example}.")
    if len(bits) not in allowed:
        raise BadInput(f"The input has {len(bits)} bits; this run takes {span(allowed)} (its trained and evaluated "
                       f"lengths): type one of those, e.g. {example}.")  # fmt: skip
    values = [int(b) for b in bits]
    return torch.tensor([*values, tasks.EQ]), sum(values) % 2


def eval_item(task: TaskConfig, difficulty: int, index: int) -> tuple[Tensor, int]:
    """Item `index` of the task's fixed evaluation set at `difficulty` (tasks.eval_set): its tokens and label."""
    if difficulty not in task.eval_difficulties:
        raise BadInput(f"difficulty {difficulty} is not evaluated in this run; pick one of {span(lengths(task))}.")
    batch = tasks.eval_set(task, difficulty)
    if not 0 <= index < len(batch.answers):
        raise BadInput(f"item {index} is not in the set: it has items 0–{len(batch.answers) - 1}.")
    return batch.tokens[index], int(batch.answers[index])


def origin(task: TaskConfig, tokens: Tensor) -> str:
    """Where an input lies against training: beyond its range, held out (never a training item), or seen."""
    difficulty = len(tokens) - 1 if task.name == "parity" else (len(tokens) - 2) // (3 * task.chains) - 1
    if tasks.split_of(task, difficulty) == "beyond":
        return "beyond the training range"
    if tasks.holds_out(task, difficulty) and bool(tasks.is_heldout(task, tokens[None])[0]):
        return "held out: training never draws it"
    return "inside the training range, an item training can draw"


@torch.no_grad()
def inspect(model: LoopedLM, tokens: Tensor, label: int, n_max: int, modes: dict[str, str], scales=None):
    """Tidy rows (COLUMNS) for one input of a one-member model, one forward of n_max loops per mode (modes:
    run_modes' {label: run mode}; scales: the (>= n_max,) per-step scalars mode `rescale` needs)."""
    if model.members != 1:
        raise ValueError(f"inspect takes a one-member model (LoopedLM.member(i)); this one has {model.members}.")
    device = next(model.parameters()).device
    frames = []
    for name, mode in modes.items():
        s = None if mode != "rescale" else torch.as_tensor(scales)[:n_max, None].to(device)
        out = model(tokens.to(device)[None, None], n_max, mode, scales=s)
        logits = out.logits[:, 0, 0, -1].float().cpu()  # (n, V)
        share, top = logits.softmax(-1).max(-1)
        diff = logits[:, tasks.ONE] - logits[:, tasks.ZERO]  # > 0: "1" is the answer
        answer = torch.stack([logits[:, tasks.ZERO], logits[:, tasks.ONE]], -1).argmax(-1)  # ties: "0", as evaluate
        frames.append(
            pd.DataFrame({
                "mode": name,
                "n": range(1, n_max + 1),
                "answer": [tasks.VOCAB[a] for a in answer.tolist()],
                "correct": (answer == label).numpy(),
                "top_token": [tasks.VOCAB[t] for t in top.tolist()],
                "top_share": share.double().numpy(),
                "margin": (diff * (1 if label else -1)).double().numpy(),
                "norm_pre": out.norm_pre[:, 0, 0].double().cpu().numpy(),
                "norm_post": out.norm_post[:, 0, 0].double().cpu().numpy(),
            })
        )  # fmt: skip
    return pd.concat(frames, ignore_index=True)[list(COLUMNS)]
