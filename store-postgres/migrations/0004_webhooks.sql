-- One webhook endpoint per task. Delivery is driven by a durable cursor:
-- `delivered_event_id` is the last event the endpoint acknowledged, and the
-- events table is the outbox (events with a greater id are due), so an
-- event is queued for delivery by the same transaction that appends it.
-- No secret is stored: the signing secret is derived from the server key.
CREATE TABLE webhooks (
    task_id             UUID PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    url                 TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('active', 'failing', 'disabled')),
    delivered_event_id  BIGINT NOT NULL DEFAULT 0,
    attempts            INTEGER NOT NULL DEFAULT 0,
    -- When to try next (also a lease while a controller delivers); NULL once
    -- the terminal event is delivered or the endpoint is disabled.
    next_attempt_at     TIMESTAMPTZ,
    failing_since       TIMESTAMPTZ,
    last_error          TEXT,
    updated_at          TIMESTAMPTZ NOT NULL
);
CREATE INDEX webhooks_next_attempt_at ON webhooks (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
