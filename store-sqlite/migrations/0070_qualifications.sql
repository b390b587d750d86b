-- Who may do a task: the qualifications operators grant workers (a name,
-- optionally a text or integer value, optionally an expiry), the workers
-- an agent's principal has blocked from all of its tasks, and a task's
-- requirements (JSON text the server reads whole). Times are milliseconds
-- since the Unix epoch, as in 0001.
CREATE TABLE worker_qualifications (
    worker_id   TEXT    NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    value_text  TEXT,
    value_int   INTEGER,
    granted_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    PRIMARY KEY (worker_id, name),
    CHECK (value_text IS NULL OR value_int IS NULL)
);

CREATE TABLE worker_blocks (
    principal_id  TEXT    NOT NULL,
    worker_id     TEXT    NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (principal_id, worker_id)
);
-- A worker's listing reads who blocked it.
CREATE INDEX worker_blocks_worker ON worker_blocks (worker_id);

ALTER TABLE tasks ADD COLUMN requirements TEXT;
