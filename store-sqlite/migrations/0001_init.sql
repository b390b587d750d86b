-- meatspace schema for SQLite. Timestamps are INTEGER milliseconds since the
-- Unix epoch; ids are TEXT UUIDs. Tokens are stored only as SHA-256 digests.

CREATE TABLE workers (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    token_hash  BLOB NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE tasks (
    id                TEXT PRIMARY KEY,
    description       TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN
                        ('draft','open','assigned','active','completed','stopped','cancelled','expired')),
    agent_token_hash  BLOB NOT NULL,
    worker_id         TEXT REFERENCES workers (id),
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    published_at      INTEGER,
    assigned_at       INTEGER,
    started_at        INTEGER,
    ended_at          INTEGER,
    expires_at        INTEGER NOT NULL,
    start_by          INTEGER,
    active_until      INTEGER,
    next_deadline     INTEGER,
    open_issues       INTEGER NOT NULL DEFAULT 0,
    last_event_id     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tasks_next_deadline ON tasks (next_deadline) WHERE next_deadline IS NOT NULL;
CREATE INDEX tasks_open ON tasks (created_at, id) WHERE state = 'open';
CREATE INDEX tasks_ended_at ON tasks (ended_at) WHERE ended_at IS NOT NULL;

CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    type        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    data        TEXT NOT NULL
);
CREATE INDEX events_task_id ON events (task_id, id);

CREATE TABLE issues (
    event_id     INTEGER PRIMARY KEY REFERENCES events (id) ON DELETE CASCADE,
    task_id      TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('open','resolved','closed')),
    resolution   TEXT,
    resolved_at  INTEGER
);
CREATE INDEX issues_task_id ON issues (task_id, event_id);

CREATE TABLE photos (
    id            TEXT PRIMARY KEY,
    task_id       TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    content_type  TEXT NOT NULL,
    data          BLOB NOT NULL,
    created_at    INTEGER NOT NULL
);
CREATE INDEX photos_task_id ON photos (task_id);
