"""The paper's reported figures and the study's thresholds, each once, with where it comes from.

Paper: "Agreement rather than normalisation keeps depth reusable in looped language models" (Oct 2026),
its abstract and the research design (both in docs/design.md). Every summary, claim
and page reads these names; nothing else writes the numbers.
"""

from __future__ import annotations

# -- what the paper reports
TRAINED_LOOPS_OURO = 4  # Ouro's total_ut_steps (docs/design.md §1)
SURGERY_ACCURACY_AT_T = 0.0  # abstract: removing the norm takes Ouro-1.4B and -2.6B to 0.000 by n = T
SURGERY_NORM_RATIO = 2.021  # abstract: the state norm stays within a factor of 2.021 after removal
MAX_DELTA_BEYOND = 0.867  # abstract: Cliff's delta (none vs norm) up to 0.867 beyond the budget
HEAD_REFIT_RECOVERY = 1 / 3  # abstract: refitting the head recovers "a third" of the lost accuracy, then plateaus
HEAD_LAST_REFIT_RECOVERY = 1.0  # abstract: refitting the last block layer with it recovers "all of it"
PAPER_PARAMS = 19_000_000  # abstract: "19M-parameter models trained from scratch"
PAPER_SEEDS = 16  # abstract: "16 seeds per configuration"
CHANCE = 0.5  # both tasks have balanced binary answers (docs/design.md §2)

# -- statistics (docs/design.md §4)
DELTA_MAGNITUDES = ((0.147, "negligible"), (0.33, "small"), (0.474, "medium"))  # Romano et al. (2006) cut-offs
ALPHA = 0.05  # significance level of every test

# -- the study's own thresholds (docs/design.md, "Verdict rules")
HEAD_RECOVERY_RANGE = (0.2, 0.5)  # E3 (a): "about a third" = mean recovery within this range (and a plateau)
FULL_RECOVERY = 0.9  # E3 (b): "all of it" = mean recovery at least this
MIN_REFIT_GAP = 0.05  # E3: recovery is NaN where the surgery cost a seed less than this (nothing to recover)
PLATEAU_TOL, PLATEAU_WINDOW = 0.02, 2  # E3: plateau = each of the last 2 doublings of steps moves < 0.02
SURGERY_COLLAPSE_ACCURACY = 0.55  # E2 (d): "collapses" = accuracy at T at most this
SURGERY_ONE_TOKEN_SHARE = 0.9  # E2 (d): "the head commits to one token" = top-token share at least this
SURGERY_NORM_BOUND = 3.0  # E2 (d): "norm bounded" = max/min state norm over steps at most this
