"""Tasks: exact balance, correct answers (checked by an independent solver), determinism."""

import pytest
import torch

from engine import tasks
from engine.tasks import IGNORE, VOCAB, TaskConfig, eval_set, sample

CHAIN = TaskConfig("chain", (1, 2, 3), (1, 2, 3, 4, 5), chains=3, variables=24)
ORDERED = TaskConfig("chain", (1, 2), (1, 2, 3), chains=2, variables=12, order="ordered")
LAYERED = TaskConfig("chain", (1, 2), (1, 2, 3), chains=3, variables=12, order="layered")
PARITY = TaskConfig("parity", (1, 2, 3, 8), (1, 12))


def solve_chain(words: list[str]) -> tuple[int, dict[int, int]]:
    """Read the statements as text and resolve the query; also each statement's value by position."""
    *body, _, query = words
    statements = [body[i : i + 3] for i in range(0, len(body), 3)]
    rule = {var: (op, src) for var, op, src in statements}

    def value(var):
        op, src = rule[var]
        v = int(src) if src in ("0", "1") else value(src)
        return 1 - v if op == "not" else v

    return value(query), {3 * i + 2: value(s[0]) for i, s in enumerate(statements)}


@pytest.mark.parametrize(
    "cfg, difficulty", [(CHAIN, 1), (CHAIN, 4), (ORDERED, 3), (LAYERED, 3), (PARITY, 1), (PARITY, 9)]
)
def test_labels_exactly_balanced_and_correct(cfg, difficulty):
    g = torch.Generator().manual_seed(1)
    batch = sample(cfg, difficulty, 64, g)
    assert int(batch.answers.sum()) == 32
    assert torch.equal(batch.targets[:, -1], batch.answers)
    for row, target, answer in zip(batch.tokens, batch.targets, batch.answers, strict=True):
        words = [VOCAB[t] for t in row]
        if cfg.name == "parity":
            assert words[-1] == "=" and len(words) == difficulty + 1
            assert sum(int(w) for w in words[:-1]) % 2 == answer
            dense = [sum(int(w) for w in words[: i + 1]) % 2 for i in range(difficulty)]
            assert target[:difficulty].tolist() == dense
        else:
            truth, by_position = solve_chain(words)
            assert truth == answer
            assert len(words) == 3 * cfg.chains * (difficulty + 1) + 2
            for pos, t in enumerate(target[:-1].tolist()):
                if t != IGNORE:  # every dense target is the statement's true value
                    assert t == by_position[pos]


def test_chain_query_depth_equals_difficulty():
    g = torch.Generator().manual_seed(2)
    batch = sample(CHAIN, 3, 8, g)
    for row in batch.tokens:
        words = [VOCAB[t] for t in row]
        *body, _, query = words
        parent = {body[i]: body[i + 2] for i in range(0, len(body), 3)}
        hops, var = 0, query
        while parent[var] not in ("0", "1"):
            var, hops = parent[var], hops + 1
        assert hops == 3


def parent_offsets(batch) -> set[int]:
    offsets = set()
    for row in batch.tokens:
        words = [VOCAB[t] for t in row][:-2]
        index = {words[i]: i // 3 for i in range(0, len(words), 3)}
        offsets |= {i // 3 - index[words[i + 2]] for i in range(0, len(words), 3) if words[i + 2] in index}
    return offsets


def test_ordered_chain_supervises_every_statement_shuffled_only_computable_ones():
    g = torch.Generator().manual_seed(3)
    ordered = sample(ORDERED, 3, 32, g)
    assert int((ordered.targets[:, :-1] != IGNORE).sum(1).min()) == ORDERED.chains * 4
    layered = sample(LAYERED, 3, 32, g)
    assert int((layered.targets[:, :-1] != IGNORE).sum(1).min()) == LAYERED.chains * 4
    # ordered: a parent is always `chains` statements back; layered: it must be found by name
    assert parent_offsets(ordered) == {ORDERED.chains}
    assert len(parent_offsets(layered)) > 1 and min(parent_offsets(layered)) > 0
    shuffled = sample(CHAIN, 3, 32, g)
    assert int((shuffled.targets[:, :-1] != IGNORE).sum(1).max()) < CHAIN.chains * 4


def test_generation_is_deterministic_from_the_seed():
    a = sample(CHAIN, 2, 16, torch.Generator().manual_seed(5))
    b = sample(CHAIN, 2, 16, torch.Generator().manual_seed(5))
    c = sample(CHAIN, 2, 16, torch.Generator().manual_seed(6))
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert torch.equal(eval_set(PARITY, 12).tokens, eval_set(PARITY, 12).tokens)
    eval_set.cache_clear()
    first = eval_set(CHAIN, 5).tokens.clone()
    eval_set.cache_clear()
    assert torch.equal(eval_set(CHAIN, 5).tokens, first)
    assert int(eval_set(CHAIN, 5).answers.sum()) == CHAIN.eval_examples // 2


def test_difficulty_schedule_covers_the_training_range_and_ignores_the_seed():
    schedule = tasks.difficulty_schedule(PARITY, 400)
    assert set(schedule) == set(PARITY.train_difficulties)
    assert schedule == tasks.difficulty_schedule(PARITY, 400)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="sorting"), "unknown task"),
        (dict(name="chain", chains=4, variables=12), "distinct variables"),
        (dict(name="parity", eval_examples=3), "even"),
        (dict(name="parity", train_difficulties=(0,)), "at least 1"),
    ],
)
def test_task_config_errors_say_what_to_change(kwargs, message):
    base = dict(name="parity", train_difficulties=(1, 2), eval_difficulties=(1, 4))
    with pytest.raises(ValueError, match=message):
        TaskConfig(**{**base, **kwargs})
