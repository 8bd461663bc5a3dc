"""The README's table of the ladder, rung by rung, read from a results folder's `cpu-ladder` E5 table: the surgery's
damage (`norm` − `norm->none`, held-out mean, mean over seeds 0–3 with its 95% bootstrap CI: e5.summarize) at n = T
and 3T, E2 (d)'s collapse criteria at T (ladder.collapse: the median seed's accuracy, top-token share and norm
ratio), and the rescale's recovery at T and 3T (e5.summarize, over the seeds the surgery cost ≥ 0.05); then the
rules and their reading (ladder.rules, ladder.reading).

    python dev/studies/cpu-ladder/ladder_table.py [RESULTS]      (default cached_results)
"""

import sys
from pathlib import Path

import pandas as pd

from dashboard import results
from engine.core.presets import study_root
from engine.experiments import e5, ladder
from engine.experiments.verdicts import MEAN
from engine.runtime.cpu_ladder import PRESET


def cell(s: pd.DataFrame, part: str, n: int) -> str:
    r = s[(s["part"] == part) & (s["eval_loops"] == n)]
    if r.empty or r["mean"].isna().all():
        return "—"
    r = r.iloc[0]
    if int(r["n"]) == 1:  # one damaged seed: no interval
        return f"{r['mean']:+.3f} (1 seed)"
    seeds = f" ({int(r['n'])} seeds)" if part == "rescale" else ""
    return f"{r['mean']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]{seeds}"


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "cached_results")
    table = pd.read_parquet(study_root(root, PRESET) / f"e5-{PRESET}.parquet")
    summary = e5.summarize(table, PRESET)
    s = summary[(summary["task"] == "parity") & (summary["level"] == MEAN)]
    T = int(s["trained_loops"].iloc[0])
    s = s[s["train_loops"] == f"fixed:{T}"]
    falls = ladder.collapse(ladder.held_out(ladder.ladder_rows(table, "cpu"))).set_index("params")
    print(f"| parameters | damage at T = {T} | damage at 3T | `norm->none` at T: accuracy, top-token share, norm ratio "
          "(median seed) | collapse | rescale recovery at T | at 3T |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for params, g in s.groupby("params"):
        f = falls.loc[params]
        print(f"| {params:,} | {cell(g, 'ladder', T)} | {cell(g, 'ladder', 3 * T)} | {f['accuracy']:.3f}, "
              f"{f['top_token_share']:.3f}, {f['norm_ratio']:.2f}× | {'yes' if f['collapsed'] else 'no'} "
              f"| {cell(g, 'rescale', T)} | {cell(g, 'rescale', 3 * T)} |")  # fmt: skip
    found = ladder.rules(table, None, ladder.every_rung(PRESET))
    print()
    for c in found:
        print(f"- {c.claim}: **{c.outcome}** ({c.measured})")
    claims = results.claims("e5", PRESET, root)["claims"]
    print("\n" + ladder.reading([dict(claim=c.claim, outcome=c.outcome, measured=c.measured) for c in found], claims))
