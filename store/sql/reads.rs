//! The store's reads of tasks, their feeds, issues and photos: one source
//! for both backends, compiled by each over its `dialect` module like
//! `identity.rs` (see there). Rows become values through the backend's
//! own codecs (`task_from_row`, `event_from_row`, `issue_from_row`).

use chrono::{DateTime, Utc};
use meatspace_domain::{Event, EventType, Issue, Task, TaskState};
use meatspace_store::engine::COUNT_EVENTS_SQL;
use meatspace_store::token::TokenHash;
use meatspace_store::{
    FeedRead, OpenPlace, OpenTasksCursor, Photo, StoreError, TaskReads, TaskRequest, stored_event,
};
use sqlx::Row as _;
use uuid::Uuid;

use crate::dialect as d;
use crate::sql::read_all;
use crate::{TASK_COLUMNS, event_from_row, issue_from_row, task_from_row};

#[async_trait::async_trait]
impl TaskReads for d::Store {
    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn task(&self, id: Uuid) -> Result<Option<Task>, StoreError> {
        let row = sqlx::query(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
            .bind(d::id(id))
            .fetch_optional(d::reader(self))
            .await?;
        row.as_ref().map(task_from_row).transpose()
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn agent_token_hash(&self, task_id: Uuid) -> Result<Option<TokenHash>, StoreError> {
        let bytes: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT agent_token_hash FROM tasks WHERE id = $1 \
             UNION ALL SELECT agent_token_hash FROM purged_tasks WHERE id = $1 LIMIT 1",
        )
        .bind(d::id(task_id))
        .fetch_optional(d::reader(self))
        .await?;
        Ok(bytes.as_deref().and_then(TokenHash::from_slice))
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn events(
        &self,
        task_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let query = sqlx::query(
            "SELECT id, task_id, type, actor, created_at, data FROM events \
             WHERE task_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(d::id(task_id))
        .bind(after)
        .bind(i64::from(limit));
        read_all(self, query, event_from_row).await
    }

    async fn feed_read(
        &self,
        task_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Option<FeedRead>, StoreError> {
        // One row per event, or one row with NULL event columns when the
        // page is empty; no row when the task does not exist. One statement
        // reads one snapshot.
        let rows = sqlx::query(
            "SELECT t.agent_token_hash, t.state, t.last_event_id, \
               e.id, e.type, e.actor, e.created_at, e.data \
             FROM tasks t LEFT JOIN (SELECT id, type, actor, created_at, data FROM events \
               WHERE task_id = $1 AND id > $2 ORDER BY id LIMIT $3) e ON TRUE \
             WHERE t.id = $1 ORDER BY e.id",
        )
        .bind(d::id(task_id))
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(d::reader(self))
        .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let hash: &[u8] = first.try_get("agent_token_hash")?;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(id) = row.try_get::<Option<i64>, _>("id")? else {
                continue;
            };
            events.push(stored_event(
                id,
                task_id,
                row.try_get("type")?,
                d::read_time(row, "created_at")?,
                row.try_get("actor")?,
                d::read_json(row, "data")?.unwrap_or_default(),
            )?);
        }
        let state: &str = first.try_get("state")?;
        Ok(Some(FeedRead {
            agent_token_hash: TokenHash::from_slice(hash)
                .ok_or_else(|| StoreError::Corrupt("agent token digest".into()))?,
            state: TaskState::parse(state)
                .ok_or_else(|| StoreError::Corrupt(format!("task state {state:?}")))?,
            last_event_id: first.try_get("last_event_id")?,
            events,
        }))
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn issues(&self, task_id: Uuid) -> Result<Vec<Issue>, StoreError> {
        let query = sqlx::query("SELECT * FROM issues WHERE task_id = $1 ORDER BY event_id")
            .bind(d::id(task_id));
        read_all(self, query, issue_from_row).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn photo(&self, task_id: Uuid, photo_id: Uuid) -> Result<Option<Photo>, StoreError> {
        let row = sqlx::query(
            "SELECT id, task_id, content_type, data, created_at FROM photos \
             WHERE id = $1 AND task_id = $2",
        )
        .bind(d::id(photo_id))
        .bind(d::id(task_id))
        .fetch_optional(d::reader(self))
        .await?;
        row.map(|r| {
            Ok(Photo {
                id: d::read_id(&r, "id")?,
                task_id: d::read_id(&r, "task_id")?,
                content_type: r.try_get("content_type")?,
                bytes: r.try_get("data")?,
                created_at: d::read_time(&r, "created_at")?,
            })
        })
        .transpose()
    }

    async fn photo_bytes(&self, task_id: Uuid) -> Result<u64, StoreError> {
        let bytes: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(length(data)), 0) FROM photos WHERE task_id = $1",
        )
        .bind(d::id(task_id))
        .fetch_one(d::reader(self))
        .await?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn worker_token_hash(&self, worker_id: Uuid) -> Result<Option<TokenHash>, StoreError> {
        let bytes: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT token_hash FROM workers WHERE id = $1 AND suspended_at IS NULL",
        )
        .bind(d::id(worker_id))
        .fetch_optional(d::reader(self))
        .await?;
        Ok(bytes.as_deref().and_then(TokenHash::from_slice))
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn open_tasks(
        &self,
        cursor: Option<OpenTasksCursor>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError> {
        open_tasks_where(self, "", cursor, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn open_unlocated_tasks(
        &self,
        cursor: Option<OpenTasksCursor>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError> {
        open_tasks_where(self, "AND cell IS NULL", cursor, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn open_places_in_cells(
        &self,
        ranges: &[(i64, i64)],
    ) -> Result<Vec<OpenPlace>, StoreError> {
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        // One range scan of the partial index `tasks_open_cell` per range:
        // a branch each, which both planners take as it is (SQLite does not
        // turn an OR of ranges into index scans of a partial index). The
        // index holds every column read here, so the table is not touched.
        let branches: Vec<String> = (0..ranges.len())
            .map(|i| {
                format!(
                    "SELECT id, latitude, longitude FROM tasks WHERE state = 'open' \
                     AND cell IS NOT NULL AND cell BETWEEN ${} AND ${}",
                    2 * i + 1,
                    2 * i + 2
                )
            })
            .collect();
        let sql = branches.join(" UNION ALL ");
        let mut query = sqlx::query(&sql);
        for &(lo, hi) in ranges {
            query = query.bind(lo).bind(hi);
        }
        read_all(self, query, |row| {
            Ok(OpenPlace {
                id: d::read_id(row, "id")?,
                latitude: row.try_get("latitude")?,
                longitude: row.try_get("longitude")?,
            })
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn tasks_by_id(&self, ids: &[Uuid]) -> Result<Vec<Task>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE id IN ({})",
            placeholders(ids.len())
        );
        let mut query = sqlx::query(&sql);
        for &id in ids {
            query = query.bind(d::id(id));
        }
        read_all(self, query, task_from_row).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn tasks_after(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Task>, StoreError> {
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id > $1 ORDER BY id LIMIT $2");
        let query = sqlx::query(&sql)
            .bind(d::id(after.unwrap_or_default()))
            .bind(i64::from(limit));
        read_all(self, query, task_from_row).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn next_deadline(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = sqlx::query(
            "SELECT min(next_deadline) AS next FROM tasks WHERE next_deadline IS NOT NULL",
        )
        .fetch_one(d::reader(self))
        .await?;
        d::read_opt_time(&row, "next")
    }

    async fn count_events(&self, task_id: Uuid, up_to: u64) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(COUNT_EVENTS_SQL)
            .bind(d::id(task_id))
            .bind(i64::try_from(up_to).unwrap_or(i64::MAX))
            .fetch_one(d::reader(self))
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn last_event_of_type(
        &self,
        task_id: Uuid,
        kind: EventType,
    ) -> Result<Option<i64>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT max(id) FROM events WHERE task_id = $1 AND type = $2")
                .bind(d::id(task_id))
                .bind(kind.as_str())
                .fetch_one(d::reader(self))
                .await?,
        )
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn worker_tasks(&self, worker_id: Uuid, limit: u32) -> Result<Vec<Task>, StoreError> {
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE worker_id = $1 \
             ORDER BY updated_at DESC, id DESC LIMIT $2"
        );
        let query = sqlx::query(&sql)
            .bind(d::id(worker_id))
            .bind(i64::from(limit));
        read_all(self, query, task_from_row).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn newest_open_tasks(&self, limit: u32) -> Result<Vec<Task>, StoreError> {
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE state = 'open' \
             ORDER BY created_at DESC, id DESC LIMIT $1"
        );
        let query = sqlx::query(&sql).bind(i64::from(limit));
        read_all(self, query, task_from_row).await
    }

    async fn task_request(&self, resource_uid: &str) -> Result<Option<TaskRequest>, StoreError> {
        let row = sqlx::query(
            "SELECT resource_uid, task_id, namespace, name, created_at FROM task_requests \
             WHERE resource_uid = $1",
        )
        .bind(resource_uid)
        .fetch_optional(d::reader(self))
        .await?;
        row.as_ref().map(task_request_from_row).transpose()
    }

    async fn requested_among(&self, task_ids: &[Uuid]) -> Result<Vec<Uuid>, StoreError> {
        let mut found = Vec::new();
        // Well under either database's limit of bound parameters.
        for chunk in task_ids.chunks(500) {
            let sql = format!(
                "SELECT task_id FROM task_requests WHERE task_id IN ({})",
                placeholders(chunk.len())
            );
            let mut query = sqlx::query(&sql);
            for &id in chunk {
                query = query.bind(d::id(id));
            }
            for row in query.fetch_all(d::reader(self)).await? {
                found.push(d::read_id(&row, "task_id")?);
            }
        }
        Ok(found)
    }
}

/// Open tasks, oldest first, after `cursor`, that also meet `also` (a
/// fixed SQL condition, or nothing).
async fn open_tasks_where(
    store: &d::Store,
    also: &str,
    cursor: Option<OpenTasksCursor>,
    limit: u32,
) -> Result<Vec<Task>, StoreError> {
    let (created_at, id) = match cursor {
        Some(c) => (d::time(c.created_at), d::id(c.id)),
        None => d::before_every_task(),
    };
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE state = 'open' {also} \
         AND (created_at, id) > ($1, $2) ORDER BY created_at, id LIMIT $3"
    );
    let query = sqlx::query(&sql)
        .bind(created_at)
        .bind(id)
        .bind(i64::from(limit));
    read_all(store, query, task_from_row).await
}

/// `$1, $2, …, $n`: the parameters of an `IN` list.
pub(crate) fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `task_requests` row, as both the reads and the engine's claim see it.
pub(crate) fn task_request_from_row(row: &d::Row) -> Result<TaskRequest, StoreError> {
    Ok(TaskRequest {
        resource_uid: row.try_get("resource_uid")?,
        task_id: d::read_id(row, "task_id")?,
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        created_at: d::read_time(row, "created_at")?,
    })
}
