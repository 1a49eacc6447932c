-- What the throughput driver reads of pg_stat_statements (pgqueue bench throughput
-- --statements): the server's time per statement during a drain. The extension must be
-- loaded by the server (shared_preload_libraries); a private cluster loads it.
--
-- Parameters use psycopg's %(name)s style.

-- name: statement_stats_enable
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;

-- name: statement_stats_reset
-- Just before a run's load: the statements counted are the run's.
SELECT pg_stat_statements_reset();

-- name: statement_stats_read
-- The statements run on this database since the reset, by the time the server spent
-- executing them (wall time: with lock waits, without the round trips), other than
-- these readings. The query text is normalised (constants as $1, $2, ...).
SELECT s.query,
       sum(s.calls)::bigint AS calls,
       sum(s.rows)::bigint AS rows,
       sum(s.total_exec_time) AS total_exec_ms,
       sum(s.total_plan_time) AS total_plan_ms
FROM pg_stat_statements AS s
JOIN pg_database AS d ON d.oid = s.dbid
WHERE d.datname = current_database()
  AND s.query NOT LIKE '%%pg_stat_statements%%'
GROUP BY s.query
ORDER BY total_exec_ms DESC
LIMIT %(limit)s;
