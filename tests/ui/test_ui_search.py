"""Finding jobs on the dashboard, in a real browser: the tag filter and the find box's
payload containment list exactly the matching jobs, a bad filter says why, and a running
job's reported progress shows as a bar in the list and on its page."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from ui_support import log_in

from pgqueue import Lease, Queue, WorkerProtocol

pytestmark = pytest.mark.slow


def _row_ids(page) -> list[int]:
    return [
        int(value)
        for value in page.locator("table.jobs tbody tr").evaluate_all(
            "rows => rows.map(row => row.dataset.job)"
        )
    ]


def test_tag_filter_and_payload_find_list_exactly_the_matching_jobs(
    start_api, page, shoot, queue: Queue
):
    api = start_api()
    red = queue.enqueue("echo", {"customer": 7}, queue="later", tags=["red"]).job
    both = queue.enqueue("echo", {"customer": 8}, queue="later", tags=["red", "big"]).job
    queue.enqueue("echo", {"customer": 7, "kind": "refund"}, queue="later", tags=["big"])
    plain = queue.enqueue("echo", {"customer": 9}, queue="later").job
    refund = queue.get(plain.id - 1)
    log_in(page, api.url, "/ui/jobs")
    expect(page.locator("table.jobs tbody tr")).to_have_count(4)

    page.fill("input[name=tag]", "red")
    page.click("button:has-text('Filter')")
    expect(page).to_have_url(re.compile(r"tag=red"))
    expect(page.locator("table.jobs tbody tr")).to_have_count(2)
    assert _row_ids(page) == [both.id, red.id]
    expect(page.locator(f"#job-{both.id} a.tag")).to_have_text(["red", "big"])

    page.fill("input[name=tag]", "red, big")
    page.click("button:has-text('Filter')")
    expect(page.locator("table.jobs tbody tr")).to_have_count(1)
    assert _row_ids(page) == [both.id]
    shoot(page, "jobs-tag-filter")

    page.fill("input[name=tag]", "")
    page.fill("input[name=q]", '{"customer": 7}')
    page.click("button:has-text('Find')")
    expect(page.locator("#payload-filter")).to_contain_text('{"customer": 7}')
    expect(page.locator("table.jobs tbody tr")).to_have_count(2)
    assert _row_ids(page) == [refund.id, red.id]
    # The filters combine: the payload filter stays while a tag is added.
    page.fill("input[name=tag]", "red")
    page.click("button:has-text('Filter')")
    expect(page.locator("table.jobs tbody tr")).to_have_count(1)
    assert _row_ids(page) == [red.id]

    page.goto(f"{api.url}/ui/jobs")
    page.fill("input[name=q]", "{customer: 7")
    page.click("button:has-text('Find')")
    expect(page.locator("#filter-invalid")).to_contain_text("Payload filter is not valid JSON")
    page.goto(f"{api.url}/ui/jobs?tag=" + "x" * 65)
    expect(page.locator("#filter-invalid")).to_contain_text("at most 64 characters")


def test_a_running_jobs_progress_shows_as_a_bar(start_api, page, shoot, queue: Queue):
    api = start_api()
    job = queue.enqueue("import", {"file": "a.csv"}, queue="imports", tags=["nightly"]).job
    protocol = WorkerProtocol(queue)
    [claimed] = protocol.claim(["imports"], ["import"], 1)
    assert claimed.lease_token is not None
    lease = Lease(claimed.id, claimed.lease_token)
    assert protocol.write_progress([(lease, 0.4, "row 400 of 1000")]) == [job.id]
    log_in(page, api.url, "/ui/jobs")
    bar = page.locator(f"#job-{job.id} progress")
    expect(bar).to_have_attribute("value", "0.4")
    expect(page.locator(f"#job-{job.id} .percent")).to_have_text("40%")
    page.goto(f"{api.url}/ui/jobs/{job.id}")
    expect(page.locator("#progress")).to_contain_text("40% · row 400 of 1000")
    expect(page.locator("#tags a.tag")).to_have_text(["nightly"])
    shoot(page, "job-progress")
