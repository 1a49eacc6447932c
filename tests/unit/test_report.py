"""The README's generated sections, from small hand-built documents: the fault-injection
table, and the throughput section's reading of FOR UPDATE against SKIP LOCKED."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pgqueue_bench.report import pages as report


def _server_crash(**figures: Any) -> dict[str, Any]:
    """The crash scenario's entry: its identity and counts, plus ``figures``."""
    return {
        "test": "tests/faults/test_fault_server_crash.py::test_crash",
        "recorded_at": "2026-11-30T05:12:01+00:00",
        "fault": "PostgreSQL crash mid claims and acks",
        "jobs": 300,
        "lost": 0,
        "duplicates": 0,
        **figures,
    }


def _faults_document(*, hunt_seconds: float = 60.0) -> dict[str, Any]:
    """Two versions; 18 ran a scenario 15 did not, and one scenario has no recovery."""
    return {
        "benchmark": "faults",
        "created_at": "2026-11-30T05:14:39+00:00",
        "environment": {
            "machine": {
                "cpu_count": 2,
                "cpu_model": "AMD EPYC",
                "memory_gib": 23.5,
                "python": "3.11.7",
            },
        },
        "postgresql": {
            "15": {
                "server": "private clusters, system PostgreSQL 15 binaries",
                "version": "PostgreSQL 15.20",
                "scenarios": {
                    "01-server-crash": _server_crash(
                        redeliveries=1,
                        pause_seconds=0.948,
                        recovery_seconds=0.584,
                        producer_refusals=2,
                    ),
                    "08-deadlock-hunt": {
                        "fault": "everything that locks jobs at once",
                        "jobs": 1500,
                        "lost": 0,
                        "duplicates": 0,
                        "redeliveries": 500,
                        "pause_seconds": 0.2,
                        "seconds": hunt_seconds,
                        "deadlocks": 0,
                    },
                },
            },
            "18": {
                "server": "private clusters, embedded PostgreSQL 18 binaries",
                "version": "PostgreSQL 18.4",
                "scenarios": {
                    "01-server-crash": _server_crash(
                        redeliveries=3,
                        handler_runs=303,
                        pause_seconds=0.977,
                        recovery_seconds=0.637,
                        producer_refusals=4,
                    ),
                    "05-disk-full": {
                        "fault": "the queue's tablespace filled",
                        "jobs": 580,
                        "lost": 0,
                        "duplicates": 0,
                        "redeliveries": 0,
                        "pause_seconds": 1.954,
                        "recovery_seconds": 0.132,
                        "workers_saw_disk_full": True,
                        "server_limits": {"statement_timeout": "1s"},
                    },
                    "08-deadlock-hunt": {
                        "fault": "everything that locks jobs at once",
                        "jobs": 1912,
                        "lost": 0,
                        "duplicates": 0,
                        "redeliveries": 645,
                        "pause_seconds": 0.244,
                        "seconds": hunt_seconds,
                        "deadlocks": 0,
                    },
                },
            },
        },
    }


def _rows(lines: list[str]) -> dict[str, list[str]]:
    """The table's body rows by fault text, each as its list of cells."""
    rows = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("#", "---"):  # not header or rule
            rows[cells[1]] = cells
    return rows


def test_the_faults_table_has_one_row_per_scenario_with_each_versions_figures():
    lines = report.faults_section(_faults_document())

    assert lines[0] == "### Fault injection: nothing lost"
    header = next(line for line in lines if line.startswith("| #"))
    # Newest version first, each with its counts and its timing column.
    assert header == (
        "| # | fault | PostgreSQL 18.4: jobs · lost · duplicates · redelivered "
        "| 18.4: recovery (pause) s | PostgreSQL 15.20: jobs · lost · duplicates · redelivered "
        "| 15.20: recovery (pause) s | also measured (18.4) |"
    )
    rows = _rows(lines)
    assert list(rows) == [
        "PostgreSQL crash mid claims and acks",
        "the queue's tablespace filled",
        "everything that locks jobs at once",
    ]
    assert rows["PostgreSQL crash mid claims and acks"] == [
        "1",
        "PostgreSQL crash mid claims and acks",
        "300 · 0 · 0 · 3",
        "0.64 (0.98)",
        "300 · 0 · 0 · 1",
        "0.58 (0.95)",
        "producer refusals 4",  # the newest version's own figures
    ]
    assert rows["everything that locks jobs at once"][2:6] == [
        "1,912 · 0 · 0 · 645",
        "- (0.24)",  # no recovery figure: the pause alone
        "1,500 · 0 · 0 · 500",
        "- (0.20)",
    ]


def test_a_version_that_did_not_run_a_scenario_shows_dashes():
    rows = _rows(report.faults_section(_faults_document()))

    disk_full = rows["the queue's tablespace filled"]
    assert disk_full[:4] == ["5", "the queue's tablespace filled", "580 · 0 · 0 · 0", "0.13 (1.95)"]
    assert disk_full[4:6] == ["-", "-"]
    # Booleans read yes/no, dicts k=v, underscores become spaces in names only.
    assert disk_full[6] == "workers saw disk full yes; server limits statement_timeout=1s"


