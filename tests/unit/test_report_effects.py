"""``pgqueue bench effects``' figures, verdict and results section, from hand-built
runs: what counts as missing and duplicated, what fails the verdict, and the table."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pgqueue import Job, JobState
from pgqueue_bench.report import pages as report
from pgqueue_bench.report.durability import model_section
from pgqueue_bench.scenarios.effects.driver import FAULT_KINDS, handler_figures, verdict

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def _job(job_id: int, state: JobState = JobState.SUCCEEDED, attempts: int = 1) -> Job:
    return Job(
        id=job_id,
        queue="bench_effects",
        task="effects_plain",
        payload={"seq": job_id},
        priority=0,
        state=state,
        run_at=NOW,
        attempts=attempts,
        max_attempts=25,
        timeout_seconds=None,
        lease_token=uuid.uuid4() if state is JobState.RUNNING else None,
        lease_expires_at=None,
        worker_id=None,
        enqueued_at=NOW,
        started_at=NOW,
        finished_at=NOW if state is JobState.SUCCEEDED else None,
        last_error=None,
        errors=[],
        result=None,
        idempotency_key=None,
    )


def _figures(**changed: int) -> dict[str, Any]:
    figures = {
        "jobs": 100,
        "jobs_succeeded": 100,
        "handler_runs": 130,
        "rows": 100,
        "missing": 0,
        "duplicated": 0,
        "jobs_duplicated": 0,
        "most_rows_of_one_job": 1,
        "rows_of_jobs_not_succeeded": 0,
        "completions_refused": 7,
        "failed_attempts_recorded": 30,
        "jobs_with_expired_lease": 12,
    }
    return figures | changed


def _run(fenced: dict[str, Any] | None = None, plain: dict[str, Any] | None = None) -> dict:
    fenced = fenced or _figures()
    return {
        "handlers": {
            "fenced": {
                **fenced,
                "by_way": {
                    "transaction": _figures(jobs=50, jobs_succeeded=50, rows=50),
                    "own_connection": _figures(jobs=50, jobs_succeeded=50, rows=50),
                },
            },
            "plain": plain or _figures(rows=112, duplicated=12, jobs_duplicated=9),
        },
        "lost": 0,
        "completed_twice": 0,
        "acks_committed": 200,
        "unacknowledged_jobs": 0,
        "faults_injected": dict.fromkeys(FAULT_KINDS, 3),
        "faults_failed": [],
        "faults": [],
        "wall_seconds": 95.25,
        "timed_out": False,
        "workers_started": 10,
        "unexpected_worker_exits": [],
    }


def test_missing_counts_jobs_without_a_row_and_duplicated_the_rows_beyond_the_first() -> None:
    jobs = [_job(1), _job(2), _job(3), _job(4, JobState.RUNNING)]
    rows_of = {1: 1, 2: 3, 4: 2}
    runs = [(1, 1, "t", 9), (2, 1, "t", 9), (2, 2, "t", 9), (99, 1, "t", 9)]
    figures = handler_figures(jobs, rows_of, runs, refused=[(2, 1, "t", 9), (99, 1, "t", 9)])
    assert figures["missing"] == 1  # job 3
    assert figures["duplicated"] == 2 + 1  # job 2's two extra rows, job 4's one
    assert figures["jobs_duplicated"] == 2
    assert figures["most_rows_of_one_job"] == 3
    assert figures["rows"] == 6
    assert figures["rows_of_jobs_not_succeeded"] == 2
    # Only the runs and refusals of these jobs count.
    assert figures["handler_runs"] == 3 and figures["completions_refused"] == 1
    assert (figures["jobs"], figures["jobs_succeeded"]) == (4, 3)


def test_the_verdict_passes_with_the_fenced_rows_exactly_once_and_plain_duplicates() -> None:
    judged = verdict(_run())
    assert judged["passed"] and judged["fenced_exactly_once"] and judged["every_job_succeeded"]
    assert judged["plain_shows_duplicates"] and judged["plain_duplicated"] == 12
    assert (judged["fenced_missing"], judged["fenced_duplicated"]) == (0, 0)


def test_a_duplicate_or_missing_fenced_row_fails_the_verdict() -> None:
    duplicate = verdict(_run(fenced=_figures(rows=101, duplicated=1, jobs_duplicated=1)))
    assert not duplicate["passed"] and not duplicate["fenced_exactly_once"]
    missing = verdict(_run(fenced=_figures(rows=99, missing=1)))
    assert not missing["passed"] and missing["fenced_missing"] == 1


def test_an_unfinished_job_a_double_ack_or_a_fault_not_injected_fails_the_verdict() -> None:
    unfinished = _run(plain=_figures(jobs_succeeded=99))
    assert not verdict(unfinished)["every_job_succeeded"]
    twice = _run()
    twice["completed_twice"] = 1
    assert not verdict(twice)["passed"]
    short = _run()
    del short["faults_injected"]["server_crash"]
    assert not verdict(short)["every_fault_kind_injected"] and not verdict(short)["passed"]


def test_a_run_without_plain_duplicates_passes_but_says_so() -> None:
    judged = verdict(_run(plain=_figures()))
    assert judged["passed"] and not judged["plain_shows_duplicates"]


def _document(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "effects",
        "created_at": "2026-12-06T10:00:00+00:00",
        "environment": {
            "machine": {"cpu_count": 2, "cpu_model": "AMD EPYC", "memory_gib": 23.5},
            "postgresql": {
                "server": "private cluster, embedded PostgreSQL 18 binaries",
                "version": "PostgreSQL 18.4 on x86_64",
                "settings": {"fsync": "on", "synchronous_commit": "on"},
            },
        },
        "parameters": {
            "jobs": 100,
            "workers": 4,
            "concurrency": 4,
            "lease_seconds": 2.0,
            "work_ms": [50.0, 250.0],
            "fault_every": [1.0, 3.0],
        },
        "runs": [run],
        "summary": verdict(run),
    }


def test_the_section_has_a_row_per_way_and_handler_and_names_the_faults(tmp_path: Path) -> None:
    (tmp_path / "effects.json").write_text(json.dumps(_document(_run())))
    page = report.render(tmp_path)
    assert "### Side effects: exactly once when the handler completes in its transaction" in page
    assert "| fenced, `with job.transaction()` | 50/50 | 130 | 50 | 0 | 0 | 0 | 7 |" in page
    assert "| **fenced**, both ways | 100/100 | 130 | 100 | 0 | 0 | 0 | 7 |" in page
    assert "| **plain**: insert, then return | 100/100 | 130 | 112 | 0 | 12 | 9 | 7 |" in page
    assert "a worker SIGKILLed: 3;" in page and "`pg_ctl stop -m immediate`, then start: 3" in page
    assert "Verdict: passed. Jobs completed twice in the audit trail: 0." in page
    assert "PostgreSQL 18.4 (private cluster, embedded PostgreSQL 18 binaries" in page
    assert "Raw data: `results/effects.json`." in page


def test_the_readme_gives_both_handlers_figures_and_links_the_section(tmp_path: Path) -> None:
    assert report.render_readme(tmp_path).count("\n") == 1  # no run: the comment alone
    (tmp_path / "effects.json").write_text(json.dumps(_document(_run())))
    readme = report.render_readme(tmp_path)
    assert "PostgreSQL 18.4 on a private cluster, 2026-12-06" in readme
    assert "100 jobs of each of two handlers, interleaved, under 12 faults" in readme
    assert "left 100 rows for its 100 succeeded jobs: **0 missing, 0 duplicated**" in readme
    assert "(7 stale completions refused with `LeaseLost`" in readme
    assert "left 112 rows for its 100: 0 missing, 12 duplicated" in readme
    heading = "side-effects-exactly-once-when-the-handler-completes-in-its-transaction"
    assert f"(results/README.md#{heading})" in readme


def test_the_model_section_names_completions_only_when_the_run_had_them() -> None:
    def document(rules: dict[str, int]) -> dict[str, Any]:
        run = {"seconds": 120, "examples": 1, "steps": 2, "invariant_checks": 3, "failures": 0}
        return {"postgresql": {"18": {**run, "rules": rules}}}

    with_them = "\n".join(model_section(document({"complete_pending": 4, "claim": 9})))
    assert "completions with an application row in the holder's own transaction" in with_them
    assert "one application row per job completed in a committed transaction" in with_them
    without = "\n".join(model_section(document({"claim": 9})))
    assert "completions" not in without and "application row" not in without
