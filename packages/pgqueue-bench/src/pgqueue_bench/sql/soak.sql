-- What `pgqueue bench soak` reads every sample, and the index it adds to the audit
-- trail for it. pgqueue's tables are only read here.
--
-- Placeholders: {schema} is the quoted schema of the run. Parameters use psycopg's
-- %(name)s style.

-- name: soak_audit_index
-- A claim's pickup latency is measured from the later of its run_at and the moment its
-- dependencies released it (a release leaves run_at alone): found by job through this.
CREATE INDEX job_audit_job_idx ON {schema}.job_audit (job_id, id);

-- name: soak_window
-- The audit trail's rows since the previous sample's last row: jobs finished, and the
-- pickup latency of the claims (outside the limited queue, whose jobs wait for its
-- limit by design).
WITH new_rows AS (
    SELECT * FROM {schema}.job_audit WHERE id > %(after)s
),
pickups AS (
    SELECT extract(epoch FROM claim.at - greatest(claim.run_at, released.at)) AS seconds
    FROM new_rows AS claim
    LEFT JOIN LATERAL (
        SELECT max(earlier.at) AS at FROM {schema}.job_audit AS earlier
        WHERE earlier.job_id = claim.job_id AND earlier.id < claim.id
          AND earlier.from_state = 'waiting' AND earlier.to_state = 'queued'
    ) AS released ON true
    WHERE claim.from_state = 'queued' AND claim.to_state = 'running'
      AND claim.queue IS DISTINCT FROM %(limited_queue)s
)
SELECT coalesce((SELECT max(id) FROM new_rows), %(after)s) AS last_id,
       (SELECT count(*) FROM new_rows
        WHERE from_state IN ('waiting', 'queued', 'running')
          AND to_state IN ('succeeded', 'dead', 'cancelled')) AS finished,
       (SELECT count(*) FROM new_rows
        WHERE from_state = 'running' AND to_state = 'succeeded') AS succeeded,
       (SELECT count(*) FROM pickups) AS pickups,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) FROM pickups)
           AS pickup_p99_seconds,
       now() AS now;

-- name: soak_depth
SELECT state::text AS state, count(*) AS jobs FROM {schema}.active_jobs GROUP BY state;

-- name: soak_connections
-- Client connections to the server, by application, other than this one.
SELECT coalesce(nullif(application_name, ''), '(none)') AS application, count(*) AS connections
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
GROUP BY 1 ORDER BY 1;

-- name: soak_tables
-- Each table of the schema with its partitions summed up: bytes of the table (with its
-- TOAST), of its indexes, and its live and dead tuples as the statistics last saw them.
-- pg_partition_tree gives no rows for a table that is not partitioned: the UNION adds
-- the table itself (once, as a partitioned table is in its own tree).
SELECT root.relname AS table_name,
       sum(pg_table_size(leaf.relid))::bigint AS table_bytes,
       sum(pg_indexes_size(leaf.relid))::bigint AS index_bytes,
       sum(coalesce(stats.n_live_tup, 0))::bigint AS live_tuples,
       sum(coalesce(stats.n_dead_tup, 0))::bigint AS dead_tuples
FROM pg_class AS root
JOIN pg_namespace AS ns ON ns.oid = root.relnamespace
CROSS JOIN LATERAL (
    SELECT tree.relid FROM pg_partition_tree(root.oid) AS tree
    UNION SELECT root.oid::regclass
) AS leaf
LEFT JOIN pg_stat_user_tables AS stats ON stats.relid = leaf.relid
WHERE ns.nspname = %(schema_name)s AND root.relkind IN ('r', 'p') AND NOT root.relispartition
GROUP BY root.relname
ORDER BY root.relname;

-- name: soak_now
SELECT now() AS now;
