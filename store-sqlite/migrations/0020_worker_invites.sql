-- One-time invitations for a person to become a worker through the web app.
-- The code is a credential: only its SHA-256 digest is kept. An invite is
-- redeemed once (used_at, worker_id) and not after expires_at.
CREATE TABLE worker_invites (
    id          TEXT PRIMARY KEY,
    code_hash   BLOB NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER,
    worker_id   TEXT REFERENCES workers (id)
);
