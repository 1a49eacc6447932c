"""Mistakes in building a Queue are caught where they are made, with the fix."""

from __future__ import annotations

import psycopg
import pytest

from pgqueue import Queue


@pytest.mark.parametrize("url", ["postgresql://postgres@localhost/app", b"dbname=app"])
def test_a_url_where_a_pool_belongs_is_a_type_error_naming_queue_connect(url) -> None:
    with pytest.raises(TypeError, match=r"not a database URL: use Queue\.connect\(url\)"):
        Queue(url)


def test_a_database_error_on_one_line_keeps_every_part_once() -> None:
    from pgqueue.errors import error_line

    message = (
        'connection failed: connection to server at "::1", port 5999 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?\n"
        'connection to server at "127.0.0.1", port 5999 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?"
    )

    assert error_line(psycopg.OperationalError(message)) == (
        'connection failed: connection to server at "::1", port 5999 failed: Connection '
        "refused; Is the server running on that host and accepting TCP/IP connections?; "
        'connection to server at "127.0.0.1", port 5999 failed: Connection refused'
    )
    assert error_line(psycopg.OperationalError("")) == "OperationalError"


def test_a_short_reason_is_the_first_line_of_the_message_or_the_type() -> None:
    from pgqueue.errors import first_line

    message = (
        'connection failed: connection to server at "127.0.0.1", port 5999 failed: '
        "Connection refused\n"
        "\tIs the server running on that host and accepting TCP/IP connections?"
    )

    assert first_line(psycopg.OperationalError(message)) == (
        'connection failed: connection to server at "127.0.0.1", port 5999 failed: '
        "Connection refused"
    )
    assert first_line(psycopg.OperationalError("\n  the cause  \nmore\n")) == "the cause"
    assert first_line(psycopg.OperationalError(" \n")) == "OperationalError"
