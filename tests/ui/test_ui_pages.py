"""What the dashboard's pages show, read over HTTP: bounded task searches, long values
cut with a way to see all, and pages for what does not exist."""

from __future__ import annotations

import json
import re

import pytest
from psycopg import sql
from ui_support import logged_in_client

from pgqueue import JobSpec, Queue

pytestmark = pytest.mark.slow


def _ids(html: str) -> list[int]:
    return [int(found) for found in re.findall(r'<tr id="job-\d+" data-job="(\d+)">', html)]


def test_a_task_filter_reads_a_window_of_ids_and_goes_on_below_it(
    start_api, queue: Queue, schema: str, db
):
    api = start_api()
    old = queue.enqueue("rare", {}).job
    # Skip the ids between, as years of other jobs would have used them.
    db.execute(sql.SQL("SELECT setval({}, 25000)").format(sql.Literal(f"{schema}.job_ids")))
    queue.enqueue_many([JobSpec("common", {}) for _ in range(3)])
    new = queue.enqueue("rare", {}).job
    with logged_in_client(api.url) as client:
        first = client.get("/ui/jobs", params={"task": "rare"})
        assert _ids(first.text) == [new.id]
        assert "Looked at jobs 5005 to 25004 for this task" in first.text
        older = re.search(r'href="(/ui/jobs\?task=rare&amp;after=\d+)" rel="next"', first.text)
        assert older, first.text
        second = client.get(older[1].replace("&amp;", "&"))
        assert _ids(second.text) == [old.id]
        assert 'rel="next"' not in second.text
        # Without a task filter the indexes serve the list: no window.
        everything = client.get("/ui/jobs")
        assert _ids(everything.text) == [new.id, 25003, 25002, 25001, old.id]


def test_long_payloads_are_cut_with_a_link_to_all_of_it(start_api, queue: Queue):
    api = start_api()
    payload = {"rows": [{"n": n, "text": "x" * 50} for n in range(400)]}
    job = queue.enqueue("import", payload, queue="later").job
    with logged_in_client(api.url) as client:
        page = client.get(f"/ui/jobs/{job.id}")
        assert page.status_code == 200
        assert f'href="/ui/jobs/{job.id}/payload.json"' in page.text
        assert "Showing 10000 of" in page.text
        everything = client.get(f"/ui/jobs/{job.id}/payload.json")
        assert everything.headers["content-type"] == "application/json"
        assert json.loads(everything.text) == payload


def test_find_takes_an_id_an_idempotency_key_or_a_held_unique_key(start_api, queue: Queue):
    api = start_api()
    keyed = queue.enqueue("mail", {}, idempotency_key="order-7").job
    held = queue.enqueue("sync", {}, unique_key="account-42").job
    freed = queue.enqueue("sync", {}, unique_key="account-9").job
    queue.cancel(freed.id)
    with logged_in_client(api.url) as client:

        def find(text: str):
            return client.get("/ui/jobs", params={"q": text}, follow_redirects=False)

        assert find(str(held.id)).headers["location"] == f"/ui/jobs/{held.id}"
        assert find("order-7").headers["location"] == f"/ui/jobs/{keyed.id}"
        assert find("account-42").headers["location"] == f"/ui/jobs/{held.id}"
        # A finished job keeps its unique key but no longer holds it: not found.
        missing = find("account-9")
        assert missing.status_code == 200
        assert "no queued or running job holds it as its unique key" in missing.text
        assert "a unique key is found while its job is queued or running" in missing.text
        # Too long for any key: a page saying nothing has it, not an error.
        assert find("k" * 300).status_code == 200
        shown = client.get(f"/ui/jobs/{held.id}").text
        assert "<dt>Unique key</dt><dd>account-42</dd>" in shown
        assert "<dt>Unique key</dt><dd>account-9</dd>" in client.get(f"/ui/jobs/{freed.id}").text


def test_what_does_not_exist_is_a_page_saying_so(start_api):
    api = start_api()
    with logged_in_client(api.url) as client:
        missing = client.get("/ui/jobs/424242")
        assert missing.status_code == 404
        assert "There is no job 424242" in missing.text
        assert client.get("/ui/jobs/0").status_code == 422
        assert client.get("/ui/jobs", params={"state": "sleeping"}).status_code == 422
        assert client.get("/ui/fragments/jobs/424242").status_code == 404


def test_the_finished_per_minute_chart_reads_through_an_index_on_every_day(schema: str, db):
    # Without it the chart would read each day's finished jobs in full.
    indexed = db.execute(
        "SELECT tablename FROM pg_indexes WHERE schemaname = %s "
        "AND indexdef LIKE '%%USING brin (finished_at)%%'",
        (schema,),
    ).fetchall()
    tables = db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename ~ '^finished_jobs'",
        (schema,),
    ).fetchall()
    assert len(tables) >= 7  # the table, a partition and a DEFAULT per state, and days
    assert sorted(indexed) == sorted(tables)


def test_dependencies_show_as_links_and_waiting_jobs_are_counted_and_filtered(
    start_api, queue: Queue
):
    api = start_api()
    root = queue.enqueue("build", {}).job
    waiting = queue.enqueue("deploy", {}, depends_on=[root.id]).job
    with logged_in_client(api.url) as client:
        page = client.get(f"/ui/jobs/{waiting.id}").text
        assert '<span class="badge waiting" id="job-state">waiting</span>' in page
        assert re.search(
            rf'<li data-job="{root.id}"><a href="/ui/jobs/{root.id}">{root.id}</a>'
            r' <span class="task">build</span> <span class="badge queued">queued</span></li>',
            page,
        )
        assert re.search(r'id="dependents">\s*<h3>Dependents <small>0</small></h3>', page)
        # A waiting job can change: its page polls, and it can be cancelled.
        assert f'hx-get="/ui/fragments/jobs/{waiting.id}"' in page
        assert f'action="/ui/jobs/{waiting.id}/cancel"' in page
        fragment = client.get(f"/ui/fragments/jobs/{root.id}").text
        assert (
            f'<li data-job="{waiting.id}"><a href="/ui/jobs/{waiting.id}">{waiting.id}</a>'
            ' <span class="task">deploy</span> <span class="badge waiting">waiting</span></li>'
        ) in fragment

        overview = client.get("/ui").text
        assert '<th class="num">waiting</th>' in overview
        assert re.search(r'data-state="waiting"><a href="[^"]*state=waiting">1</a>', overview)
        listed = client.get("/ui/jobs", params={"state": "waiting"})
        assert listed.status_code == 200
        assert _ids(listed.text) == [waiting.id]
        assert '<option value="waiting" selected>' in listed.text
