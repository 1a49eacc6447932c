"""Flow control on the dashboard: a job's partition key on its page and in the job
rows (linked to its key's jobs), the queue's partition limits in its limits form and
its throttle on its row, and the queue's partitions page, busiest first, a page at a
time. One test over HTTP, one in Debian's Chromium."""

from __future__ import annotations

import re
from html import unescape

import pytest
from playwright.sync_api import expect
from ui_support import limits_form, log_in, logged_in_client

from pgqueue import JobSpec, Queue
from pgqueue_api.ui import partitions

pytestmark = pytest.mark.slow


def _keys(html: str) -> list[str]:
    return [unescape(key) for key in re.findall(r'<tr data-partition="([^"]*)">', html)]


def test_partitions_page_pages_busiest_first_and_links_each_keys_jobs(
    start_api, queue: Queue
) -> None:
    api = start_api()
    # One more key than a page holds: "k-00" is the busiest, the rest tie (key order).
    specs = [JobSpec("t", {}, queue="work", partition_key="k-00") for _ in range(3)]
    specs += [
        JobSpec("t", {}, queue="work", partition_key=f"k-{n:02d}")
        for n in range(1, partitions.PAGE_SIZE + 1)
    ]
    queue.enqueue_many(specs)
    queue.throttle("work", 600, partition_key="k-01")
    with logged_in_client(api.url) as client:
        queues = client.get("/ui").text
        assert 'href="/ui/queues/work/partitions"' in queues
        first = client.get("/ui/queues/work/partitions")
        assert first.status_code == 200, first.text
        keys = _keys(first.text)
        assert keys == [f"k-{n:02d}" for n in range(partitions.PAGE_SIZE)]
        busiest = re.search(r'<tr data-partition="k-00">(.*?)</tr>', first.text, re.S)
        assert busiest and '<td class="num" data-count="queued">3</td>' in busiest[1]
        throttled = re.search(r'<tr data-partition="k-01">(.*?)</tr>', first.text, re.S)
        assert throttled and "UTC" in throttled[1]
        assert 'href="/ui/jobs?queue=work&amp;partition_key=k-00"' in first.text

        following = re.search(r'href="([^"]*)" rel="next"', first.text)
        assert following, first.text
        second = client.get(unescape(following[1]))
        assert _keys(second.text) == [f"k-{partitions.PAGE_SIZE:02d}"]
        assert 'rel="next"' not in second.text

        # The key's jobs, with the key shown on each row and on the job's page.
        jobs = client.get("/ui/jobs", params={"queue": "work", "partition_key": "k-00"}).text
        ids = re.findall(r'<tr id="job-\d+" data-job="(\d+)">', jobs)
        assert len(ids) == 3
        assert jobs.count("key: k-00") == 3
        job_page = client.get(f"/ui/jobs/{ids[0]}").text
        assert re.search(r'<dd id="partition-key"><a [^>]*>k-00</a></dd>', job_page)

        assert client.get("/ui/queues/nowhere/partitions").status_code == 404
        bad = client.get("/ui/queues/work/partitions", params={"after": "not a cursor"})
        assert bad.status_code == 200 and 'id="cursor-invalid"' in bad.text

        # The limits form carries the partition limits; one left as shown is not set.
        queue.update_queue("work", partition_concurrency_limit=2, partition_rate_limit=1 / 3)
        form = limits_form(client.get("/ui").text, "work")
        assert (form["partition_concurrency_limit"], form["partition_rate_limit"]) == (
            "2",
            repr(1 / 3),
        )
        answer = client.post("/ui/queues/limits", data={**form, "partition_concurrency_limit": "4"})
        assert answer.status_code == 303, answer.text
    info = queue.update_queue("work")
    assert (info.partition_concurrency_limit, info.partition_rate_limit) == (4, 1 / 3)
    assert (info.concurrency_limit, info.rate_limit) == (None, None)


def test_partition_limits_and_throttles_in_the_browser(
    start_api, page, shoot, queue: Queue
) -> None:
    api = start_api()
    queue.enqueue_many(
        [JobSpec("t", {}, queue="images", partition_key=key) for key in ("a", "b", "b")]
    )
    queue.throttle("images", 600)
    log_in(page, api.url, "/ui")
    row = page.locator('tr[data-queue="images"]')
    expect(row.locator(".badge.throttled")).to_contain_text("throttled until")
    row.locator("input[name=partition_concurrency_limit]").fill("1")
    row.locator("input[name=partition_rate_limit]").fill("2.5")
    row.locator("button:has-text('Set')").click()
    expect(row.locator("input[name=partition_concurrency_limit]")).to_have_value("1")
    expect(row.locator("input[name=partition_rate_limit]")).to_have_value("2.5")
    info = queue.update_queue("images")
    assert (info.partition_concurrency_limit, info.partition_rate_limit) == (1, 2.5)

    row.locator("input[name=partition_rate_limit]").fill("0")
    row.locator("button:has-text('Set')").click()
    expect(page.locator("p.error")).to_contain_text("partition_rate_limit")
    assert queue.update_queue("images").partition_rate_limit == 2.5

    page.goto(f"{api.url}/ui")
    row.locator("a.partitions-link").click()
    expect(page.locator("h1")).to_contain_text("Partitions")
    expect(page.locator("tr[data-partition]")).to_have_count(2)
    expect(page.locator("tr[data-partition]").first).to_have_attribute("data-partition", "b")
    expect(page.locator("#partition-concurrency-limit")).to_have_text("1")
    expect(page.locator("#queue-throttled")).to_contain_text("until")
    shoot(page, "partitions")
    page.locator('tr[data-partition="a"] a').click()
    expect(page.locator("#job-rows tr")).to_have_count(1)
    page.locator("#job-rows tr a").first.click()
    expect(page.locator("#partition-key")).to_have_text("a")
