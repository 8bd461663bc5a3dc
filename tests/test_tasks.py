"""Tasks: exact balance, correct answers (checked by an independent solver), determinism."""

import pytest
import torch

from engine.core import tasks
from engine.core.tasks import IGNORE, VOCAB, TaskConfig, eval_set, sample

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


# ---------------------------------------------------------------- the held-out split and the retrieval chain

PARITY = TaskConfig("parity", tuple(range(7, 13)), tuple(range(7, 17)), holdout=0.5, eval_examples=512)
RETRIEVAL = TaskConfig("chain", (1, 2, 3, 4), (1, 2, 3, 4, 5), chains=3, variables=24, order="layered", holdout=0.5)


@pytest.mark.parametrize("cfg", [PARITY, RETRIEVAL], ids=["parity", "chain"])
def test_the_training_stream_never_emits_a_held_out_example(cfg):
    g = tasks.train_generator(0)
    held = {tuple(t.tolist()) for d in cfg.train_difficulties for t in eval_set(cfg, d).tokens}
    for step, d in enumerate(tasks.difficulty_schedule(cfg, 400)):
        batch = tasks.train_batch(cfg, d, 64, g)
        assert not tasks.is_heldout(cfg, batch.tokens).any(), f"step {step}"
        assert not {tuple(t.tolist()) for t in batch.tokens} & held
        assert batch.answers.sum() == 32  # still exactly balanced
    for d in cfg.train_difficulties:  # every evaluation item is on the held-out side, labels balanced
        e = eval_set(cfg, d)
        assert tasks.is_heldout(cfg, e.tokens).all() and 2 * e.answers.sum() == len(e.answers)


def test_splits_name_held_out_seen_and_beyond_and_the_upper_half_holds_out_256():
    assert [tasks.split_of(PARITY, m) for m in (7, 12, 13, 16)] == ["heldout", "heldout", "beyond", "beyond"]
    small = TaskConfig("parity", (2, 3, 8), (2, 3, 8, 9), holdout=0.5)
    assert [tasks.split_of(small, m) for m in (2, 8, 9)] == ["seen", "heldout", "beyond"]  # 2 bits: 4 strings
    assert tasks.split_of(TaskConfig("parity", (8,), (8,)), 8) == "seen"  # no split asked for
    for m in (10, 11, 12):  # the upper half of the training range
        assert len(eval_set(PARITY, m).answers) >= 256
    assert len({tuple(t.tolist()) for t in eval_set(PARITY, 9).tokens}) == len(eval_set(PARITY, 9).tokens)


def shortcut_accuracies(cfg: TaskConfig, batch: tasks.Batch) -> tuple[float, float]:
    """Two heuristics that need no retrieval: the parity of every `not` and literal bit, and 'copy the
    previous statement' (each statement's parent taken to be the one written just before it)."""
    stmts = batch.tokens[:, :-2].view(len(batch.answers), -1, 3)
    src, var = (stmts[:, :, 0], stmts[:, :, 2]) if cfg.source_first else (stmts[:, :, 2], stmts[:, :, 0])
    neg, literal = stmts[:, :, 1] == tasks.NOT, src < tasks.VAR0
    all_nots = (neg.sum(1) + (src * literal).sum(1)) % 2
    values = torch.zeros_like(neg, dtype=torch.long)
    for j in range(stmts.shape[1]):
        previous = values[:, j - 1] if j else torch.zeros(len(values), dtype=torch.long)
        values[:, j] = (torch.where(literal[:, j], src[:, j], previous) + neg[:, j]) % 2
    queried = (var == batch.tokens[:, -1:]).float().argmax(1)
    copy_previous = values[torch.arange(len(values)), queried]
    return (all_nots == batch.answers).float().mean().item(), (copy_previous == batch.answers).float().mean().item()


@pytest.mark.parametrize("source_first", [False, True])
def test_the_retrieval_chain_has_no_shortcut(source_first):
    cfg = TaskConfig("chain", (1, 2, 3, 4, 5), (1, 2, 3, 4, 5), chains=3, variables=24, order="layered",
                     source_first=source_first, eval_examples=4096)  # fmt: skip
    for k in cfg.train_difficulties:
        for accuracy in shortcut_accuracies(cfg, eval_set(cfg, k)):
            assert abs(accuracy - 0.5) < 0.05, (k, accuracy)
    ordered = TaskConfig("chain", (1, 4), (1, 4), chains=1, variables=12, order="ordered", eval_examples=512)
    assert shortcut_accuracies(ordered, eval_set(ordered, 4)) == (1.0, 1.0)  # the control: both shortcuts work


def test_no_statement_directly_follows_its_parent_in_the_layered_order():
    b = eval_set(RETRIEVAL, 4)
    stmts = b.tokens[:, :-2].view(len(b.answers), -1, 3)  # target first: `v_i op v_j`, v_j the parent
    assert not (stmts[:, :-1, 0] == stmts[:, 1:, 2]).any()  # statement j+1's parent is never statement j
