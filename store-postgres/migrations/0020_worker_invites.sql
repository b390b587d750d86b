-- One-time invitations for a person to become a worker through the web app.
-- The code is a credential: only its SHA-256 digest is kept. An invite is
-- redeemed once (used_at, worker_id) and not after expires_at.
CREATE TABLE worker_invites (
    id          UUID PRIMARY KEY,
    code_hash   BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    used_at     TIMESTAMPTZ,
    worker_id   UUID REFERENCES workers (id)
);
