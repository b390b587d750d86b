-- Identity and access (issue 21): principals, their API keys, who owns a
-- task, who created an invite, suspended workers, and the audit trail.
-- Credentials are stored only as SHA-256 digests, as everywhere else.
-- Times are milliseconds since the Unix epoch, as in 0001.

-- Operators and agents. Workers keep their own table (their id is their
-- principal id). The development key acts as the built-in principal below;
-- tasks and invites made before this migration belong to it.
CREATE TABLE principals (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('operator', 'agent')),
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
INSERT INTO principals (id, kind, name, created_at)
VALUES ('00000000-0000-0000-0000-00000000de00', 'operator', 'development',
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));

-- An API key `msk_<id>_<secret>`: looked up by id, its secret compared with
-- `digest` in constant time. A rotation keeps the previous digest valid
-- until `previous_valid_until` (a grace period for the key's users).
CREATE TABLE api_keys (
    id                    TEXT PRIMARY KEY,
    principal_id          TEXT NOT NULL REFERENCES principals (id),
    name                  TEXT NOT NULL,
    -- Scope names separated by spaces (tasks, workers:register, invites, operator).
    scopes                TEXT NOT NULL,
    digest                BLOB NOT NULL,
    previous_digest       BLOB,
    previous_valid_until  INTEGER,
    expires_at            INTEGER,
    created_at            INTEGER NOT NULL,
    rotated_at            INTEGER,
    -- Written at most about once a minute per key, from memory.
    last_used_at          INTEGER,
    revoked_at            INTEGER
);
CREATE INDEX api_keys_principal ON api_keys (principal_id);

-- SQLite cannot add a column with both a foreign key and a non-null
-- default; the server writes only principals that exist.
ALTER TABLE tasks ADD COLUMN owner_id TEXT NOT NULL
    DEFAULT '00000000-0000-0000-0000-00000000de00';
-- An agent lists its own tasks, newest first.
CREATE INDEX tasks_owner ON tasks (owner_id, created_at DESC, id DESC);

ALTER TABLE workers ADD COLUMN suspended_at INTEGER;

ALTER TABLE worker_invites ADD COLUMN created_by TEXT NOT NULL
    DEFAULT '00000000-0000-0000-0000-00000000de00';
ALTER TABLE worker_invites ADD COLUMN revoked_at INTEGER;

-- Privileged actions, append-only: the server inserts rows and retention
-- deletes those older than the configured period; nothing updates a row.
-- `principal_id` is the actor (an operator, an agent, or the development
-- principal).
CREATE TABLE audit (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at            INTEGER NOT NULL,
    principal_id  TEXT NOT NULL,
    action        TEXT NOT NULL,
    target        TEXT NOT NULL,
    address       TEXT,
    -- JSON text.
    detail        TEXT
);
CREATE INDEX audit_at ON audit (at);
CREATE INDEX audit_principal ON audit (principal_id, id);
