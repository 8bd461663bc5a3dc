"""Run configurations and the presets (smoke, cpu, cpu-1layer, paper, gpu, gpu-smoke, cpu-ladder), each a function.

A run is (RunConfig, seed). The config is frozen, so it is its own cache key: `run_key` hashes
the config together with the seed. A field added later is left out of the key while it has its
default (`train.loops`, `train.checkpoint`), so every run stored before it keeps its key.
"""

from __future__ import annotations

import hashlib
import json
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from engine import studies
from engine.core import tasks
from engine.core.limits import MAX_LOOPS, check_fields
from engine.core.model import BOUNDARIES, ModelConfig
from engine.core.tasks import MAX_VARIABLES, TASK_NAMES, VOCAB_SIZE, TaskConfig

ARCHS = ("looped", "stacked")


def parse_loops(spec: str) -> tuple[str, tuple[int, ...]]:
    """A training loop-count distribution by name: `fixed:T`, `uniform:A-B` (each of A..B equally often) or
    `lognormal:MEAN:MAX` (the log-normal Poisson of recurrent-depth models, mean MEAN, clipped to MAX;
    loop_schedule). Returns (kind, numbers); ValueError with a sentence otherwise."""
    kind, _, rest = spec.partition(":")
    try:
        numbers = tuple(int(x) for x in rest.replace("-", ":").split(":"))
    except ValueError:
        numbers = ()
    arity = {"fixed": 1, "uniform": 2, "lognormal": 2}.get(kind)
    ok = arity is not None and len(numbers) == arity and 1 <= min(numbers) <= max(numbers) <= MAX_LOOPS
    if ok and kind == "uniform":
        ok = numbers[0] <= numbers[1] and "-" in rest
    if ok and kind == "lognormal":
        ok = 2 <= numbers[0] <= numbers[1] and "-" not in rest  # mean - 1 is the Poisson's mean rate: at least 1
    if not ok:
        raise ValueError(
            f"train.loops {spec[:40]!r} names no loop-count distribution; write fixed:T, uniform:A-B (1 <= A <= B) "
            f"or lognormal:MEAN:MAX (2 <= MEAN <= MAX), loop counts at most {MAX_LOOPS}."
        )
    return kind, numbers


LOGNORMAL_SIGMA = 0.5  # the log-normal Poisson's sigma, as recurrent-depth models use (Geiping et al. 2025)


def loop_schedule(spec: str, steps: int) -> list[int]:
    """The loop count of each of `steps` training steps, drawn from the distribution `spec` (presets.parse_loops;
    RunConfig.train_loops) by a generator seeded from its name alone: the same for every seed of a group, and no
    other random stream is touched, so the default (T every step) trains exactly as before the option existed.

    uniform:A-B    each of A..B equally often
    lognormal:M:X  n = 1 + Poisson(exp(tau)), tau ~ Normal(log(M - 1) - sigma^2/2, sigma): mean M (the
                   Poisson rate has mean M - 1) with a heavy right tail; clipped to X
    """
    kind, numbers = parse_loops(spec)
    if kind == "fixed":
        return [numbers[0]] * steps
    g = torch.Generator().manual_seed(tasks.derive_seed("loops", spec))
    if kind == "uniform":
        return torch.randint(numbers[0], numbers[1] + 1, (steps,), generator=g).tolist()
    mean, top = numbers
    mu = math.log(mean - 1) - LOGNORMAL_SIGMA**2 / 2
    tau = torch.normal(torch.full((steps,), mu, dtype=torch.float64), LOGNORMAL_SIGMA, generator=g)
    return (torch.poisson(tau.exp(), generator=g) + 1).clamp(max=top).long().tolist()


