-- meatspace schema for PostgreSQL. Tokens are stored only as SHA-256 digests.

CREATE TABLE workers (
    id          UUID PRIMARY KEY,
    name        TEXT NOT NULL,
    token_hash  BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE tasks (
    id                UUID PRIMARY KEY,
    description       TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN
                        ('draft','open','assigned','active','completed','stopped','cancelled','expired')),
    agent_token_hash  BYTEA NOT NULL,
    worker_id         UUID REFERENCES workers (id),
    created_at        TIMESTAMPTZ NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL,
    published_at      TIMESTAMPTZ,
    assigned_at       TIMESTAMPTZ,
    started_at        TIMESTAMPTZ,
    ended_at          TIMESTAMPTZ,
    expires_at        TIMESTAMPTZ NOT NULL,
    start_by          TIMESTAMPTZ,
    active_until      TIMESTAMPTZ,
    -- The earliest deadline the controller must act on; NULL once terminal.
    next_deadline     TIMESTAMPTZ,
    open_issues       INTEGER NOT NULL DEFAULT 0,
    last_event_id     BIGINT NOT NULL DEFAULT 0
);

-- The controller's due-task lookup: only non-terminal tasks are indexed.
CREATE INDEX tasks_next_deadline ON tasks (next_deadline) WHERE next_deadline IS NOT NULL;
-- Workers browse open tasks oldest first.
CREATE INDEX tasks_open ON tasks (created_at, id) WHERE state = 'open';
-- Retention finds terminal tasks by end time.
CREATE INDEX tasks_ended_at ON tasks (ended_at) WHERE ended_at IS NOT NULL;

CREATE TABLE events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     UUID NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    type        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    data        JSONB NOT NULL
);
CREATE INDEX events_task_id ON events (task_id, id);

CREATE TABLE issues (
    event_id     BIGINT PRIMARY KEY REFERENCES events (id) ON DELETE CASCADE,
    task_id      UUID NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('open','resolved','closed')),
    resolution   TEXT,
    resolved_at  TIMESTAMPTZ
);
CREATE INDEX issues_task_id ON issues (task_id, event_id);

CREATE TABLE photos (
    id            UUID PRIMARY KEY,
    task_id       UUID NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    content_type  TEXT NOT NULL,
    data          BYTEA NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX photos_task_id ON photos (task_id);
