"""The SQL files: every named query binds, and migrations are numbered without gaps."""

import re

import pytest
from psycopg import sql

from pgqueue import migrations, queries

# A day's placeholders (see pgqueue.history.Day).
DAY = {
    "partition": sql.Identifier("p"),
    "parent": sql.Identifier("q"),
    "default": sql.Identifier("d"),
    "fence": sql.Identifier("f"),
    "bound": sql.Identifier("b"),
    "state": sql.Literal("succeeded"),
    "start": sql.Literal("2026-01-01"),
    "end": sql.Literal("2026-01-02"),
}

# The statements with placeholders of their own, and what fills them.
PARTS = {
    **{
        name: DAY
        for name in queries.query_names()
        if name.startswith(("history_day_", "history_fence_", "history_default_lock"))
    },
    "history_day_lock": {"partition": sql.Identifier("p")},
    "history_day_release": {"partition": sql.Identifier("p")},
    "history_day_drop": {"partition": sql.Identifier("p")},
    "job_list": {"filters": sql.SQL("")},
    "job_search": {"filters": sql.SQL("")},
    "job_prune": {"table": sql.Identifier("finished_jobs")},
    "lease_lost_raise": {"message": sql.Literal("lost")},
}


@pytest.mark.parametrize("name", queries.query_names())
def test_every_named_query_binds_to_a_schema(name):
    if name in PARTS:
        with pytest.raises(KeyError):
            queries.bind(name, "some schema")
        text = queries.compose(name, "some schema", **PARTS[name]).as_string(None)
    else:
        text = queries.bind(name, "some schema").as_string(None)
    assert not re.search(r"\{\w+\}", text), text
    if "{schema}" in queries._raw_queries()[name]:
        assert '"some schema".' in text


def test_claim_modes_differ_only_in_the_row_lock_of_the_candidates():
    skip = queries.bind("job_claim", "s", "skip-locked").as_string(None)
    plain = queries.bind("job_claim", "s", "for-update").as_string(None)
    # The candidates' locks (a source's share, and what makes up a short claim) come
    # first; the waiters' records are always skipped when locked.
    assert skip != plain
    assert skip.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE", 2) == plain


def test_migrations_are_numbered_from_one_without_gaps():
    versions = [m.version for m in migrations.available()]
    assert versions == list(range(1, len(versions) + 1))


def test_unknown_query_names_are_reported():
    with pytest.raises(KeyError, match="no statement named"):
        queries.bind("job_teleport", "s")
