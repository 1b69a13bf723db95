-- idem_schedule_purge / idem_unschedule_purge where pg_cron is not
-- installed (test/run's SQL edition stage runs them with pg_cron for real):
-- a clear 55000 with the statement to run in pg_cron's database instead,
-- and the arguments checked first.
\i sql/include/expect_error.sql

SELECT pg_temp.expect_error($$SELECT idem_schedule_purge()$$);
SELECT pg_temp.expect_error($$SELECT idem_schedule_purge('*/5 * * * *', 500, 2)$$);
SELECT pg_temp.expect_error($$SELECT idem_unschedule_purge()$$);
SELECT pg_temp.expect_error($$SELECT idem_schedule_purge(NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_schedule_purge(batch_size => 0)$$);
SELECT pg_temp.expect_error($$SELECT idem_schedule_purge(max_batches => 0)$$);
