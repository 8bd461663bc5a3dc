"""Balanced binary prompt probe: read every loop step of a pretrained looped LM on two tasks.

Tasks (labels exactly balanced, prompts deterministic from the seed):

    chain   "x = 1\\ny = not x\\nz = y\\nWhat is z? Answer 0 or 1. Answer:"  -> " 0" | " 1"
            difficulty = k hops after the first assignment; statements shuffled.
    parity  "Bits: 1 0 1 1. Is the number of 1s even or odd? Answer:"    -> " even" | " odd"
            difficulty = number of bits.

`probe` batches prompts with left padding, runs `model.loop_forward` once per batch and reports,
per loop step, greedy and forced-choice accuracy, the most frequent greedy token, the mean state
norms before/after the boundary and the mean exit probability. Where a tokenizer splits the space
off a digit (" 0" -> " ", "0"), `fit_prompts` ends the prompt with that space so that the next token
is the answer.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import NamedTuple

import pandas as pd
import torch

TASKS = ("chain", "parity")
DEFAULT_DIFFICULTY = {"chain": 3, "parity": 6}
VARIABLES = "abcdefghjkmnpqrstuvwxyz"  # no i, l, o (look like digits)
CHAIN_OPTIONS = (" 0", " 1")
PARITY_OPTIONS = (" even", " odd")
COLUMNS = [
    "step", "n_loops", "boundary", "n_prompts", "greedy_acc", "forced_acc", "forced_margin",
    "option_rate", "top_token", "top_token_id", "top_share", "norm_pre", "norm_post", "exit_prob", "exit_step",
]  # fmt: skip
READOUTS = ("final", "released")  # the answer at loop step n itself, or where the released early exit stops


class ProbePrompt(NamedTuple):
    prompt: str
    answer: str  # one of options
    options: tuple[str, str]  # (label 0, label 1)


def _chain_prompt(rng: random.Random, hops: int, label: int) -> ProbePrompt:
    names = rng.sample(VARIABLES, hops + 1)
    negations = [rng.random() < 0.5 for _ in range(hops)]
    start = label ^ (sum(negations) % 2)  # value of the first variable that yields `label`
    lines = [f"{names[0]} = {start}"]
    for i, neg in enumerate(negations, start=1):
        lines.append(f"{names[i]} = {'not ' if neg else ''}{names[i - 1]}")
    rng.shuffle(lines)
    text = "\n".join(lines) + f"\nWhat is {names[-1]}? Answer 0 or 1. Answer:"
    return ProbePrompt(text, CHAIN_OPTIONS[label], CHAIN_OPTIONS)


def _parity_prompt(rng: random.Random, n_bits: int, label: int) -> ProbePrompt:
    bits = [rng.randrange(2) for _ in range(n_bits)]
    if sum(bits) % 2 != label:  # label 0 = even, 1 = odd
        bits[rng.randrange(n_bits)] ^= 1
    text = f"Bits: {' '.join(map(str, bits))}. Is the number of 1s even or odd? Answer:"
    return ProbePrompt(text, PARITY_OPTIONS[label], PARITY_OPTIONS)


def make_prompts(task: str, n: int, seed: int = 0, difficulty: int | None = None) -> list[ProbePrompt]:
    """`n` prompts (n even): exactly n/2 with each answer, in a seed-shuffled order."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if n <= 0 or n % 2:
        raise ValueError(f"n must be a positive even number for exactly balanced labels, got {n}")
    difficulty = DEFAULT_DIFFICULTY[task] if difficulty is None else int(difficulty)
    if task == "chain" and not 0 <= difficulty < len(VARIABLES):
        raise ValueError(f"chain difficulty (hops) must be in [0, {len(VARIABLES) - 1}]")
    if task == "parity" and difficulty < 1:
        raise ValueError("parity difficulty (bits) must be >= 1")
    rng = random.Random(f"{task}:{seed}:{difficulty}")
    labels = [0, 1] * (n // 2)
    rng.shuffle(labels)
    make = _chain_prompt if task == "chain" else _parity_prompt
    return [make(rng, difficulty, label) for label in labels]


def answer_token_id(tokenizer, prompt: str, option: str) -> int:
    """First token of `option` as it is tokenized right after `prompt`."""
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = tokenizer(prompt + option, add_special_tokens=False)["input_ids"]
    if len(full) > len(p) and full[: len(p)] == p:
        return full[len(p)]
    return tokenizer(option, add_special_tokens=False)["input_ids"][0]  # merged across the boundary


def fit_prompt(tokenizer, pr: ProbePrompt) -> ProbePrompt:
    """Move the options' shared leading whitespace into the prompt when only that tells them apart.

    Tokenizers that split digits from a preceding space (e.g. StarCoder/SmolLM-style, as in Ouro) encode
    " 0" and " 1" as [" ", "0"] and [" ", "1"]: both options then start with the space token and the next
    token after "Answer:" is the space, whatever the answer. Ending the prompt with that space makes the
    next token the answer itself. Prompts whose options already differ in their first token are returned
    unchanged.
    """
    a, b = (answer_token_id(tokenizer, pr.prompt, o) for o in pr.options)
    if a != b:
        return pr
    k = 0
    while all(k < len(o) for o in pr.options) and pr.options[0][k] == pr.options[1][k] and pr.options[0][k].isspace():
        k += 1
    if k == 0 or any(k == len(o) for o in pr.options):
        return pr
    return ProbePrompt(pr.prompt + pr.options[0][:k], pr.answer[k:], (pr.options[0][k:], pr.options[1][k:]))


def fit_prompts(tokenizer, prompts: list[ProbePrompt]) -> list[ProbePrompt]:
    return [fit_prompt(tokenizer, pr) for pr in prompts]


def option_token_ids(tokenizer, prompts: list[ProbePrompt]) -> torch.Tensor:
    """(N, 2) first-token ids of each prompt's two options; raises if they coincide."""
    ids = []
    for pr in prompts:
        a, b = (answer_token_id(tokenizer, pr.prompt, o) for o in pr.options)
        if a == b:
            tok = tokenizer.convert_ids_to_tokens(a)
            raise ValueError(
                f"options {pr.options!r} start with the same token {tok!r} (id {a}) under this "
                "tokenizer, so the probe cannot tell them apart from one next-token prediction; "
                "choose options whose first tokens differ (e.g. move a shared leading space into "
                "the prompt)."
            )
        ids.append((a, b))
    return torch.tensor(ids, dtype=torch.long)


@torch.inference_mode()
def probe(
    model,
    tokenizer,
    prompts: list[ProbePrompt],
    n_loops: int | None = None,
    boundary: str = "norm",
    batch_size: int = 16,
    progress=None,
    readout: str = "final",
) -> pd.DataFrame:
    """One row per loop step 1..n with the columns in COLUMNS (shares and accuracies in [0, 1]).

    readout "final" reads the answer at step n itself (the loop run n times: what the study measures);
    "released" reads it at the step the released forward run with n loop steps reads (modeling.
    released_exit_steps with the config's early_exit_threshold and early_exit_step, in the model's dtype on
    its device, over the batch's positions); `exit_step` is the mean step read. Norms are always those of
    step n. Prompts go through `fit_prompts` first. `progress`, if given, is called with the number of
    prompts of each batch once that batch is done.
    """
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}.")
    if not prompts:
        raise ValueError("no prompts")
    prompts = fit_prompts(tokenizer, prompts)
    opts = option_token_ids(tokenizer, prompts)
    correct = torch.tensor([pr.options.index(pr.answer) for pr in prompts])
    device = next(model.parameters()).device
    saved = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        preds, option_logits, pre, post, exit_p, read_at = [], [], [], [], [], []
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            enc = tokenizer([pr.prompt for pr in batch], return_tensors="pt", padding=True)
            out = model.loop_forward(enc["input_ids"].to(device), enc["attention_mask"].to(device), n_loops, boundary)
            lg = out.logits.float().cpu()  # (n, b, V), reduced at once to what we report
            steps = torch.arange(lg.shape[0])[:, None].expand(-1, lg.shape[1])  # (n, b): the step each n reads
            if readout == "released":  # computed in the forward, on the model's device
                steps = out.released_steps.cpu() - 1
                lg = lg.gather(0, steps[..., None].expand(-1, -1, lg.shape[-1]))
            read_at.append(steps + 1)
            b_opts = opts[start : start + len(batch)]
            preds.append(lg.argmax(-1))
            option_logits.append(torch.gather(lg, 2, b_opts[None].expand(lg.shape[0], -1, -1)))
            pre.append(out.norm_pre.float().cpu())
            post.append(out.norm_post.float().cpu())
            exit_p.append(out.exit_probs.float().cpu())
            if progress is not None:
                progress(len(batch))
    finally:
        tokenizer.padding_side, tokenizer.pad_token = saved
    pred = torch.cat(preds, 1)  # (n, N)
    opt_lg = torch.cat(option_logits, 1)  # (n, N, 2)
    pre, post, exit_p, read_at = torch.cat(pre, 1), torch.cat(post, 1), torch.cat(exit_p, 1), torch.cat(read_at, 1)
    right = opts[torch.arange(len(prompts)), correct]
    n_prompts = len(prompts)
    sign = 1.0 - 2.0 * correct.float()  # +1 if option 0 is correct
    rows = []
    for t in range(pred.shape[0]):
        top_id, top_count = Counter(pred[t].tolist()).most_common(1)[0]
        margin = sign * (opt_lg[t, :, 0] - opt_lg[t, :, 1])
        rows.append(
            {
                "step": t + 1,
                "n_loops": pred.shape[0],
                "boundary": boundary,
                "n_prompts": n_prompts,
                "greedy_acc": (pred[t] == right).float().mean().item(),
                "forced_acc": (margin > 0).float().mean().item(),
                "forced_margin": margin.mean().item(),
                "option_rate": (pred[t][:, None] == opts).any(-1).float().mean().item(),
                "top_token": tokenizer.decode([top_id]),
                "top_token_id": top_id,
                "top_share": top_count / n_prompts,
                "norm_pre": pre[t].mean().item(),
                "norm_post": post[t].mean().item(),
                "exit_prob": exit_p[t].mean().item(),
                "exit_step": read_at[t].float().mean().item(),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)
