"""Least-privilege group roles for a pgqueue schema (see docs/roles.md).

:func:`grant_roles` creates, if missing, four NOLOGIN group roles named after the
schema, and grants each exactly what pgqueue's statements (``sql/statements/``) need
when run by that kind of client:

- ``<schema>_producer``: enqueue (single, batch, COPY, idempotency and unique keys,
  dependencies), read jobs, cancel and retry them, and read the stats, queues, workers
  and schedules.
- ``<schema>_worker``: a member of the producer role (handlers and the scheduler
  enqueue), plus claim, heartbeat, ack, fail, reap, the worker registry, schedule sync
  and runs, and pruning finished jobs row by row. Not the day partitions of the history:
  creating and dropping a partition is reserved to the table's owner.
- ``<schema>_operator``: a member of the producer role, plus the queue controls (pause,
  concurrency and rate limits) and enabling or disabling schedules: what ``pgqueue api``
  and ``pgqueue queue`` / ``pgqueue schedule`` need.
- ``<schema>_owner``: owns the schema and everything in it (migrations, partition
  maintenance); it may also create schemas in the database, which ``pgqueue migrate``'s
  ``CREATE SCHEMA IF NOT EXISTS`` requires even for a schema that exists.

Members log in with roles of their own (``CREATE ROLE app LOGIN IN ROLE
pgqueue_producer``). Privileges not named here are revoked from the three client roles
on every run, so running it again after an upgrade leaves exactly this set.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgqueue import connections, migrations
from pgqueue.errors import PgQueueError, error_line
from pgqueue.settings import DEFAULT_SCHEMA, check_schema

PRODUCER = "producer"
WORKER = "worker"
OPERATOR = "operator"
OWNER = "owner"

# Per table, per client role: the privileges its statements need. A privilege given in
# parentheses is column-level. Row locks (FOR UPDATE, FOR NO KEY UPDATE) need UPDATE on
# at least one column, which is why some roles have a column-level UPDATE only.
_TABLE_GRANTS: dict[str, dict[str, list[str]]] = {
    "active_jobs": {
        # Insert, read, and cancel (a DELETE). The check of a dependent's dependencies
        # as its transaction commits (dependents_checked) runs as the schema's owner.
        PRODUCER: ["SELECT", "INSERT", "DELETE"],
        # Claim, heartbeat, fail, reap, release of dependents: any column.
        WORKER: ["UPDATE"],
    },
    "finished_jobs": {
        # Cancel moves a job in, retry moves one out.
        PRODUCER: ["SELECT", "INSERT", "DELETE"],
        # job_prune's FOR UPDATE SKIP LOCKED (Queue.prune names the parent table).
        WORKER: ["UPDATE"],
    },
    # The DEFAULT partitions are named directly by the automatic pruner's job_prune.
    "finished_jobs_succeeded_default": {WORKER: ["SELECT", "UPDATE", "DELETE"]},
    "finished_jobs_dead_default": {WORKER: ["SELECT", "UPDATE", "DELETE"]},
    "finished_jobs_cancelled_default": {WORKER: ["SELECT", "UPDATE", "DELETE"]},
    "jobs": {PRODUCER: ["SELECT"]},
    "job_dependencies": {
        PRODUCER: ["SELECT", "INSERT"],
        WORKER: ["DELETE"],  # pruning a job unlinks it
    },
    # An enqueue or retry of a waiting job records it for its transaction's commit to
    # check; the check (dependents_checked) deletes it, as the schema's owner.
    "dependents_to_check": {PRODUCER: ["INSERT"]},
    "idempotency_keys": {
        # job_insert_many_keyed takes keys; idempotency_keys_release and
        # job_delete_created give back those of jobs not created.
        PRODUCER: ["SELECT", "INSERT", "DELETE"],
    },
    "queue_counters": {
        # Cancel and retry adjust the counters (INSERT ... ON CONFLICT DO UPDATE).
        PRODUCER: ["SELECT", "INSERT", "UPDATE"],
    },
    "run_time_buckets": {
        PRODUCER: ["SELECT"],
        WORKER: ["INSERT", "UPDATE"],  # job_finish_many's histogram
    },
    "pickup_buckets": {
        # A cancel ends a running attempt, and counts its pickup wait (as
        # job_finish_many does for the worker).
        PRODUCER: ["SELECT", "INSERT", "UPDATE"],
    },
    "queue_waiters": {
        PRODUCER: ["SELECT"],  # enqueues notify only queues with a live waiter
        # A claim replaces its rows (taken FOR UPDATE SKIP LOCKED); the reaper and a
        # stopping worker delete them.
        WORKER: ["INSERT", "UPDATE", "DELETE"],
    },
    "job_waiters": {
        # Queue.wait (and the API's ?wait) records the jobs it waits for, renews and
        # deletes its rows; a statement that finishes jobs reads it to announce only
        # those; the reaper deletes expired rows.
        PRODUCER: ["SELECT", "INSERT", "UPDATE", "DELETE"],
    },
    "queue_settings": {
        PRODUCER: ["SELECT"],
        # A claim of a limited queue locks its row and spends its tokens; a handler's
        # Throttle(scope="queue") writes throttled_until, in a new row if need be (a
        # row that names nothing else: the settings stay the operator's).
        WORKER: ["INSERT (queue, throttled_until)", "UPDATE (tokens, tokens_at, throttled_until)"],
        OPERATOR: ["INSERT", "UPDATE"],
    },
    "partition_controls": {
        PRODUCER: ["SELECT"],
        # Claims spend the keys' buckets, handlers throttle keys, the reaper deletes
        # the rows that hold nothing any more.
        WORKER: ["INSERT", "UPDATE", "DELETE"],
        OPERATOR: ["INSERT", "UPDATE"],  # Queue.throttle of one key
    },
    "fair_share_cursors": {
        PRODUCER: ["SELECT"],
        WORKER: ["INSERT", "UPDATE"],  # a claim moves its queue's turn on
    },
    "workers": {
        PRODUCER: ["SELECT"],
        WORKER: ["INSERT", "UPDATE", "DELETE"],
    },
    "workers_kept_since": {
        PRODUCER: ["SELECT"],  # --reject-unserved-tasks asks whether the registry is whole
        WORKER: ["INSERT", "UPDATE"],  # the first register or beat after it was lost
    },
    "schedules": {
        PRODUCER: ["SELECT"],
        # Sync inserts and redefines rows; runs lock and move them on. Never deleted.
        WORKER: ["INSERT", "UPDATE"],
        OPERATOR: ["UPDATE (enabled, disabled_by, next_run_at, error, updated_at)"],
    },
    # Every command checks the schema's version before it starts.
    "migrations": {PRODUCER: ["SELECT"]},
}

_SEQUENCE_GRANTS: dict[str, dict[str, list[str]]] = {
    # nextval(): the ids of keyed and COPY enqueues, and active_jobs' default.
    "job_ids": {PRODUCER: ["USAGE"]},
}


@dataclass(frozen=True)
class Roles:
    """The names of a schema's group roles."""

    producer: str
    worker: str
    operator: str
    owner: str

    def all(self) -> list[str]:
        """Every role, the owner last."""
        return [self.producer, self.worker, self.operator, self.owner]


