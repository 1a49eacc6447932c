"""The dashboard's limits form, posted over HTTP as a browser posts it: a limit is shown
as the exact number stored, and a field the operator did not change is not sent, so
changing "max running" alone leaves the rate limit, and its token bucket, as they were."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql
from ui_support import limits_form, logged_in_client

from pgqueue import Queue

pytestmark = pytest.mark.slow


def settings_row(db: psycopg.Connection, schema: str, queue_name: str) -> dict[str, Any]:
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    cur.execute(
        sql.SQL(
            "SELECT concurrency_limit, rate_limit, tokens, tokens_at FROM {}.queue_settings "
            "WHERE queue = %s"
        ).format(sql.Identifier(schema)),
        (queue_name,),
    )
    row = cur.fetchone()
    assert row is not None
    return row


def spent_bucket(db: psycopg.Connection, schema: str, queue_name: str) -> datetime:
    """Give the queue's token bucket a state of its own (a quarter of a token, last
    refilled an hour ago) and return that refill time."""
    cur = db.execute(
        sql.SQL(
            "UPDATE {}.queue_settings SET tokens = 0.25, tokens_at = now() - interval '1 hour' "
            "WHERE queue = %s RETURNING tokens_at"
        ).format(sql.Identifier(schema)),
        (queue_name,),
    )
    (row,) = cur.fetchall()
    return row[0]


def test_changing_max_running_alone_leaves_the_rate_and_its_bucket_be(
    start_api, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    api = start_api()
    queue.enqueue("echo", {}, queue="images")
    rate = 1 / 3  # 0.3333333333333333: more digits than six
    queue.update_queue("images", concurrency_limit=2, rate_limit=rate)
    refilled_at = spent_bucket(db, schema, "images")

    with logged_in_client(api.url) as client:
        form = limits_form(client.get("/ui").text, "images")
        assert (form["concurrency_limit"], form["rate_limit"]) == ("2", repr(rate))
        answer = client.post("/ui/queues/limits", data={**form, "concurrency_limit": "5"})
        assert answer.status_code == 303, answer.text

        assert settings_row(db, schema, "images") == {
            "concurrency_limit": 5,
            "rate_limit": rate,
            "tokens": 0.25,
            "tokens_at": refilled_at,
        }
        # And the other way round: a new rate alone keeps the concurrency limit.
        form = limits_form(client.get("/ui").text, "images")
        answer = client.post("/ui/queues/limits", data={**form, "rate_limit": "0.1234567891"})
        assert answer.status_code == 303, answer.text
    row = settings_row(db, schema, "images")
    assert (row["concurrency_limit"], row["rate_limit"]) == (5, 0.1234567891)
    # A rate that changed starts from an empty bucket.
    assert row["tokens"] == 0 and row["tokens_at"] > refilled_at


def test_a_rate_is_stored_and_shown_exactly_and_a_cleared_field_removes_its_limit(
    start_api, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    api = start_api()
    queue.enqueue("echo", {}, queue="images")
    typed = ["2.5", "98765.4321", "0.000123456789", "1e-07", "999999.999999"]
    with logged_in_client(api.url) as client:
        for text in typed:
            form = limits_form(client.get("/ui").text, "images")
            answer = client.post("/ui/queues/limits", data={**form, "rate_limit": text})
            assert answer.status_code == 303, (text, answer.text)
            assert settings_row(db, schema, "images")["rate_limit"] == float(text)
            shown = limits_form(client.get("/ui").text, "images")["rate_limit"]
            assert float(shown) == float(text), (text, shown)

        form = limits_form(client.get("/ui").text, "images")
        cleared = client.post("/ui/queues/limits", data={**form, "rate_limit": ""})
        assert cleared.status_code == 303, cleared.text
    row = settings_row(db, schema, "images")
    assert (row["concurrency_limit"], row["rate_limit"]) == (None, None)


def test_a_post_of_both_fields_alone_sets_both(
    start_api, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    """A script that posts the two fields without what the page showed sets both, as
    they are given (an empty one: no limit)."""
    api = start_api()
    queue.enqueue("echo", {}, queue="images")
    queue.update_queue("images", concurrency_limit=2, rate_limit=4.0)
    with logged_in_client(api.url) as client:
        csrf = limits_form(client.get("/ui").text, "images")["csrf_token"]
        answer = client.post(
            "/ui/queues/limits",
            data={
                "csrf_token": csrf,
                "queue": "images",
                "concurrency_limit": "",
                "rate_limit": "7",
            },
        )
        assert answer.status_code == 303, answer.text
    row = settings_row(db, schema, "images")
    assert (row["concurrency_limit"], row["rate_limit"]) == (None, 7.0)
