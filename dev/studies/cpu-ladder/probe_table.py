"""The README's table of the 19M recipe probe, seed by seed, read from a results folder's shipped runs (nothing
computed): each seed's score (`norm` at n = T, ladder.recipe_score's number), the surgery (`norm->none`) and the
rescale (`norm->rescale`) at T, the rescale's recovery by the project's own rule (refit.recovery: NaN, shown "—",
where the surgery cost less than paper.MIN_REFIT_GAP), and the three modes at 3T.

    python dev/studies/cpu-ladder/probe_table.py [RESULTS]      (default cached_results)
"""

import json
import sys

from engine.core.presets import study_root
from engine.core.store import Store
from engine.experiments.refit import recovery
from engine.experiments.runs import RECIPE_PROBE_FILE
from engine.experiments.verdicts import MEAN, levels
from engine.runtime.cpu_ladder import PRESET

MODES = ("norm", "norm->none", "norm->rescale")


def at(rows, mode: str, times: int) -> float:
    """Held-out mean accuracy of one mode at n = times * T."""
    held = levels(rows[(rows["metric"] == "accuracy") & (rows["boundary"] == mode)])
    held = held[held["level"] == MEAN]
    return float(held[held["eval_loops"] == times * held["trained_loops"]]["value"].mean())


if __name__ == "__main__":
    store = Store(study_root(sys.argv[1] if len(sys.argv) > 1 else "cached_results", PRESET))
    record = json.loads((store.root / RECIPE_PROBE_FILE).read_text())
    print("| seed | `norm` at T (the score) | `norm->none` at T | `norm->rescale` at T | rescale recovered "
          "| at 3T: `norm`, `none`, `rescale` |\n|---|---|---|---|---|---|")  # fmt: skip
    for name, candidate in record["candidates"].items():
        for seed, key in enumerate(candidate["runs"]):
            rows = store.load_rows(key)
            norm, none, rescale = (at(rows, m, 1) for m in MODES)
            got = float(recovery(rescale, none, norm))
            shown = "—" if got != got else f"{got:.2f}"  # NaN: the surgery did no damage to recover
            late = ", ".join(f"{at(rows, m, 3):.3f}" for m in MODES)
            print(f"| {name} seed {seed} | {norm:.3f} | {none:.3f} | {rescale:.3f} | {shown} | {late} |")
