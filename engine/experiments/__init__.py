"""The experiments built on the core, each a module with one interface, and the one registry that names them.

A module in REGISTRY provides:
    TITLE, TASKS                                  what it is called, the tasks it runs
    trainings(preset, tasks) -> [(RunConfig, label)]   the trainings it starts (the fan-outs and the bench read it)
    run(preset, seeds, store, device, tasks, progress) -> rows   compute what is missing, write its table
    summarize(rows, preset) -> DataFrame          its table of estimates (the per-n table `loopscope run` prints)
    claims(rows, preset) -> [verdicts.Claim]      its verdicts, the one judge of its table: the CLI, the dashboard
                                                  and the report print these and nothing else
    report(rows, preset) -> str                   the estimates and the verdicts, as `loopscope run` prints them
and may provide
    seeds_for(preset, cfg, seeds) -> seeds       the requested seeds a training uses (E5's ladder: the first 4)

The CLI (`loopscope run`), the job runner, both fan-outs, the bench and the dashboard list experiments from
REGISTRY alone: adding an experiment is one module and one line here. E1 (released weights) is a probe of
someone else's checkpoint, not a training experiment: it is not in REGISTRY (engine.experiments.e1,
`loopscope ouro`; the model itself is the HF-style package engine.ouro).
"""

from __future__ import annotations

import importlib
from types import ModuleType

NAMES = ("e2", "e3", "e4", "e5")  # REGISTRY's keys, in order
PAPER = ("e2", "e3", "e4")  # what `loopscope run all` runs: the paper's experiments; E5 goes beyond it, run by name


def _registry() -> dict[str, ModuleType]:
    registry = globals().get("REGISTRY")
    if registry is None:
        registry = globals()["REGISTRY"] = {e: importlib.import_module(f"engine.experiments.{e}") for e in NAMES}
    return registry


def __getattr__(name: str):
    """REGISTRY is built on first use: the modules import torch, and `engine.experiments.verdicts` (the
    dashboard's first page) must not pay for that."""
    if name == "REGISTRY":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def seeds_for(experiment: str, preset_name: str, cfg, seeds) -> list[int]:
    """The seeds of `seeds` that a training of REGISTRY[experiment].trainings() uses (all, unless it says)."""
    narrow = getattr(_registry()[experiment], "seeds_for", None)
    return narrow(preset_name, cfg, seeds) if narrow else list(seeds)
