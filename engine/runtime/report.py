"""`loopscope report`: the static HTML report of a results folder (one self-contained index.html).

The page is assembled by dashboard.report (the same claim cards and chart builders as the dashboard); it is
imported here only inside the function, so importing engine never imports the dashboard (which imports engine).
"""

from __future__ import annotations

from pathlib import Path


def write(out: Path, results: Path, preset_name: str | None = None) -> Path:
    """Write <out>/index.html for the tables under results (at preset_name where present); return its path."""
    from dashboard import report  # lazy: dashboard sits above engine

    return report.write(Path(out), Path(results), preset_name)
