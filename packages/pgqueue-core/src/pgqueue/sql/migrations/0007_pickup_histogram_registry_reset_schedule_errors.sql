-- Version 7: why the scheduler skips a schedule row it cannot evaluate. See
-- ../schema.sql for what each part is for.

ALTER TABLE {schema}.schedules ADD COLUMN error text;
