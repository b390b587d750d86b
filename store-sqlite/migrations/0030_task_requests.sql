-- Tasks requested from Kubernetes: one row per MeatspaceTask resource that
-- an agent applied, keyed by the resource's UID and written in the same
-- transaction as the task, so that however many controllers race (or
-- restart), a resource gets at most one task. No foreign key: the row
-- outlives the task when retention removes it, so the resource is never
-- given a second one.
CREATE TABLE task_requests (
    resource_uid  TEXT PRIMARY KEY,
    task_id       TEXT NOT NULL UNIQUE,
    namespace     TEXT NOT NULL,
    name          TEXT NOT NULL,
    created_at    INTEGER NOT NULL
);
