-- Typed results and review: the JSON Schema the worker's result must match,
-- the review's terms and state, and the worker's latest result. JSON
-- documents the server reads and writes whole and never queries.
ALTER TABLE tasks ADD COLUMN result_schema TEXT;
ALTER TABLE tasks ADD COLUMN review TEXT;
ALTER TABLE tasks ADD COLUMN result TEXT;
