-- Join a statement's old and new rows by hashing, whatever their estimated size.
--
-- rollup_jobs_updated() joins each UPDATE's old and new rows (its transition tables)
-- on id. The planner has no statistics for transition tables and may estimate them at
-- one row each, and then it picks a nested loop, which compares every old row with
-- every new one: for a worker that claims or acks hundreds of jobs in one statement,
-- 296,000 comparisons and 60 to 100 ms for 544 jobs instead of about a millisecond.
-- Without nested loops the same statements hash the join (or merge it) at any size.
ALTER FUNCTION {schema}.rollup_jobs_updated() SET enable_nestloop = off;