PRECISIONS = ("fp32", "bf16")  # train.precision (engine.core.train.resolve_precision also takes "auto")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to this fraction of lr
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    loss_over_steps: bool = False  # False: loss at the final loop step only
    group_size: int = 16  # seeds trained as one batch: seed s always trains with seeds G*(s//G) .. G*(s//G)+G-1
    loops: str = ""  # loop count of each step (parse_loops); "": the model's trained_loops T, every step
    checkpoint: str = ""  # "layer": keep only each layer's input for the backward, recompute the rest (more compute)
    # the CPU's matmul and attention precision (engine.core.train.dtype_policy): "fp32" (every run before it existed),
    # or "bf16" (autocast; fp32 weights, AdamW state, loss and evaluation). A GPU trains under bf16 autocast either way
    precision: str = "fp32"

    def __post_init__(self):
        check_fields(self, "train")  # types and ranges: engine.core.limits.RANGES
        if self.loops:
            parse_loops(self.loops)
        if self.checkpoint not in ("", "layer"):
            raise ValueError(f'train.checkpoint must be "" (none) or "layer", got {self.checkpoint!r}.')
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be fp32 or bf16, got {str(self.precision)[:40]!r}.")


# TrainConfig fields added after runs were stored, with the default at which to_dict leaves each out (so old keys stand)
TRAIN_ADDED = {"loops": "", "checkpoint": "", "precision": "fp32"}


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    task: TaskConfig
    train: TrainConfig
    max_eval_loops: int  # evaluate n = 1..max_eval_loops after training (3T by default)

    def __post_init__(self):
        check_fields(self, "run")  # types and ranges: engine.core.limits.RANGES
        if self.model.vocab_size != VOCAB_SIZE:
            raise ValueError(
                f"model.vocab_size must be {VOCAB_SIZE}, the tasks' vocabulary (0 1 = ? id not "
                f"v0..v{MAX_VARIABLES - 1}), got {self.model.vocab_size}."
            )
        if self.train.loops == f"fixed:{self.model.trained_loops}":  # the default, spelled out: one config, one key
            object.__setattr__(self, "train", replace(self.train, loops=""))

    @property
    def train_loops(self) -> str:
        """The training loop-count distribution by name (`fixed:T` for the default)."""
        return self.train.loops or f"fixed:{self.model.trained_loops}"

    def group(self, seed: int) -> list[int]:
        """The seeds seed `seed` trains with. Batched kernels round differently for different group sizes,
        so a seed's weights depend on its group; fixing the group by the config makes them depend on the
        run key alone, however a run was asked for, interrupted or repaired."""
        G = self.train.group_size
        return list(range(seed // G * G, seed // G * G + G))

    def groups(self, seeds) -> list[list[int]]:
        """The groups that hold `seeds`, in order."""
        return [list(g) for g in sorted({tuple(self.group(s)) for s in seeds})]

    def run_key(self, seed: int) -> str:
        blob = json.dumps({"config": self.to_dict(), "seed": seed}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        """The config as stored in manifests and hashed into run keys; `train.loops` only where it is not the
        default, so runs from before the field existed keep their keys and manifests."""
        d = asdict(self)
        for field, default in TRAIN_ADDED.items():  # added later: left out at their defaults, so old keys stand
            if getattr(self.train, field) == default:
                del d["train"][field]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """The config `to_dict` wrote (a manifest's, or a --config file): every section and field given, none
        unknown, else ValueError naming them. Only the fields to_dict leaves out at their defaults may be left
        out, and `eval_loops` stands for max_eval_loops (runs before 2026-12-03)."""
        if not isinstance(d, dict):
            raise ValueError(f"a run config is a JSON object of model, task, train and max_eval_loops, got {d!r:.40}.")
        d = dict(d)
        if "eval_loops" in d and "max_eval_loops" not in d:
            d["max_eval_loops"] = d.pop("eval_loops")
        _all_named(d, ("model", "task", "train", "max_eval_loops"), "the config")
        made = {}
        for name, section in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig)):
            if not isinstance(d[name], dict):
                raise ValueError(f"{name} must be a JSON object of its fields, got {d[name]!r:.40}.")
            optional = tuple(TRAIN_ADDED) if name == "train" else ()  # left out at their defaults
            _all_named(d[name], [f.name for f in fields(section) if f.name not in optional], name, optional)
            made[name] = section(**d[name])
        return cls(made["model"], made["task"], made["train"], d["max_eval_loops"])


def _all_named(given: dict, wanted, where: str, optional=()) -> None:
    """ValueError with one sentence unless `given` has every key of `wanted` and nothing outside it and `optional`."""
    missing = [k for k in wanted if k not in given]
    unknown = [str(k)[:40] for k in given if k not in wanted and k not in optional][:5]
    if missing or unknown:
        parts = [f"lacks {', '.join(missing)}"] * bool(missing) + [f"has unknown {', '.join(unknown)}"] * bool(unknown)
        raise ValueError(
            f"{where} {' and '.join(parts)}; a run config names every field (start from a preset's, e.g. "
            "'loopscope list --json' or RunConfig.to_dict())."
        )


def default_task(name: str, hardest_train: int, beyond: int, **knobs) -> TaskConfig:
    """Train on difficulties 1..hardest_train, evaluate on 1..hardest_train+beyond."""
    return TaskConfig(name, tuple(range(1, hardest_train + 1)), tuple(range(1, hardest_train + beyond + 1)), **knobs)


def _make(task: TaskConfig, model: ModelConfig, train: TrainConfig, boundary: str, arch: str) -> RunConfig:
    if task.name not in TASK_NAMES:
        raise ValueError(f"unknown task {task.name!r}; choose one of {', '.join(TASK_NAMES)}.")
    if boundary not in BOUNDARIES:
        raise ValueError(f"unknown boundary {boundary!r}; choose one of {', '.join(BOUNDARIES)}.")
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}.")
    T = model.trained_loops
    model = replace(model, boundary=boundary)
    if arch == "stacked":  # equal trained depth: L*T distinct layers, run once
        model = replace(model, layers_per_block=model.layers_per_block * T, trained_loops=1, tied=False)
    return RunConfig(model, task, train, max_eval_loops=3 * T)


