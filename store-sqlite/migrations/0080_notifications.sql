-- Notifications: each worker's area and preferences, its browsers' push
-- subscriptions, the outbox of causes and the notifications themselves.
-- Times are milliseconds since the Unix epoch, as in 0001.
ALTER TABLE workers ADD COLUMN area_latitude REAL;
ALTER TABLE workers ADD COLUMN area_longitude REAL;
ALTER TABLE workers ADD COLUMN area_radius_m INTEGER;
ALTER TABLE workers ADD COLUMN notify_new_tasks INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN notify_my_tasks INTEGER NOT NULL DEFAULT 1;
ALTER TABLE workers ADD COLUMN notify_email TEXT;
-- The fan-out reads the workers who asked for new tasks, in id order.
CREATE INDEX workers_notify_new_tasks ON workers (id) WHERE notify_new_tasks;

CREATE TABLE push_subscriptions (
    endpoint    TEXT    PRIMARY KEY,
    worker_id   TEXT    NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    p256dh      TEXT    NOT NULL,
    auth        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX push_subscriptions_worker ON push_subscriptions (worker_id);

-- The outbox: an event that may notify someone is recorded here by the
-- transaction that appends it (the trigger below), and the controller
-- turns it into notifications. `next_worker` is how far an announcement's
-- fan-out has gone (workers with smaller ids have theirs); `lease_until`
-- keeps other controllers off a cause being worked on.
CREATE TABLE notification_causes (
    event_id     INTEGER PRIMARY KEY REFERENCES events (id) ON DELETE CASCADE,
    task_id      TEXT    NOT NULL,
    type         TEXT    NOT NULL,
    actor        TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    next_worker  TEXT,
    lease_until  INTEGER
);

-- The event types of meatspace_domain::notify::Cause::EVENT_TYPES.
CREATE TRIGGER events_notification_cause AFTER INSERT ON events FOR EACH ROW
    WHEN NEW.type IN ('task.published', 'agent.issue_response', 'task.revision_requested',
                      'task.completed', 'task.cancelled')
BEGIN
    INSERT INTO notification_causes (event_id, task_id, type, actor, created_at)
    VALUES (NEW.id, NEW.task_id, NEW.type, NEW.actor, NEW.created_at);
END;

-- One row per worker, cause and channel (the key makes it once); due
-- while `next_attempt_at` is set, done when `outcome` is.
CREATE TABLE notifications (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    worker_id        TEXT    NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    cause_key        TEXT    NOT NULL,
    cause            TEXT    NOT NULL,
    task_id          TEXT    NOT NULL,
    channel          TEXT    NOT NULL,
    created_at       INTEGER NOT NULL,
    next_attempt_at  INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    outcome          TEXT,
    done_at          INTEGER,
    UNIQUE (worker_id, cause_key, channel)
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX notifications_sent ON notifications (worker_id, channel, done_at) WHERE outcome = 'sent';
