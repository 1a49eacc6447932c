"""The example tasks, run by a real burst worker on a real PostgreSQL through the
fixtures of pytest-pgqueue, as a plugin author would test their own handlers."""

import logging

from pgqueue import JobState


def test_echo_returns_its_payload(pgqueue_queue, pgqueue_run_jobs):
    pgqueue_queue.enqueue("echo", {"hello": "world"})
    (job,) = pgqueue_run_jobs()
    assert (job.state, job.result) == (JobState.SUCCEEDED, {"hello": "world"})


def test_sleep_reports_how_long_it_slept(pgqueue_queue, pgqueue_run_jobs):
    pgqueue_queue.enqueue("sleep", {"seconds": 0.01})
    (job,) = pgqueue_run_jobs()
    assert job.result == {"slept": 0.01}


def test_flaky_succeeds_after_its_planned_failures(pgqueue_queue, pgqueue_run_jobs):
    pgqueue_queue.enqueue("flaky", {"fail_times": 2})
    # A tiny backoff lets the burst worker retry within the run.
    (job,) = pgqueue_run_jobs(retry_base=0.01, retry_cap=0.01)
    assert (job.state, job.attempts, job.result) == (JobState.SUCCEEDED, 3, {"attempts": 3})


def test_fail_dies_after_max_attempts_and_the_hooks_log_it(pgqueue_queue, pgqueue_run_jobs, caplog):
    pgqueue_queue.enqueue("fail", {"message": "no luck"}, max_attempts=2)
    with caplog.at_level(logging.INFO, logger="pgqueue_examples"):
        (job,) = pgqueue_run_jobs(retry_base=0.01, retry_cap=0.01)
    assert (job.state, job.attempts) == (JobState.DEAD, 2)
    assert job.last_error == "ExampleFailure: no luck"
    mine = [r.getMessage() for r in caplog.records if r.name == "pgqueue_examples"]
    failures = [m for m in mine if "failed" in m]
    deaths = [m for m in mine if "is dead" in m]
    assert len(failures) == 2 and len(deaths) == 1
