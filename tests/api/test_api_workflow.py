"""GET /jobs/{id}/workflow: the graph of dependencies around a job as JSON, the size
limit, and clear answers for a job that does not exist and a limit out of range."""

from __future__ import annotations

import httpx

from pgqueue import JobSpec, Queue


def test_the_workflow_of_a_job_lists_its_jobs_and_links(api: httpx.Client, queue: Queue):
    root = queue.enqueue("extract", {}).job.id
    steps = [
        result.job.id
        for result in queue.enqueue_many(
            [JobSpec("transform", {"part": n}, depends_on=[root]) for n in range(3)]
        )
    ]
    report = queue.enqueue("report", {}, depends_on=steps).job.id
    queue.cancel(steps[0])  # which cancels the report too

    answer = api.get(f"/jobs/{root}/workflow")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["job_id"], body["limit"], body["truncated"]) == (root, 100, False)
    assert [job["id"] for job in body["jobs"]] == [root, *steps, report]
    assert sorted(map(tuple, body["edges"])) == sorted(
        [(root, step) for step in steps] + [(step, report) for step in steps]
    )
    jobs = {job["id"]: job for job in body["jobs"]}
    assert jobs[report] == {
        "id": report,
        "task": "report",
        "queue": "default",
        "state": "cancelled",
        "depends_on": steps,
        "more_dependencies": 0,
        "more_dependents": 0,
    }
    assert jobs[steps[0]]["state"] == "cancelled"
    assert jobs[steps[1]]["state"] == "waiting"  # for the root

    cut = api.get(f"/jobs/{root}/workflow", params={"limit": 2}).json()
    assert cut["truncated"] is True
    assert len(cut["jobs"]) == 3
    assert next(job for job in cut["jobs"] if job["id"] == root)["more_dependents"] == 1


def test_a_missing_job_or_a_bad_limit_is_a_clear_error(api: httpx.Client, queue: Queue):
    job = queue.enqueue("echo", {}).job.id
    missing = api.get(f"/jobs/{job + 1000}/workflow")
    assert missing.status_code == 404
    assert "detail" in missing.json() or "error" in missing.json()
    for limit in ("0", "1001", "many"):
        bad = api.get(f"/jobs/{job}/workflow", params={"limit": limit})
        assert bad.status_code == 422, bad.text
    assert api.get(f"/jobs/{job}/workflow", params={"limit": 1000}).status_code == 200
