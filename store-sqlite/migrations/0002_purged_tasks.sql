-- Tasks removed by retention leave their id and token digest behind, so the
-- agent holding the token is told 404 (the task is gone) rather than 401
-- (the token is wrong).
CREATE TABLE purged_tasks (
    id                TEXT PRIMARY KEY,
    agent_token_hash  BLOB NOT NULL,
    purged_at         INTEGER NOT NULL
);
