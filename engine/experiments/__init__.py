"""The experiments built on the core, each a module with one interface, and the one registry that names them.

A module in REGISTRY provides:
    TITLE, TASKS                                  what it is called, the tasks it runs
    trainings(preset, tasks) -> [(RunConfig, label)]   the trainings it starts (the fan-outs and the bench read it)
    run(preset, seeds, store, device, tasks, progress) -> rows   compute what is missing, write its table
    summarize(rows, preset) -> DataFrame; claims(summary, trained_loops) -> [dict]; report(rows, preset) -> str

The CLI (`loopscope run`), the job runner, both fan-outs, the bench and the dashboard list experiments from
REGISTRY alone: adding an experiment is one module and one line here. E1 (released weights) is a probe of
someone else's checkpoint, not a training experiment: it lives in engine.ouro.
"""

from types import ModuleType

from engine.experiments import e2, e3, e4

REGISTRY: dict[str, ModuleType] = {"e2": e2, "e3": e3, "e4": e4}
