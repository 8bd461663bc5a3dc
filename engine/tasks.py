"""The two synthetic tasks: a binary answer read at the last position, labels exactly balanced.

chain   pointer chasing with negation. Disjoint chains of statements `v_i op v_j` (op is `id`
        or `not`), each rooted at `v_0 id b`; statements shuffled; then `? v_k`. The answer is
        the queried variable's bit. Difficulty = hops k from the root to the queried variable.
parity  bits `b_1 .. b_m =`; the answer is the parity of all bits. Difficulty = length m.

Everything is generated on the fly, vectorised over the batch, from a torch.Generator, so a
seed fixes the data stream. Dense supervision (an optional training aid) also asks for every
intermediate value that is computable from what precedes it: prefix parities, and the value of
each chain statement whose ancestors all appear earlier. Accuracy is always on the final answer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

MAX_VARIABLES = 32
SPECIALS = ("0", "1", "=", "?", "id", "not")
VOCAB = SPECIALS + tuple(f"v{i}" for i in range(MAX_VARIABLES))
ZERO, ONE, EQ, QUERY, ID, NOT = range(len(SPECIALS))
VAR0 = len(SPECIALS)
VOCAB_SIZE = len(VOCAB)
IGNORE = -100  # target for positions without a loss
TASK_NAMES = ("chain", "parity")
CHAIN_ORDERS = ("shuffled", "layered", "ordered")


@dataclass(frozen=True)
class TaskConfig:
    name: str
    train_difficulties: tuple[int, ...]
    eval_difficulties: tuple[int, ...]
    dense: bool = True  # supervise computable intermediate values as well as the answer
    chains: int = 2  # chain: number of disjoint chains (one is queried, the rest distract)
    variables: int = 24  # chain: variable names drawn from v0..v{variables-1}
    neg_prob: float = 0.5  # chain: probability that a hop negates
    order: str = "shuffled"  # chain: "shuffled", "layered" (hop by hop, chains shuffled within a hop), "ordered"
    eval_examples: int = 512  # per difficulty, exactly half of each label
    eval_seed: int = 20_261_001

    def __post_init__(self):
        if self.name not in TASK_NAMES:
            raise ValueError(f"unknown task {self.name!r}; choose one of {', '.join(TASK_NAMES)}.")
        if not self.train_difficulties or not self.eval_difficulties:
            raise ValueError("train_difficulties and eval_difficulties must each name at least one value.")
        if min(self.train_difficulties + self.eval_difficulties) < 1:
            raise ValueError("difficulties (hops for chain, length for parity) must be at least 1.")
        if self.eval_examples < 2 or self.eval_examples % 2:
            raise ValueError(f"eval_examples must be even and at least 2, got {self.eval_examples}.")
        if self.name == "chain":
            hardest = max(self.train_difficulties + self.eval_difficulties)
            if not self.chains * (hardest + 1) <= self.variables <= MAX_VARIABLES:
                raise ValueError(
                    f"chain needs chains*(hops+1) = {self.chains * (hardest + 1)} distinct variables "
                    f"at {hardest} hops but has {self.variables} (at most {MAX_VARIABLES}); "
                    "raise variables or lower chains or the hardest difficulty."
                )
            if self.order not in CHAIN_ORDERS:
                raise ValueError(f"chain order must be one of {', '.join(CHAIN_ORDERS)}, got {self.order!r}.")
            if not 0.0 <= self.neg_prob <= 1.0:
                raise ValueError(f"neg_prob must lie in [0, 1], got {self.neg_prob}.")


@dataclass
class Batch:
    tokens: Tensor  # (B, T) token ids
    targets: Tensor  # (B, T) target ids, IGNORE where there is no loss; the last one is the answer
    answers: Tensor  # (B,) the answer bit, exactly half ones


def derive_seed(*parts) -> int:
    """A stable 63-bit seed from any parts (independent of Python's hash randomisation)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big") >> 1


def balanced_labels(batch: int, g: torch.Generator) -> Tensor:
    if batch % 2:
        raise ValueError(f"batch size must be even for exactly balanced labels, got {batch}.")
    return (torch.arange(batch) % 2)[torch.randperm(batch, generator=g)]


def sample(cfg: TaskConfig, difficulty: int, batch: int, g: torch.Generator) -> Batch:
    return (chain_batch if cfg.name == "chain" else parity_batch)(cfg, difficulty, batch, g)


def parity_batch(cfg: TaskConfig, m: int, batch: int, g: torch.Generator) -> Batch:
    labels = balanced_labels(batch, g)
    bits = torch.randint(0, 2, (batch, m), generator=g)
    # choose the last bit so that the parity is the label: uniform over strings of that parity
    bits[:, -1] = (labels + bits[:, :-1].sum(1)) % 2
    tokens = torch.cat([bits, torch.full((batch, 1), EQ)], 1)  # bit ids are ZERO/ONE
    targets = torch.full_like(tokens, IGNORE)
    if cfg.dense:
        targets[:, :m] = bits.cumsum(1) % 2
    targets[:, -1] = labels
    return Batch(tokens, targets, labels)


def chain_batch(cfg: TaskConfig, k: int, batch: int, g: torch.Generator) -> Batch:
    B, C, H = batch, cfg.chains, k + 1  # H statements per chain: the root and k hops
    labels = balanced_labels(B, g)
    var = torch.rand(B, cfg.variables, generator=g).argsort(1)[:, : C * H].view(B, C, H)
    neg = torch.rand(B, C, H, generator=g) < cfg.neg_prob
    neg[:, :, 0] = False  # the root statement is `v id b`
    root = torch.randint(0, 2, (B, C), generator=g)
    root[:, 0] = (labels + neg[:, 0].sum(1)) % 2  # chain 0 is queried: its answer is the label
    values = (root[:, :, None] + neg.cumsum(-1)) % 2  # (B, C, H) each variable's bit
    source = torch.cat([root[:, :, None], VAR0 + var[:, :, :-1]], -1)  # a bit, or the parent
    statements = torch.stack([VAR0 + var, torch.where(neg, NOT, ID), source], -1)  # (B, C, H, 3)

    # position of every statement: shuffled, or hop by hop (parents first) with the chains in a
    # random ("layered": a parent must be found by its name) or fixed ("ordered") order within a hop
    if cfg.order == "shuffled":
        position = torch.rand(B, C * H, generator=g).argsort(1).argsort(1).view(B, C, H)
    elif cfg.order == "layered":
        slot = torch.rand(B, H, C, generator=g).argsort(-1).argsort(-1).transpose(1, 2)  # (B, C, H)
        position = torch.arange(H) * C + slot
    else:
        position = (torch.arange(H) * C + torch.arange(C)[:, None]).expand(B, C, H)
    seq = torch.empty(B, C * H, 3, dtype=torch.long)
    seq.scatter_(1, position.reshape(B, -1, 1).expand(-1, -1, 3), statements.reshape(B, -1, 3))
    query = torch.stack([torch.full((B,), QUERY), VAR0 + var[:, 0, k]], 1)
    tokens = torch.cat([seq.view(B, -1), query], 1)

    targets = torch.full_like(tokens, IGNORE)
    if cfg.dense:  # a statement's value is computable where all its ancestors came before it
        computable = position == position.cummax(-1).values
        slot = (3 * position + 2)[computable]
        rows = torch.arange(B)[:, None, None].expand(B, C, H)[computable]
        targets[rows, slot] = values[computable]
    targets[:, -1] = labels
    return Batch(tokens, targets, labels)


@lru_cache(maxsize=64)
def eval_set(cfg: TaskConfig, difficulty: int) -> Batch:
    """The fixed evaluation set of one difficulty: reproducible from (task, difficulty, eval_seed)."""
    g = torch.Generator().manual_seed(derive_seed("eval", cfg.name, difficulty, cfg.eval_seed))
    return sample(cfg, difficulty, cfg.eval_examples, g)


def train_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed("train", seed))


def difficulty_schedule(cfg: TaskConfig, steps: int) -> list[int]:
    """The difficulty of each training step, shared by all seeds so that a group of seeds can be
    batched into one tensor; each seed still draws its own examples from its own stream."""
    g = torch.Generator().manual_seed(derive_seed("schedule", cfg.name, cfg.train_difficulties))
    idx = torch.randint(0, len(cfg.train_difficulties), (steps,), generator=g)
    return [cfg.train_difficulties[i] for i in idx.tolist()]


def describe(tokens: Tensor) -> str:
    """One example as text, for debugging and docs."""
    return " ".join(VOCAB[t] for t in tokens.tolist())
