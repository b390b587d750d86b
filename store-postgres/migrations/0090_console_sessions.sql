-- Operator console sessions: made when an operator signs in with an API
-- key (or the development key: no key_id), kept server-side. `key_digest`
-- is the digest of the secret signed in with, so a session ends when that
-- secret stops opening its key (revoked, expired, rotated out).
CREATE TABLE console_sessions (
    id            uuid        PRIMARY KEY,
    secret_hash   bytea       NOT NULL,
    key_id        uuid,
    key_digest    bytea,
    principal_id  uuid        NOT NULL,
    created_at    timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_at ON console_sessions (expires_at);