def smoke(task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    """Seconds on a laptop core: for tests and for trying the commands."""
    t = (
        default_task("parity", 4, 2, eval_examples=128)
        if task == "parity"
        else default_task("chain", 2, 1, chains=1, variables=8, order="ordered", eval_examples=128)
    )
    model = ModelConfig(VOCAB_SIZE, d_model=32, n_heads=2, d_ff=96, layers_per_block=1, trained_loops=3)
    train = TrainConfig(steps=300, batch_size=32, lr=3e-3, warmup_steps=20, group_size=2)
    return _make(t, model, train, boundary, arch)


# The second CPU study's parity (and the GPU study's): lengths 7-12 trained, half of each held out, evaluated to 16
SECOND_STUDY_PARITY = TaskConfig("parity", tuple(range(7, 13)), tuple(range(7, 17)), holdout=0.5, eval_examples=512)
# The paper's model: 6 sandwich layers of width 512 looped 4 times, 19,024,384 parameters
PAPER_MODEL = ModelConfig(VOCAB_SIZE, d_model=512, n_heads=8, d_ff=1376, layers_per_block=6, trained_loops=4)


def cpu(task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    """The second CPU study (docs/design.md §7): held-out in-range items, two layers per block, T = 4, 16-seed groups.

    Parity trains on lengths 7-12 (the upper half holds out 512-2,048 items each) and is evaluated to 16. The
    chain is the ordered single chain, a parity-like control: no interleaved chain that needs retrieval by
    name trained at this size within the search budget (dev/LOG.md, 2026-12-03). Recipe:
    dev/studies/cpu-second-design/recipe_probe.py, chosen only on norm-trained held-out accuracy at n = T."""
    t = (
        SECOND_STUDY_PARITY
        if task == "parity"
        else TaskConfig(
            "chain", (1, 2, 3, 4), tuple(range(1, 9)), chains=1, variables=12, order="ordered", holdout=0.5,
            eval_examples=512,
        )
    )  # fmt: skip
    model = ModelConfig(VOCAB_SIZE, d_model=64, n_heads=4, d_ff=176, layers_per_block=2, trained_loops=4)
    return _make(t, model, TrainConfig(steps=2000, batch_size=64, lr=1e-3), boundary, arch)


def cpu_1layer(task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    """The first CPU study (2026-12-02), kept as a labelled earlier design: one layer per block, no held-out
    split (its in-range items are mostly seen in training), the ordered chain (a parity-like control)."""
    t = (
        default_task("parity", 8, 4, eval_examples=512)
        if task == "parity"
        else default_task("chain", 4, 4, chains=1, variables=12, order="ordered", eval_examples=512)
    )
    model = ModelConfig(VOCAB_SIZE, d_model=64, n_heads=4, d_ff=176, layers_per_block=1, trained_loops=4)
    return _make(t, model, TrainConfig(steps=2000, batch_size=64, lr=1e-3), boundary, arch)


def paper(task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    """About 19M parameters (6 sandwich layers of width 512 looped 4 times): a GPU preset."""
    t = (
        default_task("parity", 16, 8, eval_examples=1024, holdout=0.5)
        if task == "parity"
        else default_task("chain", 6, 3, chains=3, variables=32, order="layered", holdout=0.5, eval_examples=1024)
    )
    model = PAPER_MODEL
    # Every default group of 16 fits one 80 GB GPU (74.5 GiB). engine.core.memory's estimates on a GPU, calibrated on
    # an H200 to 1%: looped parity 64.5 GiB as it is; stacked parity 79.0, looped chain 228.0, stacked chain 240.1,
    # which keep only each layer's input for the backward (26.0, 22.3, 37.5 GiB; about a third more compute).
    checkpoint = "" if (task, arch) == ("parity", "looped") else "layer"
    train = TrainConfig(steps=20_000, batch_size=256, lr=5e-4, warmup_steps=1000, checkpoint=checkpoint)
    return _make(t, model, train, boundary, arch)


# The GPU study's recipe candidates (docs/gpu-study.md, "Predictions and rules"), in the order the recipe probe
# (dev/studies/gpu-study/gpu_recipe.py) runs them on the 19M model; the group size is the caller's (the probe:
# seeds 0-3 as one group).
GPU_RECIPES = {
    "R1": TrainConfig(steps=2000, batch_size=64, lr=1e-3),  # the `cpu` recipe
    "R2": TrainConfig(steps=2000, batch_size=64, lr=5e-4),
    "R3": TrainConfig(steps=4000, batch_size=64, lr=5e-4),
}
# The recipe the `gpu` preset trains with. R1 until the probe has run: docs/gpu-study.md's rule decides (the first
# candidate whose norm-trained held-out accuracy at n = T is >= 0.95, else the best, labelled "recipe below the
# bar"), and the commit that changes this line cites the probe's numbers.
GPU_RECIPE = "R1"


def gpu(task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    """The GPU study (docs/design.md §9): the second CPU study's parity on the paper's 19M model, trained with the
    adopted recipe (GPU_RECIPE), 16 seeds a group. Parity only: the chain enters the study only through its search.

    engine.core.memory's estimates for a group of 16 on a GPU (batch 64, any of R1-R3): looped 17.7 GiB, stacked
    32.9 GiB (76M parameters), so nothing is checkpointed (every group fits one 80 GB GPU; tested)."""
    _only_parity("gpu", task)
    return _make(SECOND_STUDY_PARITY, PAPER_MODEL, GPU_RECIPES[GPU_RECIPE], boundary, arch)


def gpu_smoke(task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    """The GPU study's structure at a size the CPU runs in seconds: dry runs of its pieces and tests only."""
    _only_parity("gpu-smoke", task)
    t = replace(SECOND_STUDY_PARITY, eval_examples=32)
    model = ModelConfig(VOCAB_SIZE, d_model=32, n_heads=2, d_ff=96, layers_per_block=2, trained_loops=4)
    train = TrainConfig(steps=30, batch_size=16, lr=3e-3, warmup_steps=5, group_size=4)
    return _make(t, model, train, boundary, arch)


# The recipe the `cpu-ladder` preset trains with: the GPU study's rule applied to its own 19M rung on the CPU
# (engine.runtime.cpu_ladder's probe, <results>/cpu-ladder/recipe-probe.json). No candidate reached the bar, a mean
# held-out accuracy at n = T of 0.95 over seeds 0-3 (R1 0.693, R2 0.722, R3 0.873); the rule adopts the best of
# them, R3, and the study is "recipe below the bar" (docs/gpu-study.md, note of 2026-12-06).
CPU_LADDER_RECIPE = "R3"


def cpu_ladder(
    task: str = "parity", boundary: str = "norm", arch: str = "looped", recipe: str = CPU_LADDER_RECIPE
) -> RunConfig:
    """The GPU study's ladder continued on the CPU, in fp32 (the precision of every lower rung): the paper's 19M model
    on the second study's parity with the GPU study's recipe (CPU_LADDER_RECIPE, adopted by the same rule), one seed
    a group: a 19M seed trains for about an hour on two cores, so each seed is a piece of its own, checkpointed and
    resumable (engine.runtime.cpu_ladder). Its ladder (E5 parts 3-4) adds 1.6M and 5.3M; the rungs up to 412k are
    E5's `cpu` ladder. A folder of its own (OWN_FOLDER): no other study takes its runs. `recipe`: another of
    GPU_RECIPES, for the probe's candidates."""
    _only_parity("cpu-ladder", task)
    train = replace(GPU_RECIPES[recipe], group_size=1)
    return _make(SECOND_STUDY_PARITY, PAPER_MODEL, train, boundary, arch)


# The agreement-or-growth design's model (docs/design.md §10): the ladder's 1.6M rung, d 256 x L 2, T = 4
AGREE_MODEL = ModelConfig(VOCAB_SIZE, d_model=256, n_heads=8, d_ff=704, layers_per_block=2, trained_loops=4)


def cpu_agree(task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    """The train x run design at 1.6M (docs/design.md §10): the ladder's 1.6M rung exactly (its `norm` runs have the
    ladder's run keys), trained `norm` and `none`, 16 seeds one a group, under the ladder's recipe, in fp32 on the
    CPU; E5 parts 1 and 4 (engine.experiments.e5.PARTS), pieces of one seed (engine.runtime.cpu_agree)."""
    _only_parity("cpu-agree", task)
    train = replace(GPU_RECIPES[CPU_LADDER_RECIPE], group_size=1)
    return _make(SECOND_STUDY_PARITY, AGREE_MODEL, train, boundary, arch)


def _only_parity(name: str, task: str) -> None:
    if task != "parity":
        raise ValueError(
            f"the {name} preset trains parity only (the chain enters the GPU study only through its search); "
            "pick --tasks parity."
        )


PRESETS = {
    "smoke": smoke, "cpu": cpu, "cpu-1layer": cpu_1layer, "paper": paper, "gpu": gpu, "gpu-smoke": gpu_smoke,
    "cpu-ladder": cpu_ladder, "cpu-agree": cpu_agree,
}  # fmt: skip
# Studies whose runs and tables live in a folder of their own under a results folder (engine.studies: each study's
# entry). The GPU study reruns on the GPU configs a CPU study holds too (its bridge rung: the same config on both
# devices, so the same run key); in the CPU's store it would take the CPU's runs for its own and compute nothing
# (dev/LOG.md, 2026-12-04).
OWN_FOLDER = studies.own_folders()


def study_root(root, preset_name: str) -> Path:
    """The store a preset's runs and tables live in, under the results folder `root`."""
    return Path(root) / OWN_FOLDER[preset_name] if preset_name in OWN_FOLDER else Path(root)


def tasks_of(preset_name: str) -> tuple[str, ...]:
    """The tasks a preset defines (its study's entry)."""
    return studies.STUDIES[preset_name].tasks if preset_name in studies.STUDIES else TASK_NAMES


_PRECISION = {"value": "fp32"}  # the precision preset() gives every config (precision_override; fp32: as defined)


@contextmanager
def precision_override(precision: str):
    """Within it, every config preset() makes trains in `precision` (train.precision): how `loopscope run
    --precision` gives one study one precision, whichever experiment builds its configs."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision must be fp32 or bf16, got {str(precision)[:40]!r}.")
    before, _PRECISION["value"] = _PRECISION["value"], precision
    try:
        yield
    finally:
        _PRECISION["value"] = before


def preset(name: str, task: str = "parity", boundary: str = "norm", arch: str = "looped") -> RunConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}.")
    cfg = PRESETS[name](task, boundary, arch)
    if _PRECISION["value"] != cfg.train.precision:
        cfg = replace(cfg, train=replace(cfg.train, precision=_PRECISION["value"]))
    return cfg


def train_ranges(preset_name: str, tasks) -> dict[str, tuple[int, ...]]:
    """Training difficulties per task of a preset; tasks (or a preset) it does not know are left out."""
    if preset_name not in PRESETS:
        return {}
    out = {}
    for task in tasks:
        try:
            out[task] = tuple(preset(preset_name, task).task.train_difficulties)
        except ValueError:
            continue
    return out
