"""The studies, one declared entry each: what a study is, where it lives, what it runs and how its pages read it.

Torch-free (no import beyond the standard library), so the dashboard's first page, the engine and the campaign
runners all read the same entry: presets build a study's configs, E5 reads its parts and ladder, the dashboard its
folder, device, order and note. Adding a study is one entry here, a preset function in engine/core/presets.py, and
its rules in docs/.

A ladder rung is (d_model, n_heads, d_ff, layers_per_block, steps as a multiple of the preset's); the preset's own
model is E2's config.
"""

from __future__ import annotations

from dataclasses import dataclass

Rung = tuple[int, int, int, int, int]
TASKS = ("parity", "chain")  # engine.core.tasks.TASK_NAMES (tests/test_studies.py keeps them equal)


@dataclass(frozen=True)
class Study:
    name: str  # the preset's name (`--preset NAME`)
    note: str  # what the overview says of it, in a sentence or three (Markdown)
    order: int  # the default study is the present one of lowest order with an E2 table (largest scale first)
    folder: str = ""  # its runs and tables live in <results>/<folder>/ ("": the results folder itself)
    device: str = "CPU"  # the device it was designed for
    precision: str = "fp32"  # what its runs train in on the CPU (a GPU trains under bf16 autocast either way)
    tasks: tuple[str, ...] = TASKS
    e5_parts: tuple[int, ...] = (1, 2, 3, 4)
    ladder: tuple[Rung, ...] = ()  # E5 part 3's rungs besides the preset's own model
    ladder_tasks: tuple[str, ...] = TASKS  # the tasks its ladder covers
    ladder_partner: str = ""  # a lower study whose ladder this one's continues (the E5 figure draws them together)
    continues: bool = False  # E5 trains the partner's rungs itself where the two recipes differ (e5.continues)
    partner_recipe: str = ""  # the recipe the partner's rungs were trained with (its GPU_RECIPES name)
    ladder_rules: bool = False  # the ladder rules over 16k-19M (engine.experiments.ladder) read its ladder
    recipe_probe: bool = False  # a recipe probe in its folder adopts its recipe; nothing else trains before it has
    parity_like_chain: bool = False  # its chain is the ordered single chain, a parity-like control
    shown: bool = True  # offered by the dashboard's study picker (False: a structure for tests and dry runs)

    @property
    def ladder_only(self) -> bool:
        """Whether it runs none of E5's parts 1-2 (a study of the ladder and the rescale surgery)."""
        return not {1, 2} & set(self.e5_parts)


CPU_LADDER_RUNGS: tuple[Rung, ...] = ((32, 2, 96, 1, 1), (64, 4, 176, 1, 1), (64, 4, 176, 2, 1), (96, 4, 256, 2, 1),
                                      (128, 4, 352, 2, 1), (64, 4, 176, 2, 2))  # fmt: skip

STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("paper", order=0, note="The paper's scale: 6 sandwich layers of width 512 looped 4 times (19M), both "
          "tasks; a GPU preset.", device="GPU",
          ladder=((128, 4, 352, 2, 1), (256, 8, 704, 2, 1), (256, 8, 704, 6, 1), (384, 8, 1024, 6, 1),
                  (512, 8, 1376, 6, 1), (512, 8, 1376, 6, 2))),
    Study("gpu", order=1, folder="gpu", device="GPU", tasks=("parity",), e5_parts=(3, 4), ladder_tasks=("parity",),
          ladder_partner="cpu", ladder_rules=True,
          ladder=((128, 4, 352, 2, 1), (256, 8, 704, 2, 1), (384, 8, 1024, 3, 1), (512, 8, 1376, 6, 1)),
          note="The GPU study, at the paper's scale (docs/gpu-study.md): the second CPU study's parity (held-out "
          "lengths, T = 4) on the paper's 19M model, E2 and E3 with 16 seeds, and E5's ladder (412,288 parameters, the "
          "bridge also run on the CPU, to 19M) with the rescale surgery on every rung; judged by the second CPU "
          "study's rules, unchanged. No E4, no E5 parts 1–2. Its runs and tables live in `gpu/` under the results "
          "folder."),
    Study("cpu-ladder", order=2, folder="cpu-ladder", tasks=("parity",), e5_parts=(3, 4), ladder_tasks=("parity",),
          ladder_partner="cpu", continues=True, partner_recipe="R1", ladder_rules=True, recipe_probe=True,
          ladder=((256, 8, 704, 2, 1), (384, 8, 1024, 3, 1), (512, 8, 1376, 6, 1)),
          note="The GPU study's ladder above 412k parameters (1.6M, 5.3M and the paper's 19M), trained on the CPU in "
          "fp32, one seed a group, under the GPU study's rules unchanged (docs/gpu-study.md); its 19M rung is the "
          "recipe probe; whether its rungs below 412k are the `cpu` study's depends on the recipe the probe adopts "
          "(the pages and the report say which)."),
    Study("cpu-agree", order=3, folder="cpu-agree", tasks=("parity",), e5_parts=(1, 4), ladder_tasks=("parity",),
          note="The train × run design at 1.6M (docs/design.md §10): the ladder's 1.6M model trained `norm` and "
          "`none`, 16 seeds, each run both ways (`norm->none`, `none->norm`) and rescaled; agreement with the "
          "trained loop against the state's growth, on accuracy and on the margin."),
    Study("cpu", order=4, ladder=CPU_LADDER_RUNGS, ladder_tasks=("parity",), parity_like_chain=True, ladder_rules=True,
          note="The second CPU study: held-out in-range items, two layers per block, verdicts by docs/design.md's "
          "rules under the paper's analysis and the paired one. Its chain is the ordered single chain, a "
          "**parity-like control**: no chain that needs retrieval by name trained at this size within the search "
          "budget (held-out k = 1..4 at chance, dev/LOG.md). The retrieval chain runs at the paper preset."),
    Study("cpu-1layer", order=5, parity_like_chain=True,
          note="The first CPU study, kept as an earlier design: one layer per block, in-range items mostly seen in "
          "training (no held-out split: judged by the second design's rules, its in-range items standing in for "
          "held-out ones), and a **parity-like control** for the chain (one ordered chain: the answer is the root bit "
          "XOR the parity of the `not`s). The second design (preset `cpu`) replaces it."),
    Study("gpu-smoke", order=6, folder="gpu-smoke", device="GPU", tasks=("parity",), e5_parts=(3, 4),
          ladder_tasks=("parity",), ladder_partner="cpu",
          ladder=((16, 2, 48, 1, 1), (16, 2, 48, 2, 1), (24, 2, 64, 2, 1), (32, 2, 96, 2, 1)),
          note="The GPU study's structure at a size the CPU runs in seconds (dry runs and tests): not a result."),
    Study("smoke", order=7, ladder=((16, 2, 48, 1, 1), (32, 2, 96, 1, 1)),
          note="Seconds on a laptop core: for tests and for trying the commands; not a result."),
)}  # fmt: skip


def study(name: str) -> Study:
    """The entry of study `name`; ValueError with a sentence naming the studies otherwise."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {str(name)[:40]!r}; choose one of {', '.join(STUDIES)}.")
    return STUDIES[name]


def own_folders() -> dict[str, str]:
    """Study -> its folder under the results folder, for the studies that have one (only these are ever read)."""
    return {s.name: s.folder for s in STUDIES.values() if s.folder}


def by_order() -> list[str]:
    """The studies, largest scale first (the default study is the first one present)."""
    return [s.name for s in sorted(STUDIES.values(), key=lambda s: s.order)]