def test_a_missing_common_figure_shows_a_dash_in_its_place():
    document = _faults_document()
    race = {"fault": "a reaper racing late acks", "jobs": 120, "lost": 0, "duplicates": 0}
    document["postgresql"]["18"]["scenarios"]["07-reaper-ack-race"] = race

    row = _rows(report.faults_section(document))["a reaper racing late acks"]

    assert row[2:4] == ["120 · 0 · 0 · -", "-"]
    assert row[-1] == "-"


def test_the_faults_footer_names_the_machine_the_versions_and_the_hunt():
    footer = report.faults_footer(_faults_document())

    assert footer.startswith("Ran on: 2 CPUs (AMD EPYC), 23.5 GiB, PostgreSQL 18.4 (private")
    assert "PostgreSQL 15.20 (private clusters, system PostgreSQL 15 binaries)" in footer
    assert "`python3 -m nox -s faults` (60 s deadlock hunt)" in footer
    assert footer.endswith("Raw data: `results/faults.json`.")
    # A shorter hunt (the default suite's) is not passed off as the faults session's.
    shorter = report.faults_footer(_faults_document(hunt_seconds=10.0))
    assert "with a 10 s deadlock hunt" in shorter


def test_render_includes_the_faults_document_though_it_has_no_runs(tmp_path: Path):
    (tmp_path / "faults.json").write_text(json.dumps(_faults_document()))
    (tmp_path / "restart.json").write_text(json.dumps({"benchmark": "restart", "runs": []}))

    rendered = report.render(tmp_path)

    assert "### Fault injection: nothing lost" in rendered
    assert "### Restart" not in rendered  # an empty document still counts for nothing
    assert rendered.rstrip().endswith("Raw data: `results/faults.json`.")
    assert "PostgreSQL ?" not in rendered


def test_has_figures_counts_runs_or_scenarios():
    assert report.has_figures({"runs": [{"mode": "fast"}]})
    assert report.has_figures(_faults_document())
    assert not report.has_figures({"postgresql": {"18": {"scenarios": {}}}})
    assert not report.has_figures({"runs": []})
    assert not report.has_figures(None)


def _throughput(skip_locked: float, for_update: float) -> dict:
    runs = [
        {"mode": mode, "workers": workers, "jobs_per_second": rate, "seconds": 5000 / rate}
        for workers in (1, 2)
        for mode, rate in (("skip-locked", skip_locked), ("for-update", for_update))
    ]
    return {"runs": runs, "parameters": {"jobs": 5000}, "environment": {}}


def test_the_throughput_section_explains_a_for_update_that_costs_little():
    text = "\n".join(report.throughput_section(_throughput(400.0, 380.0)))
    assert "0.95x at 1, 0.95x at 2" in text
    assert "the lease, not the row lock, keeps the job" in text
    assert "one-job claims per second reached here (400)" in text


def test_the_throughput_section_explains_nothing_when_skip_locked_wins():
    text = "\n".join(report.throughput_section(_throughput(400.0, 200.0)))
    assert "0.50x at 1, 0.50x at 2" in text
    assert "the lease, not the row lock" not in text


def test_the_throughput_section_names_runs_shorter_than_a_second():
    text = "\n".join(report.throughput_section(_throughput(400.0, 380.0)))
    assert "The shortest run" not in text  # 12.5 s and 13.2 s
    text = "\n".join(report.throughput_section(_throughput(8000.0, 6250.0)))
    assert "The shortest run lasted 0.62 s." in text


def test_the_throughput_section_compares_one_job_per_claim_with_the_naive_loop():
    document = _throughput(600.0, 580.0)
    for run in document["runs"]:
        run.update(client_cpu_us_per_job=1000.0, server_cpu_us_per_job=800.0)
    document["runs"] += [
        {
            "mode": "naive-loop",
            "workers": workers,
            "jobs_per_second": rate,
            "seconds": 5000 / rate,
            "client_cpu_us_per_job": 450.0,
            "server_cpu_us_per_job": 1200.5,
        }
        for workers, rate in ((1, 480.0), (2, 750.0))
    ]
    text = "\n".join(report.throughput_section(document))
    assert "by processes: 1.25x at 1, 0.80x at 2." in text
    assert "| 1 | 1,000 / 800 | 1,000 / 800 | 450 / 1,200 |" in text


def test_the_throughput_section_has_no_naive_loop_line_without_its_runs():
    text = "\n".join(report.throughput_section(_throughput(400.0, 380.0)))
    assert "naive loop" not in text and "CPU per job" not in text


def test_the_model_table_has_a_row_per_version_newest_first(tmp_path: Path):
    run = {"seconds": 900.4, "examples": 310, "steps": 15021, "invariant_checks": 30354}
    document = {
        "benchmark": "model",
        "created_at": "2026-12-01T23:40:00+00:00",
        "environment": {"machine": {"cpu_count": 2, "python": "3.11.7"}},
        "postgresql": {"15": {**run, "failures": 0}, "18": {**run, "failures": 0}},
    }
    (tmp_path / "model.json").write_text(json.dumps(document))

    rendered = report.render(tmp_path)

    assert "| PostgreSQL 18 | 15 min | 310 | 15,021 | 30,354 | 0 |" in rendered
    assert rendered.index("PostgreSQL 18") < rendered.index("PostgreSQL 15")
    assert rendered.rstrip().endswith("Raw data: `results/model.json`.")
    assert not report.has_figures({"benchmark": "model", "postgresql": {}})
