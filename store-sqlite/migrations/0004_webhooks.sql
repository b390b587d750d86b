-- One webhook endpoint per task. Delivery is driven by a durable cursor:
-- `delivered_event_id` is the last event the endpoint acknowledged, and the
-- events table is the outbox (events with a greater id are due), so an
-- event is queued for delivery by the same transaction that appends it.
-- No secret is stored: the signing secret is derived from the server key.
CREATE TABLE webhooks (
    task_id             TEXT PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    url                 TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('active', 'failing', 'disabled')),
    delivered_event_id  INTEGER NOT NULL DEFAULT 0,
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     INTEGER,
    failing_since       INTEGER,
    last_error          TEXT,
    updated_at          INTEGER NOT NULL
);
CREATE INDEX webhooks_next_attempt_at ON webhooks (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
