"""What a piece of the GPU study costs on a device: its seconds (Rates) and one command's budget (Budget).

Every prediction of a piece reads Rates: measured by a device session's calibration (dev/checks/gpu_session.py), or
else the H200's of 2026-12-04. A piece is one process: it pays its start-up (PROCESS_S) and its compilation
(Rates.compile_s) once, then each unit of work at the rates of how that unit runs (issue 59): training compiled,
the evaluation after it in the trained model (compiled, the group in one forward on a GPU), the surgeries from
stored weights one member at a time (eager), E3's refits on a copy of the model (eager, the group in one forward).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.core import flops
from engine.core.presets import RunConfig, preset
from engine.experiments.e5 import SCALE_EXAMPLES

PROCESS_S = 15.0  # a piece's process before its first unit: Python, torch and the engine imported, the store read

# The H200's rates of 2026-12-04 (issue 29, dev/LOG.md; eager, bf16 autocast): 2.5% of its 783 TFLOP/s bf16 peak for
# one `paper` seed at batch 256 and 11.5% for 16 at batch 256. The plan's default until a session measures its own:
# a training step's rate interpolated between them in log(items a step) (the `gpu` preset's 16 seeds at batch 64 are
# 1,024 items: 5.4%), a floor of seconds a step whatever the size (kernel launches: ~70 a layer and loop step, ~10 us
# each), evaluation and refits at the rate of their items. Its compile seconds were never measured: H200_COMPILE_S
# is the most the session's chooser is tested for (tests/test_gpu_session.py), assumed until a session measures them.
H200_PEAK, H200_POINTS = 783e12, ((256, 0.025), (4096, 0.115))
H200_LAUNCH_S = 10e-6
H200_COMPILE_S = 60.0


def h200_rate(items: float) -> float:
    """FLOP/s of the H200 of 2026-12-04 at `items` sequences a step (log-linear between its two measurements)."""
    (a, fa), (b, fb) = H200_POINTS
    x = min(1.0, max(0.0, math.log(max(items, 1) / a) / math.log(b / a)))
    return H200_PEAK * fa * (fb / fa) ** x


@dataclass
class Rates:
    """Seconds a device takes, each as the pieces pay it (no FLOP rate carried from one size to another; other sizes
    scale by their FLOPs a step and never go under their own launch floor).
    step_s: {members: seconds of one training step of the preset's model at its batch}, measured at 4 and 16
    members (a line in members between them); floor_s: the seconds of a step of a model too small to matter, per
    layer and loop step; eval_s: one member's evaluation pass (every difficulty, n = 1..3T) in the model training
    leaves (compiled where training compiles; on a GPU the group in one forward); refit_s: one refit step of
    head + last for the preset's group, as E3 runs it (on a copy of the model: eager); compile_s: a process's
    one-off seconds, paid once by the first unit that trains (every graph compiled: training, and evaluation under
    no-grad and TF32; eager, the first kernels' warm-up); eval_one_s: one member's evaluation pass alone from stored
    weights (the surgeries; default eval_s); refit_eval_s: one member's evaluation pass inside a refit (default
    eval_s)."""

    source: str
    step_s: dict
    floor_s: float
    eval_s: float
    refit_s: float
    compile_s: float = 0.0
    eval_one_s: float | None = None
    refit_eval_s: float | None = None

    def __post_init__(self):
        self.eval_one_s = self.eval_s if self.eval_one_s is None else self.eval_one_s
        self.refit_eval_s = self.eval_s if self.refit_eval_s is None else self.refit_eval_s

    @staticmethod
    def h200(preset_name: str = "gpu") -> Rates:
        """The H200 of 2026-12-04's, for `preset_name`'s model (module comment above)."""
        ref = preset(preset_name, "parity", "norm")
        per = flops.training_flops(ref, 1) / ref.train.steps  # one member's step, averaged over the schedule
        b, group = ref.train.batch_size, ref.train.group_size
        floor = H200_LAUNCH_S * 70 * 3  # a layer at a loop step, forward and backward
        calls = ref.model.layers_per_block * ref.model.trained_loops
        step = {m: max(floor * calls, m * per / h200_rate(m * b)) for m in (4, 16)}
        one_pass = flops.eval_flops(ref, 1)
        ev = one_pass / h200_rate(group * ref.task.eval_examples)  # a member of the group, batched
        forwards = len(ref.task.eval_difficulties) * math.ceil(ref.task.eval_examples / 256)  # evaluate's chunks
        launches = forwards * floor / 3 * ref.model.layers_per_block * ref.max_eval_loops  # a forward: a third
        alone = max(launches, one_pass / h200_rate(ref.task.eval_examples))  # one member alone, eager
        return Rates("the H200 of 2026-12-04 (issue 29: 2.5% and 11.5% of the bf16 peak; compile assumed "
                     f"{H200_COMPILE_S:.0f} s), not yet measured at the gpu preset", step, floor, ev,
                     max(floor * calls, group * per / h200_rate(group * b)), H200_COMPILE_S, alone, ev)  # fmt: skip

    @staticmethod
    def load(path: Path | None, preset_name: str = "gpu") -> Rates:
        """The rates a file holds (a session's calibration), else the H200's of 2026-12-04."""
        if path is not None and Path(path).is_file():
            d = json.loads(Path(path).read_text())
            optional = {k: float(d[k]) for k in ("eval_one_s", "refit_eval_s") if d.get(k) is not None}
            steps = {int(k): float(v) for k, v in d["step_s"].items()}
            return Rates(d["source"], steps, float(d["floor_s"]), float(d["eval_s"]), float(d["refit_s"]),
                         float(d.get("compile_s", 0.0)), **optional)  # fmt: skip
        return Rates.h200(preset_name)

    def to_dict(self) -> dict:
        return dict(source=self.source, step_s={str(k): v for k, v in self.step_s.items()}, floor_s=self.floor_s,
                    eval_s=self.eval_s, refit_s=self.refit_s, compile_s=self.compile_s, eval_one_s=self.eval_one_s,
                    refit_eval_s=self.refit_eval_s)  # fmt: skip

    def step(self, members: int) -> float:
        """Seconds of one step of the reference model for `members` members (linear through the measured points)."""
        (m0, s0), (m1, s1) = sorted(self.step_s.items())[0], sorted(self.step_s.items())[-1]
        slope = (s1 - s0) / (m1 - m0) if m1 != m0 else s1 / m1
        return max(0.0, s0 + slope * (members - m0))

    def floor(self, cfg: RunConfig) -> float:
        return self.floor_s * cfg.model.layers_per_block * cfg.model.trained_loops

    def train_s(self, cfg: RunConfig, members: int, ref: RunConfig, steps: int | None = None) -> float:
        """Seconds of training `members` seeds of cfg: the reference's seconds a step scaled by FLOPs a step, never
        under cfg's own floor a step."""
        steps = steps or cfg.train.steps
        scale = (flops.training_flops(cfg, 1, steps) / steps) / (flops.training_flops(ref, 1) / ref.train.steps)
        return steps * max(self.floor(cfg), self.step(members) * scale)

    def evals_s(self, cfg: RunConfig, members: int, passes: float, ref: RunConfig, each: float | None = None) -> float:
        """`passes` evaluation passes of `members` members of cfg at `each` seconds a member's pass of the reference
        (default eval_s: in the trained model)."""
        each = self.eval_s if each is None else each
        return passes * members * each * flops.eval_flops(cfg, 1) / flops.eval_flops(ref, 1)

    def trained_s(self, cfg: RunConfig, members: int, ref: RunConfig, surgery: bool = False) -> float:
        """A training unit: the group trained, evaluated in its own mode, and (surgery) evaluated once more without
        the norm from its stored weights, one member at a time (runs.ensure_surgery)."""
        alone = self.evals_s(cfg, members, 1, ref, self.eval_one_s) if surgery else 0.0
        return self.train_s(cfg, members, ref) + self.evals_s(cfg, members, 1, ref) + alone

    def rescale_s(self, cfg: RunConfig, members: int, ref: RunConfig) -> float:
        """The rescale surgery (e5.ensure_rescale), one member at a time from its stored weights: its evaluation pass,
        and before it the per-step scalars, measured on SCALE_EXAMPLES training items of each training length."""
        t = cfg.task
        passes = 1 + SCALE_EXAMPLES * len(t.train_difficulties) / (t.eval_examples * len(t.eval_difficulties))
        return self.evals_s(cfg, members, passes, ref, self.eval_one_s)

    def refits_s(self, cfg: RunConfig, members: int, targets, schedule, ref: RunConfig) -> float:
        """E3's refits: a head + last step at refit_s (the preset's group, scaled by members), the head alone a third
        of it, and (2 + targets x checkpoints) evaluation passes of every member at refit_eval_s."""
        steps = schedule[-1] * sum(1 / 3 if t == "head" else 1 for t in targets)
        per = max(self.floor(cfg), self.refit_s * members / ref.train.group_size)
        passes = 2 + len(targets) * (len(schedule) - 1)
        return steps * per + self.evals_s(cfg, members, passes, ref, self.refit_eval_s)


@dataclass
class Budget:
    """How long a command may still start work: no group after `start_by` seconds, nor one that its prediction
    (seconds from Rates) says would end after `limit`."""

    start_by: float
    limit: float
    t0: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def refusal(self, seconds: float) -> str | None:
        """None if a group predicted to take `seconds` may start now, else why not (one sentence)."""
        now = self.elapsed()
        if now > self.start_by:
            return f"not started: the budget of {self.start_by:.0f} s is spent ({now:.0f} s elapsed)"
        if now + seconds > self.limit:
            return (f"not started: predicted {seconds:.0f} s from the seconds a step measured, it would end at about "
                    f"{now + seconds:.0f} s, after the command's limit of {self.limit:.0f} s")  # fmt: skip
        return None