def role_names(schema: str = DEFAULT_SCHEMA) -> Roles:
    """The group roles of ``schema``: ``<schema>_producer``, ``<schema>_worker``,
    ``<schema>_operator`` and ``<schema>_owner`` (``pgqueue_producer``, ... for the
    default schema). Roles are cluster-wide, so each schema has its own."""
    check_schema(schema)
    return Roles(
        producer=f"{schema}_{PRODUCER}",
        worker=f"{schema}_{WORKER}",
        operator=f"{schema}_{OPERATOR}",
        owner=f"{schema}_{OWNER}",
    )


class RolesError(PgQueueError):
    """The roles could not be granted (schema not migrated, caller not allowed, ...)."""


def grant_roles(conninfo: str, schema: str = DEFAULT_SCHEMA) -> Roles:
    """Create ``schema``'s group roles if missing and grant each exactly its privileges
    (see the module's docstring), in one transaction; return their names.

    ``schema`` must be migrated. Run as a superuser (or a role that may create roles,
    is a member of the current owner and of the new one): ownership of the schema and of
    everything in it moves to the owner role. Safe to run again, and to be run after
    every ``pgqueue migrate`` that adds tables."""
    roles = role_names(schema)
    try:
        with connections.connect(conninfo) as conn:
            problem = migrations.unmigrated(conn, schema)
            if problem:
                raise RolesError(f"{problem}: run `pgqueue migrate` first")
            with conn.transaction():
                _apply(conn, schema, roles)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise RolesError(f"cannot grant the roles: {error_line(exc)}") from None
    return roles


