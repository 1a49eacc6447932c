"""Steering queues from the dashboard in a real browser: pause and resume a queue and
see its worker stop and start, set its limits, and see the live workers."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect
from psycopg import sql
from ui_support import log_in

from pgqueue import JobSpec, Queue

pytestmark = pytest.mark.slow
LONG = 60_000
"""Milliseconds a page may take to show what a worker did: a bound, not a measure."""
PAUSED_WATCH_SECONDS = 2.0
"""How long a paused queue's jobs are watched staying queued: ten of the worker's polls."""


def _cell(page, queue: str, state: str):
    return page.locator(f'tr[data-queue="{queue}"] td[data-state="{state}"]')


def test_pause_stops_the_worker_and_resume_starts_it(start_api, start_worker, page, shoot, queue):
    api = start_api()
    queue.enqueue("echo", {"n": 0})
    worker = start_worker("--queue", "default")
    log_in(page, api.url, "/ui")
    expect(_cell(page, "default", "succeeded")).to_have_text("1", timeout=LONG)

    row = page.locator('tr[data-queue="default"]')
    row.locator("button:has-text('Pause')").click()
    expect(row.locator(".badge.paused")).to_be_visible()
    assert [s.paused for s in queue.stats() if s.queue == "default"] == [True]

    queue.enqueue_many([JobSpec("echo", {"n": n}) for n in range(1, 6)])
    expect(_cell(page, "default", "queued")).to_have_text("5", timeout=LONG)
    shoot(page, "queues-paused")
    time.sleep(PAUSED_WATCH_SECONDS)
    assert [s.counts["queued"] for s in queue.stats() if s.queue == "default"] == [5]
    assert worker.poll() is None

    page.goto(f"{api.url}/ui/workers")
    expect(page.locator(f'tr td.num:text-is("{worker.pid}")')).to_have_count(1, timeout=LONG)
    expect(page.locator("table.workers")).to_contain_text("default")
    shoot(page, "workers")

    page.goto(f"{api.url}/ui")
    row.locator("button:has-text('Resume')").click()
    expect(_cell(page, "default", "succeeded")).to_have_text("6", timeout=LONG)
    expect(row.locator(".badge.paused")).to_have_count(0)


def test_limits_are_set_and_refused_values_explained(start_api, page, queue: Queue):
    api = start_api()
    queue.enqueue("echo", {}, queue="images")
    log_in(page, api.url, "/ui")
    row = page.locator('tr[data-queue="images"]')
    row.locator("input[name=concurrency_limit]").fill("2")
    row.locator("input[name=rate_limit]").fill("7.5")
    row.locator("button:has-text('Set')").click()
    expect(row.locator("input[name=concurrency_limit]")).to_have_value("2")
    expect(row.locator("input[name=rate_limit]")).to_have_value("7.5")
    (stats,) = [s for s in queue.stats() if s.queue == "images"]
    assert (stats.concurrency_limit, stats.rate_limit) == (2, 7.5)

    row.locator("input[name=rate_limit]").fill("0")
    row.locator("button:has-text('Set')").click()
    expect(page.locator("p.error")).to_contain_text("rate_limit")
    row.locator("input[name=concurrency_limit]").fill("")
    row.locator("input[name=rate_limit]").fill("")
    row.locator("button:has-text('Set')").click()
    expect(row.locator("input[name=concurrency_limit]")).to_have_value("")
    (stats,) = [s for s in queue.stats() if s.queue == "images"]
    assert (stats.concurrency_limit, stats.rate_limit) == (None, None)


def test_changing_max_running_in_the_browser_leaves_the_rate_exact_and_its_bucket_full(
    start_api, page, queue: Queue, db, schema: str
):
    api = start_api()
    queue.enqueue("echo", {}, queue="images")
    rate = 1 / 3
    queue.update_queue("images", concurrency_limit=2, rate_limit=rate)
    bucket = sql.SQL(
        "UPDATE {}.queue_settings SET tokens = 0.25, tokens_at = now() - interval '1 hour' "
        "WHERE queue = 'images' RETURNING tokens, tokens_at"
    ).format(sql.Identifier(schema))
    before = db.execute(bucket).fetchone()

    log_in(page, api.url, "/ui")
    row = page.locator('tr[data-queue="images"]')
    expect(row.locator("input[name=rate_limit]")).to_have_value(repr(rate))
    row.locator("input[name=concurrency_limit]").fill("5")
    row.locator("button:has-text('Set')").click()
    expect(row.locator("input[name=concurrency_limit]")).to_have_value("5")
    expect(row.locator("input[name=rate_limit]")).to_have_value(repr(rate))

    (stats,) = [s for s in queue.stats() if s.queue == "images"]
    assert (stats.concurrency_limit, stats.rate_limit) == (5, rate)
    after = db.execute(
        sql.SQL("SELECT tokens, tokens_at FROM {}.queue_settings WHERE queue = 'images'").format(
            sql.Identifier(schema)
        )
    ).fetchone()
    assert after == before


def test_disable_and_enable_a_schedule(start_api, page, shoot, queue: Queue):
    from pgqueue.schedules import Schedule

    declared = {
        "nightly-report": Schedule(
            "nightly-report", "0 3 * * *", "report", queue="reports", timezone="Europe/Berlin"
        ),
        "hourly-cleanup": Schedule("hourly-cleanup", "0 * * * *", "cleanup"),
    }
    queue.sync_schedules(declared, ["explicit"])
    api = start_api()
    log_in(page, api.url, "/ui/schedules")
    row = page.locator('tr[data-schedule="nightly-report"]')
    expect(row).to_contain_text("Europe/Berlin")
    expect(row.locator(".badge")).to_have_text("enabled")

    row.locator("button:has-text('Disable')").click()
    expect(row.locator(".badge")).to_have_text("disabled")
    (nightly,) = [s for s in queue.schedules() if s.name == "nightly-report"]
    assert (nightly.enabled, nightly.disabled_by, nightly.next_run_at) == (False, "operator", None)

    row.locator("button:has-text('Enable')").click()
    expect(row.locator(".badge")).to_have_text("enabled")
    (nightly,) = [s for s in queue.schedules() if s.name == "nightly-report"]
    assert nightly.enabled
    assert nightly.next_run_at is not None
    # The next run in the schedule's time zone too (CEST in summer).
    expect(row).to_contain_text(re.compile(r"03:00 CES?T"))
    page.locator('tr[data-schedule="hourly-cleanup"] button:has-text("Disable")').click()
    expect(page.locator('tr[data-schedule="hourly-cleanup"] .badge')).to_have_text("disabled")
    shoot(page, "schedules")
