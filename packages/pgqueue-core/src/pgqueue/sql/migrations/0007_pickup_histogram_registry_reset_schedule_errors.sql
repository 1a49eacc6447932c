-- Version 7: the pickup histogram of /metrics (pickup_buckets, counted by the
-- statements that end attempts), since when the worker registry has been kept (so
-- that a registry emptied by a crash or a failover refuses no task), and why the
-- scheduler skips a schedule row it cannot evaluate. See ../schema.sql for what each
-- part is for; the statements that use them are in ../queries.sql.

CREATE TABLE {schema}.pickup_buckets (
    queue    text NOT NULL,
    le       double precision NOT NULL,
    slot     smallint NOT NULL,
    attempts bigint NOT NULL DEFAULT 0,
    seconds  double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, le, slot)
);

CREATE FUNCTION {schema}.pickup_bounds() RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                 900, 3600, 'Infinity']::float8[]
$$;

CREATE FUNCTION {schema}.pickup_seconds(
    started_at timestamptz, enqueued_at timestamptz, run_at timestamptz
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0, date_part('epoch', started_at - greatest(enqueued_at, run_at)))
$$;

-- The registry of a schema being upgraded was kept until now.
CREATE UNLOGGED TABLE {schema}.workers_kept_since (
    one            boolean PRIMARY KEY DEFAULT true CHECK (one),
    since          timestamptz NOT NULL,
    server_started timestamptz NOT NULL
);

INSERT INTO {schema}.workers_kept_since (since, server_started)
VALUES ('-infinity', pg_postmaster_start_time());

ALTER TABLE {schema}.schedules ADD COLUMN error text;
