"""engine.studies: one entry per study, torch-free, read by presets, E5, the ladder rules and the dashboard."""

import subprocess
import sys

from engine import studies
from engine.core import presets, tasks
from engine.experiments import e5, ladder


def test_every_preset_has_one_study_entry_and_every_entry_a_preset():
    assert set(studies.STUDIES) == set(presets.PRESETS)
    assert studies.TASKS == tasks.TASK_NAMES
    for name, entry in studies.STUDIES.items():
        assert entry.name == name and entry.device in ("CPU", "GPU") and entry.precision in presets.PRECISIONS
        assert set(entry.tasks) <= set(tasks.TASK_NAMES) and set(entry.e5_parts) <= {1, 2, 3, 4}
        assert not entry.ladder_partner or entry.ladder_partner in studies.STUDIES
        for task in entry.tasks:  # the preset builds every task its entry names
            presets.preset(name, task)
    assert sorted(s.order for s in studies.STUDIES.values()) == list(range(len(studies.STUDIES)))


def test_the_engine_reads_the_entries_not_tables_of_its_own():
    assert presets.OWN_FOLDER == {s.name: s.folder for s in studies.STUDIES.values() if s.folder}
    assert presets.tasks_of("cpu-agree") == ("parity",) and e5.parts("cpu-agree") == (1, 4)
    assert set(ladder.LADDER_STUDIES) == {"cpu", "gpu", "cpu-ladder"}
    assert e5.ladder("cpu-agree", "parity") == []  # no part 3


def test_the_module_imports_nothing_heavy():
    code = "import sys, engine.studies; print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
