"""The generated parts of the documentation are what the code and the results files
give now: the results page's tables (``results/*.json``), the README's figures of the
effects run (``results/effects.json``) and the command-line reference (the click
commands). A change to either that was not followed by `nox -s
docs` fails here, naming the stale page."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from pgqueue_bench.report import cli_reference
from pgqueue_bench.report import pages as report

ROOT = Path(__file__).resolve().parents[2]


def _generated_part(page: Path, begin: str, end: str) -> str:
    text = page.read_text()
    return text[text.index(begin) + len(begin) + 1 : text.index(end)]


def test_the_results_page_holds_the_tables_of_the_results_files() -> None:
    page = ROOT / "results" / "README.md"
    assert _generated_part(page, report.BEGIN_MARKER, report.END_MARKER) == report.render(
        ROOT / "results"
    )


def test_the_readme_holds_the_figures_of_the_effects_results_file() -> None:
    page = ROOT / "README.md"
    generated = _generated_part(page, report.README_BEGIN_MARKER, report.README_END_MARKER)
    assert generated == report.render_readme(ROOT / "results")
    # Under the guarantees it gives the figures of.
    guarantees = page.read_text().split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    assert report.README_BEGIN_MARKER in guarantees


def test_the_command_line_page_holds_every_command_as_the_code_defines_it() -> None:
    page = ROOT / "docs" / "cli.md"
    generated = _generated_part(page, cli_reference.BEGIN_MARKER, cli_reference.END_MARKER)
    assert generated == cli_reference.render()
    # Every command of every distribution is there, with the flags it parses.
    for heading in ("`pgqueue worker`", "`pgqueue api`", "`pgqueue queue set`", "`pgqueue bench`"):
        assert f"### {heading}\n" in generated
    assert "| `--concurrency` `INTEGER RANGE` | `PGQUEUE_CONCURRENCY` | `32` |" in generated


def test_report_check_names_a_stale_page_and_fails(tmp_path: Path) -> None:
    results_page = tmp_path / "results.md"
    cli_page = tmp_path / "cli.md"
    readme_page = tmp_path / "README.md"
    results_page.write_text(f"{report.BEGIN_MARKER}\nold\n{report.END_MARKER}\n")
    cli_page.write_text(f"{cli_reference.BEGIN_MARKER}\n{cli_reference.END_MARKER}\n")
    readme_page.write_text(f"{report.README_BEGIN_MARKER}\n{report.README_END_MARKER}\n")
    arguments = [
        "--results-page",
        str(results_page),
        "--cli-page",
        str(cli_page),
        "--readme-page",
        str(readme_page),
        "--results-dir",
        str(ROOT / "results"),
    ]
    stale = CliRunner().invoke(report.report_command, [*arguments, "--check"])
    assert stale.exit_code == 1
    assert f"{results_page}, {cli_page}, {readme_page} out of date" in stale.output
    assert "old" in results_page.read_text()  # --check writes nothing

    written = CliRunner().invoke(report.report_command, arguments)
    assert written.exit_code == 0, written.output
    fresh = CliRunner().invoke(report.report_command, [*arguments, "--check"])
    assert fresh.exit_code == 0, fresh.output
    assert "### `pgqueue worker`" in cli_page.read_text()
    assert "`pgqueue bench effects`" in readme_page.read_text()
