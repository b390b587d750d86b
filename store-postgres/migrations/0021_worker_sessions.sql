-- Browser sessions of workers in the web app. The cookie carries the id and
-- a secret; only the secret's SHA-256 digest is kept. Signing out deletes
-- the row.
CREATE TABLE worker_sessions (
    id           UUID PRIMARY KEY,
    worker_id    UUID NOT NULL REFERENCES workers (id),
    secret_hash  BYTEA NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX worker_sessions_expires_at ON worker_sessions (expires_at);
-- "My tasks" of the web app.
CREATE INDEX tasks_worker_id ON tasks (worker_id, updated_at) WHERE worker_id IS NOT NULL;
