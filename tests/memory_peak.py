"""One memory case on the CPU: the estimate (engine.core.memory) against this process's peak RSS.

Trains `--steps` steps of a preset's run (its model, task and training changed by --change) and evaluates it as a
study does, then prints `estimate_bytes peak_bytes`. The peak is VmHWM, the high-water mark of this process's own
memory since it started, evaluation included (ru_maxrss would carry a forking parent's). One process per case;
run it with OMP_NUM_THREADS=1 on a quiet machine. tests/test_untrusted.py and the LOG's table use it.

    python tests/memory_peak.py --preset smoke --change '[{}, {"eval_examples": 1000000}, {}]'
    python tests/memory_peak.py --preset cpu --task chain --seeds 16
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--task", default="parity")
    parser.add_argument("--seeds", type=int, default=1, help="members trained together (the group size)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--change", default="[{}, {}, {}]", help="JSON [model, task, train] field changes")
    args = parser.parse_args()

    from engine.core.memory import estimate
    from engine.core.presets import preset
    from engine.experiments.runs import train_and_evaluate

    cfg = preset(args.preset, args.task, "norm")
    model, task, train = json.loads(args.change)
    train = dict(steps=args.steps, warmup_steps=1, group_size=args.seeds, **train)
    cfg = replace(cfg, model=replace(cfg.model, **model), task=replace(cfg.task, **task),
                  train=replace(cfg.train, **train))  # fmt: skip
    estimated = estimate(cfg, args.seeds, "cpu").peak_bytes  # first, as `loopscope` does before it trains
    train_and_evaluate(cfg, list(range(args.seeds)), "e2", "cpu", progress=False)
    status = Path("/proc/self/status").read_text()
    peak = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
    print(estimated, peak)


if __name__ == "__main__":
    main()
