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

from engine.core.limits import check_difficulties, check_fields

MAX_VARIABLES = 32
SPECIALS = ("0", "1", "=", "?", "id", "not")
VOCAB = SPECIALS + tuple(f"v{i}" for i in range(MAX_VARIABLES))
ZERO, ONE, EQ, QUERY, ID, NOT = range(len(SPECIALS))
VAR0 = len(SPECIALS)
VOCAB_SIZE = len(VOCAB)
IGNORE = -100  # target for positions without a loss
TASK_NAMES = ("parity", "chain")
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
    source_first: bool = False  # chain: write a statement `v_j op v_i` (parent first) instead of `v_i op v_j`
    holdout: float = 0.0  # share of each training difficulty's examples kept for evaluation only (by hash)
    curriculum: float = 0.0  # share of training steps over which the difficulty range opens, easiest first
    eval_examples: int = 512  # per difficulty, exactly half of each label
    eval_seed: int = 20_261_001

    def __post_init__(self):
        check_fields(self, "task")  # types and ranges: engine.core.limits.RANGES
        if self.name not in TASK_NAMES:
            raise ValueError(f"unknown task {self.name!r}; choose one of {', '.join(TASK_NAMES)}.")
        if not self.train_difficulties or not self.eval_difficulties:
            raise ValueError("train_difficulties and eval_difficulties must each name at least one value.")
        check_difficulties(self.name, self.train_difficulties, self.eval_difficulties)
        if self.name == "chain":
            hardest = max(self.train_difficulties + self.eval_difficulties)
            if not self.chains * (hardest + 1) <= self.variables <= MAX_VARIABLES:
                raise ValueError(
                    f"chain needs chains*(hops+1) = {self.chains * (hardest + 1)} distinct variables "
                    f"at {hardest} hops but has {self.variables} (at most {MAX_VARIABLES}); "
                    "raise variables or lower chains or the hardest difficulty."
                )
            if self.order == "layered" and self.chains < 3:
                raise ValueError("the layered order needs 3 or more chains (2 would alternate: a positional shortcut).")
            if self.order not in CHAIN_ORDERS:
                raise ValueError(f"chain order must be one of {', '.join(CHAIN_ORDERS)}, got {self.order!r}.")


def layered_slots(B: int, C: int, H: int, g: torch.Generator) -> Tensor:
    """(B, C, H): the slot of chain c's hop-h statement within hop h's layer. Each layer's order is uniform
    among those that do not start with the chain that ended the layer before, so no statement directly
    follows its own parent (else "copy the previous statement" would answer without retrieval)."""
    order = torch.rand(B, H, C, generator=g).argsort(-1)  # order[b, h, i]: the chain in slot i
    for h in range(1, H):
        bad = order[:, h, 0] == order[:, h - 1, -1]
        j = torch.randint(1, C, (B,), generator=g)  # swap slot 0 with a uniform other slot
        rows = bad.nonzero().flatten()
        first, other = order[rows, h, 0].clone(), order[rows, h, j[rows]].clone()
        order[rows, h, 0], order[rows, h, j[rows]] = other, first
    return order.argsort(-1).transpose(1, 2)


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
    op = torch.where(neg, NOT, ID)
    # (B, C, H, 3); the value of the statement's variable is supervised at its last token either way
    statements = torch.stack([source, op, VAR0 + var] if cfg.source_first else [VAR0 + var, op, source], -1)

    # position of every statement: shuffled, or hop by hop (parents first) with the chains in a
    # random ("layered": a parent must be found by its name) or fixed ("ordered") order within a hop
    if cfg.order == "shuffled":
        position = torch.rand(B, C * H, generator=g).argsort(1).argsort(1).view(B, C, H)
    elif cfg.order == "layered":
        position = torch.arange(H) * C + layered_slots(B, C, H, g)
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


# ---------------------------------------------------------------- the held-out split

SPLITS = ("heldout", "seen", "beyond")
MIN_HELDOUT = 64  # a training difficulty holds out only if this many of its examples can be held out
_P, _A, _M = 2_147_483_647, 1_000_003, 48_271  # a Mersenne prime and two multipliers: products stay in int64


def example_hash(tokens: Tensor) -> Tensor:
    """A fixed hash of each example's tokens, uniform in [0, 1): (B, L) -> (B,). The same for every seed,
    run and machine (integer arithmetic only), so it splits the examples once and for all."""
    h = torch.zeros(tokens.shape[0], dtype=torch.long)
    for column in tokens.long().T:
        h = (h * _A + column + 1) % _P
    h = ((h ^ (h >> 13)) * _M) % _P
    return h.double() / _P


def distinct_examples(cfg: TaskConfig, difficulty: int) -> float:
    """How many different examples a difficulty has (a lower bound for chain: its variable choices)."""
    if cfg.name == "parity":
        return 2.0**difficulty
    n = 1.0
    for i in range(cfg.chains * (difficulty + 1)):
        n *= cfg.variables - i
    return n


