-- Notifications: each worker's area and preferences, its browsers' push
-- subscriptions, the outbox of causes and the notifications themselves.
ALTER TABLE workers ADD COLUMN area_latitude double precision;
ALTER TABLE workers ADD COLUMN area_longitude double precision;
ALTER TABLE workers ADD COLUMN area_radius_m bigint;
ALTER TABLE workers ADD COLUMN notify_new_tasks boolean NOT NULL DEFAULT false;
ALTER TABLE workers ADD COLUMN notify_my_tasks boolean NOT NULL DEFAULT true;
ALTER TABLE workers ADD COLUMN notify_email text;
-- The fan-out reads the workers who asked for new tasks, in id order.
CREATE INDEX workers_notify_new_tasks ON workers (id) WHERE notify_new_tasks;

CREATE TABLE push_subscriptions (
    endpoint    text        PRIMARY KEY,
    worker_id   uuid        NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    p256dh      text        NOT NULL,
    auth        text        NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX push_subscriptions_worker ON push_subscriptions (worker_id);

-- The outbox: an event that may notify someone is recorded here by the
-- transaction that appends it (the trigger below), and the controller
-- turns it into notifications. `next_worker` is how far an announcement's
-- fan-out has gone (workers with smaller ids have theirs); `lease_until`
-- keeps other controllers off a cause being worked on.
CREATE TABLE notification_causes (
    event_id     bigint      PRIMARY KEY REFERENCES events (id) ON DELETE CASCADE,
    task_id      uuid        NOT NULL,
    type         text        NOT NULL,
    actor        text        NOT NULL,
    created_at   timestamptz NOT NULL,
    next_worker  uuid,
    lease_until  timestamptz
);

CREATE FUNCTION record_notification_cause() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notification_causes (event_id, task_id, type, actor, created_at)
    VALUES (NEW.id, NEW.task_id, NEW.type, NEW.actor, NEW.created_at);
    RETURN NULL;
END
$$;

-- The event types of meatspace_domain::notify::Cause::EVENT_TYPES.
CREATE TRIGGER events_notification_cause AFTER INSERT ON events FOR EACH ROW
    WHEN (NEW.type IN ('task.published', 'agent.issue_response', 'task.revision_requested',
                       'task.completed', 'task.cancelled'))
    EXECUTE FUNCTION record_notification_cause();

-- One row per worker, cause and channel (the key makes it once); due
-- while `next_attempt_at` is set, done when `outcome` is.
CREATE TABLE notifications (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker_id        uuid        NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    cause_key        text        NOT NULL,
    cause            text        NOT NULL,
    task_id          uuid        NOT NULL,
    channel          text        NOT NULL,
    created_at       timestamptz NOT NULL,
    next_attempt_at  timestamptz,
    attempts         bigint      NOT NULL DEFAULT 0,
    outcome          text,
    done_at          timestamptz,
    UNIQUE (worker_id, cause_key, channel)
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX notifications_sent ON notifications (worker_id, channel, done_at) WHERE outcome = 'sent';
