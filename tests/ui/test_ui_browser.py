"""The dashboard in a real browser (Debian's Chromium, through Playwright) against a
real ``pgqueue-api`` and a real worker on real PostgreSQL. Every page is saved as a
screenshot under results/ui/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from ui_support import TOKEN, log_in

from pgqueue import JobSpec, JobState, Queue

pytestmark = pytest.mark.slow
LONG = 60_000
"""Milliseconds a page may take to show what a worker did: a bound, not a measure."""


def _cell(page, queue: str, state: str):
    return page.locator(f'tr[data-queue="{queue}"] td[data-state="{state}"]')


def test_log_in_and_watch_a_worker_empty_a_queue(start_api, start_worker, page, shoot, queue):
    api = start_api()
    queue.enqueue_many([JobSpec("sleep", {"seconds": 0.05}) for _ in range(12)])
    queue.enqueue_many([JobSpec("echo", {"n": n}, queue="emails") for n in range(3)])
    flaky = queue.enqueue("flaky", {"fail_times": 2}, queue="reports", max_attempts=3).job
    queue.enqueue("fail", {"message": "report template missing"}, queue="reports", max_attempts=1)

    page.goto(f"{api.url}/ui")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui$"))
    page.fill("input[name=token]", "not-the-token")
    page.click("button:has-text('Log in')")
    expect(page.locator("p.error")).to_have_text("That token is not valid.")
    shoot(page, "login")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Log in')")
    expect(page).to_have_url(f"{api.url}/ui")
    expect(_cell(page, "default", "queued")).to_have_text("12")
    expect(page.locator(".banner")).to_have_count(0)

    start_worker("--queue", "default", "--queue", "reports")
    # The page refreshes its figures by itself (htmx polling), without a reload.
    expect(_cell(page, "default", "succeeded")).to_have_text("12", timeout=LONG)
    expect(_cell(page, "default", "queued")).to_have_text("0")
    expect(_cell(page, "reports", "dead")).to_have_text("1", timeout=LONG)
    expect(_cell(page, "reports", "succeeded")).to_have_text("1", timeout=LONG)
    expect(_cell(page, "emails", "queued")).to_have_text("3")
    expect(page.locator('tr[data-queue="default"] svg rect.ok')).not_to_have_count(0)
    expect(page.locator('tr[data-queue="reports"] svg rect.bad')).not_to_have_count(0)
    shoot(page, "queues")

    page.goto(f"{api.url}/ui/jobs")
    expect(page.locator("table.jobs tbody tr")).to_have_count(17)
    expect(page.locator(f"#job-{flaky.id} .badge")).to_have_text("succeeded")
    shoot(page, "jobs")

    # The job that failed twice, then succeeded: its timeline shows every attempt.
    page.goto(f"{api.url}/ui/jobs/{flaky.id}")
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator(".timeline li.failed")).to_have_count(2)
    expect(page.locator("#result")).to_contain_text('"attempts": 3')
    shoot(page, "job")


def test_cancel_and_retry_a_job_from_its_page(start_api, page, queue: Queue):
    api = start_api()
    job = queue.enqueue("echo", {"to": "ops@example.com"}, queue="later").job
    log_in(page, api.url, f"/ui/jobs/{job.id}")
    expect(page.locator("#job-state")).to_have_text("queued")
    expect(page.locator("#payload")).to_contain_text('"to": "ops@example.com"')

    page.click("button:has-text('Cancel')")
    expect(page.locator("#job-state")).to_have_text("cancelled")
    expect(page.locator("p.notice")).to_have_text("Job cancelled.")
    assert queue.get(job.id).state is JobState.CANCELLED

    page.click("button:has-text('Retry')")
    expect(page.locator("#job-state")).to_have_text("queued")
    assert queue.get(job.id).state is JobState.QUEUED
    # A job that changes meanwhile shows up on the open page without a reload.
    queue.cancel(job.id)
    expect(page.locator("#job-state")).to_have_text("cancelled", timeout=LONG)


def test_a_retried_dependent_waits_again_or_names_what_failed(start_api, page, queue: Queue):
    api = start_api()
    dependency = queue.enqueue("echo", queue="later").job
    dependent = queue.enqueue("echo", queue="later", depends_on=[dependency.id]).job
    queue.cancel(dependency.id)  # which cancels its dependent too
    log_in(page, api.url, f"/ui/jobs/{dependent.id}")
    expect(page.locator("#job-state")).to_have_text("cancelled")

    page.click("button:has-text('Retry')")
    expect(page.locator("p.error")).to_have_text(
        f"Not retried: the jobs it depends on ({dependency.id}) ended dead or cancelled."
        " Retry them first."
    )
    assert queue.get(dependent.id).state is JobState.CANCELLED

    queue.retry(dependency.id)
    page.click("button:has-text('Retry')")
    expect(page.locator("#job-state")).to_have_text("waiting")
    expect(page.locator("p.notice")).to_have_text("Job retried: waiting for its dependencies.")
    assert queue.get(dependent.id).state is JobState.WAITING


def test_an_open_page_goes_to_log_in_once_its_session_is_gone(start_api, page, queue: Queue):
    api = start_api()
    queue.enqueue("echo", {})
    log_in(page, api.url, "/ui")
    expect(page.locator('tr[data-queue="default"]')).to_have_count(1)
    page.context.clear_cookies()
    # The page's next refresh is refused (401), and htmx follows it to the login page.
    expect(page).to_have_url(f"{api.url}/ui/login?next=%2Fui", timeout=LONG)
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Log in')")
    expect(page).to_have_url(f"{api.url}/ui")


def test_filter_page_search_and_act_on_a_selection(start_api, page, queue: Queue):
    api = start_api()
    emails = [queue.enqueue("send_email", {"n": n}, queue="emails").job for n in range(3)]
    queue.enqueue("resize", {"w": 200}, queue="images", idempotency_key="upload-42")
    queue.enqueue("resize", {"w": 400}, queue="images")
    queue.enqueue_many([JobSpec("tick", {"n": n}, queue="bulk") for n in range(55)])
    queue.cancel(emails[0].id)
    rows = page.locator("table.jobs tbody tr")

    log_in(page, api.url, "/ui/jobs")
    expect(rows).to_have_count(50)  # a page; the rest is one click away
    page.click("a:has-text('Older')")
    expect(rows).to_have_count(10)
    expect(page.locator("a:has-text('Older')")).to_have_count(0)

    page.goto(f"{api.url}/ui/jobs")
    page.select_option("select[name=queue]", "emails")
    page.click("button:has-text('Filter')")
    expect(rows).to_have_count(3)
    page.select_option("select[name=state]", "queued")
    page.click("button:has-text('Filter')")
    expect(rows).to_have_count(2)
    page.select_option("select[name=queue]", "")
    page.select_option("select[name=state]", "")
    page.fill("input[name=task]", "resize")
    page.click("button:has-text('Filter')")
    expect(rows).to_have_count(2)
    expect(page.locator("table.jobs tbody td:nth-child(3)")).to_have_text(["images", "images"])

    # The list keeps itself current, and what is ticked stays ticked meanwhile.
    page.goto(f"{api.url}/ui/jobs?queue=emails")
    page.check(f"#select-{emails[1].id}")
    queue.cancel(emails[2].id)
    expect(page.locator(f"#job-{emails[2].id} .badge")).to_have_text("cancelled", timeout=LONG)
    expect(page.locator(f"#select-{emails[1].id}")).to_be_checked()

    # Bulk: cancel the selection (one was cancelled already), then retry all three.
    page.check(f"#select-{emails[2].id}")
    page.click(".bulk-actions button:has-text('Cancel')")
    expect(page.locator("p.notice")).to_have_text(
        "1 job cancelled; 1 skipped (their state does not allow it to be cancelled)."
    )
    assert {queue.get(job.id).state for job in emails} == {JobState.CANCELLED}
    for job in emails:
        page.check(f'input[name=job_id][value="{job.id}"]')
    page.click(".bulk-actions button:has-text('Retry')")
    expect(page.locator("p.notice")).to_have_text("3 jobs retried.")
    assert {queue.get(job.id).state for job in emails} == {JobState.QUEUED}
    expect(page).to_have_url(re.compile(r"queue=emails"))

    # Search by idempotency key, and by id.
    page.fill("input[name=q]", "upload-42")
    page.click("button:has-text('Find')")
    expect(page).to_have_url(re.compile(r"/ui/jobs/\d+$"))
    expect(page.locator("dl.fields")).to_contain_text("upload-42")
    page.goto(f"{api.url}/ui/jobs")
    page.fill("input[name=q]", str(emails[2].id))
    page.click("button:has-text('Find')")
    expect(page).to_have_url(f"{api.url}/ui/jobs/{emails[2].id}")
    page.goto(f"{api.url}/ui/jobs")
    page.fill("input[name=q]", "no-such-key")
    page.click("button:has-text('Find')")
    expect(page.locator("p.error")).to_contain_text("no-such-key")


XSS = '<script>window.__xss = 1</script><img src="x" onerror="window.__xss = 2">'


def test_a_script_in_a_payload_renders_as_text(start_api, page, queue: Queue):
    api = start_api()
    job = queue.enqueue("echo", {"note": XSS}, queue="xss", idempotency_key="<b>bold</b>").job
    alerts = []
    page.on("dialog", lambda dialog: (alerts.append(dialog.message), dialog.dismiss()))
    log_in(page, api.url, f"/ui/jobs/{job.id}")
    expect(page.locator("#payload")).to_contain_text(XSS.replace('"', '\\"'))
    expect(page.locator("dl.fields")).to_contain_text("<b>bold</b>")
    page.goto(f"{api.url}/ui/jobs?queue=xss")
    expect(page.locator("table.jobs tbody tr")).to_have_count(1)
    page.goto(f"{api.url}/ui/jobs/{job.id}")
    page.wait_for_timeout(500)  # give an injected handler every chance to run
    assert page.evaluate("window.__xss") is None
    assert page.locator("main img, main b").count() == 0
    assert alerts == []


def test_docs_render_offline_from_local_assets(start_api, page, shoot):
    api = start_api()
    elsewhere = []

    def only_local(route):
        if route.request.url.startswith(api.url + "/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(f"{api.url}/docs")
    expect(page.locator(".swagger-ui .opblock-summary-path").first).to_be_visible(timeout=LONG)
    expect(page.locator(".swagger-ui")).to_contain_text("Enqueue a job")
    shoot(page, "docs", full_page=False)
    assert elsewhere == [], f"/docs asked for addresses off this machine: {elsewhere}"
