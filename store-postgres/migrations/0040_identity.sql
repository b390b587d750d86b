-- Identity and access (issue 21): principals, their API keys, who owns a
-- task, who created an invite, suspended workers, and the audit trail.
-- Credentials are stored only as SHA-256 digests, as everywhere else.

-- Operators and agents. Workers keep their own table (their id is their
-- principal id). The development key acts as the built-in principal below;
-- tasks and invites made before this migration belong to it.
CREATE TABLE principals (
    id          UUID PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('operator', 'agent')),
    name        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);
INSERT INTO principals (id, kind, name, created_at)
VALUES ('00000000-0000-0000-0000-00000000de00', 'operator', 'development', now());

-- An API key `msk_<id>_<secret>`: looked up by id, its secret compared with
-- `digest` in constant time. A rotation keeps the previous digest valid
-- until `previous_valid_until` (a grace period for the key's users).
CREATE TABLE api_keys (
    id                    UUID PRIMARY KEY,
    principal_id          UUID NOT NULL REFERENCES principals (id),
    name                  TEXT NOT NULL,
    -- Scope names separated by spaces (tasks, workers:register, invites, operator).
    scopes                TEXT NOT NULL,
    digest                BYTEA NOT NULL,
    previous_digest       BYTEA,
    previous_valid_until  TIMESTAMPTZ,
    expires_at            TIMESTAMPTZ,
    created_at            TIMESTAMPTZ NOT NULL,
    rotated_at            TIMESTAMPTZ,
    -- Written at most about once a minute per key, from memory.
    last_used_at          TIMESTAMPTZ,
    revoked_at            TIMESTAMPTZ
);
CREATE INDEX api_keys_principal ON api_keys (principal_id);

ALTER TABLE tasks ADD COLUMN owner_id UUID NOT NULL
    DEFAULT '00000000-0000-0000-0000-00000000de00' REFERENCES principals (id);
-- An agent lists its own tasks, newest first.
CREATE INDEX tasks_owner ON tasks (owner_id, created_at DESC, id DESC);

ALTER TABLE workers ADD COLUMN suspended_at TIMESTAMPTZ;

ALTER TABLE worker_invites ADD COLUMN created_by UUID NOT NULL
    DEFAULT '00000000-0000-0000-0000-00000000de00' REFERENCES principals (id);
ALTER TABLE worker_invites ADD COLUMN revoked_at TIMESTAMPTZ;

-- Privileged actions, append-only: the server inserts rows and retention
-- deletes those older than the configured period; nothing updates a row.
-- `principal_id` is the actor (an operator, an agent, or the development
-- principal), without a foreign key so that a row never blocks anything.
CREATE TABLE audit (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            TIMESTAMPTZ NOT NULL,
    principal_id  UUID NOT NULL,
    action        TEXT NOT NULL,
    target        TEXT NOT NULL,
    address       TEXT,
    detail        JSONB
);
CREATE INDEX audit_at ON audit (at);
CREATE INDEX audit_principal ON audit (principal_id, id);
