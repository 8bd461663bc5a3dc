"""The type and range of every run-config field, in one table (RANGES), read by each config's __post_init__
and documented in docs/commands.md, "Config fields and their ranges".

The bounds are generous for research and stop absurd values before anything is built: a config inside them can
still be refused for memory (engine.core.memory.check_fits, run before any training). Integers must be real
integers (not booleans, not 3.0); numbers must be finite (JSON's NaN and Infinity are refused) and an integer
given for a number is taken as that number (so 10000 and 10000.0 make one run key). Rules that tie fields
together (heads dividing d_model, a chain's variables, the vocabulary) are checked beside the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

MAX_LOOPS = 1000  # loop counts per forward: trained, drawn by train.loops, evaluated (engine.inputs reads it)
MAX_DIFFICULTY = {"parity": 1024, "chain": 31}  # parity: bits; chain: hops (32 variables hold at most 31 hops)
MAX_DIFFICULTIES = 1024  # entries of train_difficulties and of eval_difficulties


@dataclass(frozen=True)
class Range:
    kind: type  # int, float, bool, str or tuple (of ints)
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # (low, high] rather than [low, high]
    open_high: bool = False  # [low, high) rather than [low, high]
    even: bool = False
    note: str = ""  # the third column of docs/commands.md's table: what else holds

    def __str__(self) -> str:
        if self.kind in (bool, str):
            return {bool: "true or false", str: "a string"}[self.kind]
        if self.kind is float:
            left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
            return f"a finite number in {left}{_short(self.low)}, {_short(self.high)}{right}"
        if self.kind is tuple:
            return "a list of integers"
        what = "an even integer" if self.even else "an integer"
        return (
            f"a positive integer at most {self.high:,}"
            if self.low == 1
            else f"{what} from {self.low:,} to {self.high:,}"
        )


def _short(x: float) -> str:
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")


RANGES: dict[str, dict[str, Range]] = {
    "model": {
        "vocab_size": Range(int, 1, 65_536, note="in a run: exactly 38, the tasks' vocabulary"),
        "d_model": Range(int, 2, 8192, note="n_heads heads of an even size"),
        "n_heads": Range(int, 1, 128),
        "d_ff": Range(int, 1, 32_768),
        "layers_per_block": Range(int, 1, 128, note="a stacked model's whole depth L x T"),
        "trained_loops": Range(int, 1, MAX_LOOPS),
        "tied": Range(bool),
        "boundary": Range(str, note="norm or none"),
        "rope_theta": Range(float, 0, 1e9, open_low=True),
        "norm_eps": Range(float, 0, 0.1, open_low=True),
    },
    "task": {
        "name": Range(str, note="parity or chain"),
        "train_difficulties": Range(
            tuple,
            note=f"1..{MAX_DIFFICULTY['parity']} bits (parity) or 1..{MAX_DIFFICULTY['chain']} hops (chain); "
            f"1 to {MAX_DIFFICULTIES} entries",
        ),
        "eval_difficulties": Range(tuple, note="as train_difficulties"),
        "dense": Range(bool),
        "chains": Range(int, 1, 16, note="chain: chains x (hardest hops + 1) <= variables"),
        "variables": Range(int, 2, 32, note="v0..v31 in the vocabulary"),
        "neg_prob": Range(float, 0, 1),
        "order": Range(str, note="shuffled, layered (3 or more chains) or ordered"),
        "source_first": Range(bool),
        "holdout": Range(float, 0, 1, open_high=True),
        "curriculum": Range(float, 0, 1),
        "eval_examples": Range(int, 2, 1_000_000, even=True, note="per difficulty, half of each label"),
        "eval_seed": Range(int, 0, 2**31 - 1),
    },
    "train": {
        "steps": Range(int, 1, 1_000_000),
        "batch_size": Range(int, 2, 65_536, even=True, note="per seed; labels exactly balanced"),
        "lr": Range(float, 0, 10, open_low=True),
        "min_lr_ratio": Range(float, 0, 1, note="the cosine decays to this share of lr"),
        "warmup_steps": Range(int, 1, 1_000_000),
        "weight_decay": Range(float, 0, 1, note="AdamW multiplies weights by 1 - lr x weight_decay a step"),
        "grad_clip": Range(float, 0, 1e6, open_low=True),
        "loss_over_steps": Range(bool),
        "group_size": Range(int, 1, 1024, note="seeds trained as one batch (part of the run key)"),
        "loops": Range(
            str, note=f"empty (T every step), fixed:T, uniform:A-B or lognormal:MEAN:MAX, counts <= {MAX_LOOPS}"
        ),
        "checkpoint": Range(str, note="empty (none) or layer (activations recomputed per layer)"),
        "precision": Range(str, note="fp32 or bf16: the CPU's matmuls and attention (a GPU trains in bf16 autocast)"),
    },
    "run": {"max_eval_loops": Range(int, 1, MAX_LOOPS, note="evaluated at n = 1..max_eval_loops")},
}


def _refuse(where: str, r: Range, value) -> ValueError:
    shown = str(value) if isinstance(value, int | float) else repr(value)  # bools too: True, not 'True'
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ValueError(f"{where} must be {r}, got {shown}.")


def checked(where: str, r: Range, value):
    """`value` if it is of r's kind and inside r (an int given for a float: as that float; a list: as a tuple);
    ValueError with one sentence naming `where` otherwise."""
    if r.kind is bool:
        if not isinstance(value, bool):
            raise _refuse(where, r, value)
        return value
    if r.kind is str:
        if not isinstance(value, str):
            raise _refuse(where, r, value)
        return value
    if r.kind is tuple:
        if not isinstance(value, tuple | list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise _refuse(where, r, value)
        return tuple(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse(where, r, value)
    if r.kind is int and not isinstance(value, int):
        raise _refuse(where, r, value)
    if r.kind is float:
        try:
            value = float(value)
        except OverflowError:  # an integer past float's range
            raise _refuse(where, r, value) from None
        if not math.isfinite(value):
            raise _refuse(where, r, value)
    low_ok = value > r.low if r.open_low else value >= r.low
    high_ok = value < r.high if r.open_high else value <= r.high
    if not (low_ok and high_ok) or (r.even and value % 2):
        raise _refuse(where, r, value)
    return value


def check_fields(config, section: str) -> None:
    """Check every field of a frozen config dataclass against RANGES[section], in declaration order, and store
    the normalised value (float for an int given as a number, tuple for a list)."""
    prefix = "" if section == "run" else f"{section}."
    table = RANGES[section]
    for f in fields(config):
        if f.name in table:
            value = checked(prefix + f.name, table[f.name], getattr(config, f.name))
            object.__setattr__(config, f.name, value)


def check_difficulties(task: str, train: tuple[int, ...], evaluated: tuple[int, ...]) -> None:
    """Each task's difficulties lie in 1..MAX_DIFFICULTY[task], at most MAX_DIFFICULTIES of each."""
    most = MAX_DIFFICULTY.get(task)
    for name, values in (("train_difficulties", train), ("eval_difficulties", evaluated)):
        if len(values) > MAX_DIFFICULTIES:
            raise ValueError(f"task.{name} names {len(values)} difficulties; at most {MAX_DIFFICULTIES} are taken.")
        if most is not None and values and not 1 <= min(values) <= max(values) <= most:
            unit = "bits" if task == "parity" else "hops"
            raise ValueError(
                f"task.{name} must each be at least 1 and at most {most} ({unit} of {task}), got "
                f"{min(values)}..{max(values)}."
            )


def table_markdown() -> str:
    """RANGES as docs/commands.md's table (a test keeps docs/commands.md in step with it)."""
    lines = ["| field | type and range | also |", "|---|---|---|"]
    for section, table in RANGES.items():
        for name, r in table.items():
            lines.append(f"| `{section + '.' if section != 'run' else ''}{name}` | {r} | {r.note} |")
    return "\n".join(lines)
