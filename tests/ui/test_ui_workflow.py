"""Seeing a workflow in a real browser (Debian's Chromium through Playwright, a real
``pgqueue-api`` on real PostgreSQL): a job's page lists its dependencies and dependents
with their states, and the workflow page draws a graph of 100 jobs, each box coloured
by its state and linked to its job's page. Both pages are saved under results/ui/."""

from __future__ import annotations

import itertools

import pytest
from playwright.sync_api import expect
from ui_support import log_in, logged_in_client

from pgqueue import JobSpec, JobState, Queue, WorkerProtocol

pytestmark = pytest.mark.slow
REGIONS = ("eu", "us", "asia")
HOUR = 3600.0


def _ids(queue: Queue, specs: list[JobSpec]) -> list[int]:
    return [result.job.id for result in queue.enqueue_many(specs)]


def _run(protocol: WorkerProtocol, task: str, count: int, outcome: str = "ack") -> list[int]:
    """Claim ``count`` jobs of ``task`` and ack them, fail them, or leave them running."""
    claimed = protocol.claim(["etl"], [task], limit=count, lease_seconds=HOUR)
    assert len(claimed) == count, task
    for job in claimed:
        if outcome == "ack":
            protocol.ack(job, {"rows": job.id})
        elif outcome == "fail":
            protocol.fail(job, "upstream file missing")
    return [job.id for job in claimed]


def _pipeline(queue: Queue) -> dict[str, list[int]]:
    """A workflow of exactly 100 jobs: extract, a partition per region, 30 loads per
    region, an aggregate per region, a report, two notifications; run part way, so
    that every state shows: Europe done and aggregating, the US loading, Asia dead
    and everything after it cancelled."""
    jobs: dict[str, list[int]] = {"extract": _ids(queue, [JobSpec("extract", queue="etl")])}
    jobs["partition"] = _ids(
        queue,
        [
            JobSpec("partition", {"region": region}, queue="etl", depends_on=jobs["extract"])
            for region in REGIONS
        ],
    )
    jobs["aggregate"] = []
    for region, partition in zip(REGIONS, jobs["partition"], strict=True):
        loads = _ids(
            queue,
            [
                JobSpec(
                    f"load_{region}",
                    {"file": n},
                    queue="etl",
                    depends_on=[partition],
                    max_attempts=1,
                )
                for n in range(30)
            ],
        )
        jobs[f"load_{region}"] = loads
        jobs["aggregate"] += _ids(
            queue, [JobSpec("aggregate", {"region": region}, queue="etl", depends_on=loads)]
        )
    jobs["report"] = _ids(queue, [JobSpec("report", queue="etl", depends_on=jobs["aggregate"])])
    jobs["notify"] = _ids(
        queue,
        [JobSpec("notify", {"to": to}, queue="etl", depends_on=jobs["report"]) for to in "ab"],
    )
    assert sum(len(ids) for ids in jobs.values()) == 100

    protocol = WorkerProtocol(queue)
    _run(protocol, "extract", 1)
    _run(protocol, "partition", 3)
    _run(protocol, "load_eu", 30)
    _run(protocol, "aggregate", 1, "hold")
    _run(protocol, "load_us", 20)
    _run(protocol, "load_us", 5, "hold")
    _run(protocol, "load_asia", 1, "fail")
    return jobs


