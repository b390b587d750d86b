-- Idempotency-Key records: one per (credential, key). `scope` is the
-- SHA-256 of the credential that sent the request, `fingerprint` the
-- SHA-256 of the request; `response` is the first answer sealed with the
-- server key (it may carry a credential shown once), never plaintext.
CREATE TABLE idempotency_keys (
    scope         BLOB NOT NULL,
    key           TEXT NOT NULL,
    fingerprint   BLOB NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    status        INTEGER,
    response      BLOB,
    created_at    INTEGER NOT NULL,
    locked_until  INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
