-- Operator console sessions: made when an operator signs in with an API
-- key (or the development key: no key_id), kept server-side. `key_digest`
-- is the digest of the secret signed in with, so a session ends when that
-- secret stops opening its key (revoked, expired, rotated out). Times are
-- milliseconds since the Unix epoch, as in 0001.
CREATE TABLE console_sessions (
    id            TEXT    PRIMARY KEY,
    secret_hash   BLOB    NOT NULL,
    key_id        TEXT,
    key_digest    BLOB,
    principal_id  TEXT    NOT NULL,
    created_at    INTEGER NOT NULL,
    last_seen_at  INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL
);
CREATE INDEX console_sessions_expires_at ON console_sessions (expires_at);
