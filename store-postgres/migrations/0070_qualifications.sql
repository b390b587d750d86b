-- Who may do a task: the qualifications operators grant workers (a name,
-- optionally a text or integer value, optionally an expiry), the workers
-- an agent's principal has blocked from all of its tasks, and a task's
-- requirements (JSON text the server reads whole).
CREATE TABLE worker_qualifications (
    worker_id   uuid        NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    value_text  text,
    value_int   bigint,
    granted_at  timestamptz NOT NULL,
    expires_at  timestamptz,
    PRIMARY KEY (worker_id, name),
    CHECK (value_text IS NULL OR value_int IS NULL)
);

CREATE TABLE worker_blocks (
    principal_id  uuid        NOT NULL,
    worker_id     uuid        NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (principal_id, worker_id)
);
-- A worker's listing reads who blocked it.
CREATE INDEX worker_blocks_worker ON worker_blocks (worker_id);

ALTER TABLE tasks ADD COLUMN requirements text;
