"""A connection that notes each read of the history's DEFAULT partitions made while its
transaction held a lock that acks finishing into them wait for.

An ack inserts into a DEFAULT partition (through ``finished_jobs``) under ROW EXCLUSIVE:
it waits while another transaction holds SHARE or a stronger lock on that partition or
on its state's table. Reading a large DEFAULT partition under such a lock keeps every
ack of that state waiting for the read. After each statement run in a transaction, this
connection compares the rows its transaction has read from each DEFAULT partition by
sequential scans (``pg_stat_xact_user_tables``) with what it had read before, and the
locks it holds: counts, not timings.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import pq

ACK_BLOCKING = ["ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"]

_READS = """
SELECT now(), stat.relname, stat.seq_tup_read,
       (SELECT array_agg(DISTINCT held.mode ORDER BY held.mode) FROM pg_locks AS held
        WHERE held.pid = pg_backend_pid() AND held.granted AND held.locktype = 'relation'
          AND held.mode = ANY(%(blocking)s)
          AND held.relation IN (stat.relid, (SELECT inhparent FROM pg_inherits
                                             WHERE inhrelid = stat.relid))) AS held
FROM pg_stat_xact_user_tables AS stat
WHERE stat.schemaname = %(schema)s AND stat.relname LIKE 'finished\\_jobs\\_%%\\_default'
"""


class LockedReads(psycopg.Connection[Any]):
    """Call :meth:`watch` with the schema, then use it as any connection: ``found`` lists
    the statements that read a DEFAULT partition under an ack-blocking lock."""

    schema = ""
    found: list[str]
    _transaction: object = None
    _read: dict[str, int]

    def watch(self, schema: str) -> LockedReads:
        self.schema = schema
        self.found = []
        self._read = {}
        return self

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        cursor = super().execute(query, params, **kwargs)
        if self.schema and self.info.transaction_status == pq.TransactionStatus.INTRANS:
            self._check(query)
        return cursor

    def _check(self, query: Any) -> None:
        rows = super().execute(_READS, {"blocking": ACK_BLOCKING, "schema": self.schema}).fetchall()
        for transaction, table, read, held in rows:
            if transaction != self._transaction:
                self._transaction = transaction
                self._read = {}
            before = self._read.get(table, 0)
            self._read[table] = read
            if read > before and held:
                text = query if isinstance(query, str) else query.as_string(self)
                self.found.append(
                    f"{' '.join(text.split())[:120]}: read {read - before} rows of {table} "
                    f"holding {', '.join(held)}"
                )