def _apply(conn: psycopg.Connection, schema: str, roles: Roles) -> None:
    ident = sql.Identifier
    by_kind = {PRODUCER: roles.producer, WORKER: roles.worker, OPERATOR: roles.operator}
    for name in roles.all():
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(ident(name)))
    # The worker and the operator do what producers do, and more.
    for member in (roles.worker, roles.operator):
        conn.execute(sql.SQL("GRANT {} TO {}").format(ident(roles.producer), ident(member)))

    _give_to_owner(conn, schema, roles.owner)
    # `pgqueue migrate` runs CREATE SCHEMA IF NOT EXISTS, which checks this privilege
    # before it looks whether the schema exists.
    conn.execute(
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            ident(conn.info.dbname), ident(roles.owner)
        )
    )

    clients = sql.SQL(", ").join(ident(name) for name in by_kind.values())
    # Start from nothing, so that the grants below are exactly what each role holds.
    for kind in ("TABLES", "SEQUENCES", "FUNCTIONS"):
        conn.execute(
            sql.SQL("REVOKE ALL ON ALL {} IN SCHEMA {} FROM {}").format(
                sql.SQL(kind), ident(schema), clients
            )
        )
    conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(ident(schema), clients))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(ident(schema), clients))
    # run_time_bounds() and errors_appended(): pure helpers of the statements.
    conn.execute(
        sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {} TO {}").format(
            ident(schema), ident(roles.producer)
        )
    )
    for grants, what in ((_TABLE_GRANTS, "TABLE"), (_SEQUENCE_GRANTS, "SEQUENCE")):
        for relation, per_kind in grants.items():
            for kind, privileges in per_kind.items():
                for privilege in privileges:
                    conn.execute(
                        sql.SQL("GRANT {} ON {} {}.{} TO {}").format(
                            sql.SQL(privilege),
                            sql.SQL(what),
                            ident(schema),
                            ident(relation),
                            ident(by_kind[kind]),
                        )
                    )


def _give_to_owner(conn: psycopg.Connection, schema: str, owner: str) -> None:
    """Make ``owner`` own the schema, its relations (every partition included: ownership
    does not follow a partitioned table), its types and its functions."""
    ident = sql.Identifier
    conn.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(ident(schema), ident(owner)))
    kinds = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "S": "SEQUENCE", "m": "MATERIALIZED VIEW"}
    relations = conn.execute(
        "SELECT c.relname, c.relkind FROM pg_class AS c"
        " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind = ANY(%s) ORDER BY c.relname",
        (schema, list(kinds)),
    ).fetchall()
    for name, relkind in relations:
        conn.execute(
            sql.SQL("ALTER {} {}.{} OWNER TO {}").format(
                sql.SQL(kinds[relkind]), ident(schema), ident(name), ident(owner)
            )
        )
    types = conn.execute(
        "SELECT t.typname FROM pg_type AS t JOIN pg_namespace AS n ON n.oid = t.typnamespace"
        " WHERE n.nspname = %s AND t.typtype = 'e' ORDER BY t.typname",
        (schema,),
    ).fetchall()
    for (name,) in types:
        conn.execute(
            sql.SQL("ALTER TYPE {}.{} OWNER TO {}").format(ident(schema), ident(name), ident(owner))
        )
    functions = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
        " JOIN pg_namespace AS n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s ORDER BY 1",
        (schema,),
    ).fetchall()
    for (signature,) in functions:
        # regprocedure's text is the schema-qualified, quoted signature.
        conn.execute(
            sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(sql.SQL(signature), ident(owner))
        )
