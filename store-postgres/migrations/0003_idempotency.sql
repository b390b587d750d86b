-- Idempotency-Key records: one per (credential, key). `scope` is the
-- SHA-256 of the credential that sent the request, `fingerprint` the
-- SHA-256 of the request; `response` is the first answer sealed with the
-- server key (it may carry a credential shown once), never plaintext.
CREATE TABLE idempotency_keys (
    scope         BYTEA NOT NULL,
    key           TEXT NOT NULL,
    fingerprint   BYTEA NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    status        INTEGER,
    response      BYTEA,
    created_at    TIMESTAMPTZ NOT NULL,
    locked_until  TIMESTAMPTZ NOT NULL,
    expires_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