def test_a_workflow_of_100_jobs_is_drawn_with_every_job_linked(
    start_api, page, shoot, queue: Queue
):
    api = start_api()
    jobs = _pipeline(queue)
    everyone = sorted(job_id for ids in jobs.values() for job_id in ids)
    states = {job_id: queue.get(job_id).state.value for job_id in everyone}
    assert set(states.values()) == {state.value for state in JobState}
    root, us = jobs["extract"][0], jobs["aggregate"][1]

    # A job's page: its dependencies and dependents with their states, linked.
    log_in(page, api.url, f"/ui/jobs/{us}")
    depends_on = page.locator("#depends-on li")
    expect(depends_on).to_have_count(30)
    expect(page.locator("#depends-on h3")).to_have_text("Depends on 30")
    for job_id in jobs["load_us"]:
        item = page.locator(f'#depends-on li[data-job="{job_id}"]')
        expect(item.locator(".badge")).to_have_text(states[job_id])
        expect(item.locator("a")).to_have_attribute("href", f"/ui/jobs/{job_id}")
    expect(page.locator("#dependents li")).to_have_count(1)
    report = page.locator(f'#dependents li[data-job="{jobs["report"][0]}"] .badge')
    expect(report).to_have_text("cancelled")  # Asia's load died
    shoot(page, "job-dependencies")

    # The workflow page, from the job's page.
    page.click("#workflow-link")
    expect(page).to_have_url(f"{api.url}/ui/jobs/{us}/workflow")
    page.goto(f"{api.url}/ui/jobs/{root}/workflow")
    nodes = page.locator("#workflow-graph g.node")
    expect(nodes).to_have_count(100)
    drawn = {
        int(node.get_attribute("data-job")): node.get_attribute("data-state")
        for node in nodes.all()
    }
    assert drawn == states
    links = page.locator("#workflow-graph g.node a")
    hrefs = sorted(link.get_attribute("href") for link in links.all())
    assert hrefs == sorted(f"/ui/jobs/{job_id}" for job_id in everyone)
    # 3 partitions, 90 loads, 90 edges into the aggregates, 3 into the report, 2 out.
    expect(page.locator("#workflow-graph path.edge")).to_have_count(188)
    expect(page.locator("#workflow-cut")).to_have_count(0)
    expect(page.locator(".legend")).to_contain_text("dead 1")

    # Readable: no two boxes overlap, and every label fits the box it is in.
    boxes = page.evaluate(
        """() => [...document.querySelectorAll('#workflow-graph g.node')].map(g => {
            const box = g.querySelector('rect').getBBox();
            const text = g.querySelector('text').getBBox();
            return [box.x, box.y, box.width, box.height, text.x + text.width];
        })"""
    )
    for x, _, width, _, text_end in boxes:
        assert text_end <= x + width, "a label runs out of its box"
    placed = sorted((x, y) for x, y, *_ in boxes)
    for (x1, y1), (x2, y2) in itertools.pairwise(placed):
        assert x1 != x2 or y2 - y1 >= 30, "two boxes overlap"
    shoot(page, "workflow")

    # A box goes to its job's page.
    dead = next(job_id for job_id, state in states.items() if state == "dead")
    page.click(f'#workflow-graph g.node[data-job="{dead}"] a')
    expect(page).to_have_url(f"{api.url}/ui/jobs/{dead}")
    expect(page.locator("#job-state")).to_have_text("dead")


def test_a_workflow_too_large_to_draw_is_cut_with_a_message(start_api, queue: Queue):
    api = start_api()
    root = queue.enqueue("fan_out", {}).job.id
    _ids(queue, [JobSpec("step", {"n": n}, depends_on=[root]) for n in range(105)])
    alone = queue.enqueue("alone", {}).job.id
    with logged_in_client(api.url) as client:
        cut = client.get(f"/ui/jobs/{root}/workflow").text
        assert 'id="workflow-cut"' in cut
        assert "the 100 nearest jobs each way at most" in cut
        assert cut.count('<g class="node') == 101
        assert "+5</text>" in cut  # the root's dependents not drawn
        job_page = client.get(f"/ui/jobs/{root}").text
        assert "<small>105</small>" in job_page
        assert "and 5 more: see the" in job_page
        single = client.get(f"/ui/jobs/{alone}/workflow").text
        assert "This job has no dependencies and no dependents." in single
        assert 'id="workflow-link"' not in client.get(f"/ui/jobs/{alone}").text
        missing = client.get(f"/ui/jobs/{alone + 1000}/workflow")
        assert missing.status_code == 404
        assert client.get("/ui/jobs/0/workflow").status_code == 422
