-- Tombstones are forgotten oldest first (Store::forget_purged_before).
CREATE INDEX purged_tasks_purged_at ON purged_tasks (purged_at);
