"""The README's results section is what ``pgqueue bench report`` generates from the
results files beside it: a results file changed without ``nox -s docs`` fails here."""

from __future__ import annotations

from pathlib import Path

from pgqueue_bench import report

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_results_section_is_generated_from_results():
    current = (ROOT / "README.md").read_text()
    generated = report.replace_between_markers(current, report.render(ROOT / "results"))
    assert generated == current, "README.md is out of date: run `nox -s docs`"
