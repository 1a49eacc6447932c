"""The SQL files: every named query binds, and migrations are numbered without gaps."""

import pytest

from pgqueue import migrations, queries


@pytest.mark.parametrize("name", queries.query_names())
def test_every_named_query_binds_to_a_schema(name):
    text = queries.bind(name, "some schema").as_string(None)
    assert "{schema}" not in text and "{lock}" not in text and "{channel}" not in text
    if "{schema}" in queries._raw_queries()[name]:
        assert '"some schema".' in text


def test_claim_modes_differ_only_in_the_row_lock():
    skip = repr(queries.bind("job_claim", "s", "skip-locked"))
    plain = repr(queries.bind("job_claim", "s", "for-update"))
    assert "SKIP LOCKED" in skip and "SKIP LOCKED" not in plain


def test_migrations_are_numbered_from_one_without_gaps():
    versions = [m.version for m in migrations.available()]
    assert versions == list(range(1, len(versions) + 1))


def test_unknown_query_names_are_reported():
    with pytest.raises(KeyError, match="no query named"):
        queries.bind("job_teleport", "s")