def holds_out(cfg: TaskConfig, difficulty: int) -> bool:
    return (
        cfg.holdout > 0
        and difficulty in cfg.train_difficulties
        and distinct_examples(cfg, difficulty) * cfg.holdout >= MIN_HELDOUT
    )


def split_of(cfg: TaskConfig, difficulty: int) -> str:
    """`heldout` (evaluated only on examples training never emits), `seen` (a training difficulty too
    small to hold anything out, or a config without a split), or `beyond` (outside the training range)."""
    if difficulty not in cfg.train_difficulties:
        return "beyond"
    return "heldout" if holds_out(cfg, difficulty) else "seen"


def is_heldout(cfg: TaskConfig, tokens: Tensor) -> Tensor:
    return example_hash(tokens) < cfg.holdout


def _balanced_pick(cfg: TaskConfig, draw, batch: int, g: torch.Generator, want_heldout: bool) -> Batch:
    """`batch` examples from draws of `draw()`, exactly half of each label, all on one side of the split."""
    picked: list[Batch] = []
    need = {0: batch // 2, 1: batch // 2}
    for _ in range(10_000):
        b = draw()
        keep = is_heldout(cfg, b.tokens) == want_heldout
        for label in (0, 1):
            idx = (keep & (b.answers == label)).nonzero().flatten()[: need[label]]
            if len(idx):
                picked.append(Batch(b.tokens[idx], b.targets[idx], b.answers[idx]))
                need[label] -= len(idx)
        if not need[0] and not need[1]:
            break
    else:
        raise RuntimeError(f"could not draw {batch} balanced examples on one side of the split")
    order = torch.randperm(batch, generator=g)
    return Batch(*(torch.cat([getattr(b, f) for b in picked])[order] for f in ("tokens", "targets", "answers")))


def train_batch(cfg: TaskConfig, difficulty: int, batch: int, g: torch.Generator) -> Batch:
    """A training batch: never an example of the held-out part."""
    if not holds_out(cfg, difficulty):
        return sample(cfg, difficulty, batch, g)
    return _balanced_pick(cfg, lambda: sample(cfg, difficulty, batch, g), batch, g, want_heldout=False)


def all_parity_strings(cfg: TaskConfig, m: int) -> Batch:
    bits = (torch.arange(2**m)[:, None] >> torch.arange(m)) & 1
    tokens = torch.cat([bits, torch.full((len(bits), 1), EQ)], 1)
    targets = torch.full_like(tokens, IGNORE)
    if cfg.dense:
        targets[:, :m] = bits.cumsum(1) % 2
    targets[:, -1] = bits.sum(1) % 2
    return Batch(tokens, targets, targets[:, -1].clone())


@lru_cache(maxsize=64)
def eval_set(cfg: TaskConfig, difficulty: int) -> Batch:
    """The fixed evaluation set of one difficulty: reproducible from (task, difficulty, eval_seed). Where the
    difficulty holds out, only held-out examples, without repeats where the whole space is small."""
    g = torch.Generator().manual_seed(derive_seed("eval", cfg.name, difficulty, cfg.eval_seed))
    if not holds_out(cfg, difficulty):
        return sample(cfg, difficulty, cfg.eval_examples, g)
    if cfg.name == "parity" and difficulty <= 16:  # enumerate the held-out strings, balance the labels
        every = all_parity_strings(cfg, difficulty)
        held = is_heldout(cfg, every.tokens)
        per_label = min(cfg.eval_examples // 2, *(int((held & (every.answers == y)).sum()) for y in (0, 1)))
        pool = torch.randperm(len(every.answers), generator=g)
        return _balanced_pick(
            cfg, lambda: Batch(every.tokens[pool], every.targets[pool], every.answers[pool]), 2 * per_label, g, True
        )
    return _balanced_pick(cfg, lambda: sample(cfg, difficulty, cfg.eval_examples, g), cfg.eval_examples, g, True)


def train_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed("train", seed))


def difficulty_schedule(cfg: TaskConfig, steps: int) -> list[int]:
    """The difficulty of each training step, shared by all seeds so that a group of seeds can be
    batched into one tensor; each seed still draws its own examples from its own stream. With a
    curriculum, the first `curriculum` share of the steps opens the range one difficulty at a time."""
    g = torch.Generator().manual_seed(derive_seed("schedule", cfg.name, cfg.train_difficulties))
    if not cfg.curriculum:
        idx = torch.randint(0, len(cfg.train_difficulties), (steps,), generator=g)
        return [cfg.train_difficulties[i] for i in idx.tolist()]
    ramp = max(1, round(cfg.curriculum * steps))
    n = len(cfg.train_difficulties)
    opened = [min(n, 1 + s * n // ramp) for s in range(steps)]  # how many difficulties are open at step s
    u = torch.rand(steps, generator=g).tolist()
    return [sorted(cfg.train_difficulties)[int(u[s] * opened[s])] for s in range(steps)]


def describe(tokens: Tensor) -> str:
    """One example as text, for debugging and docs."""
    return " ".join(VOCAB[t] for t in tokens.tolist())
