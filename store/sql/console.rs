//! The operator console's sessions and overview counts: one source for
//! both backends, compiled by each over its `dialect` module like
//! `identity.rs` (see there).

use chrono::{DateTime, Utc};
use meatspace_domain::{Task, TaskState};
use meatspace_store::StoreError;
use meatspace_store::console::{ConsoleSession, ConsoleStore, Health, HourCount, TaskFilter};
use meatspace_store::token::TokenHash;
use sqlx::Row as _;
use uuid::Uuid;

use crate::dialect::{self as d, Row};
use crate::identity::{WORKER_COLUMNS, worker_from_row};
use crate::sql::read_all;
use crate::{TASK_COLUMNS, task_from_row};

const SESSION_COLUMNS: &str =
    "id, secret_hash, key_id, key_digest, principal_id, created_at, last_seen_at, expires_at";

fn digest(bytes: Vec<u8>) -> Result<TokenHash, StoreError> {
    TokenHash::from_slice(&bytes).ok_or_else(|| StoreError::Corrupt("session digest".into()))
}

fn session_from_row(row: &Row) -> Result<ConsoleSession, StoreError> {
    let key_digest: Option<Vec<u8>> = row.try_get("key_digest")?;
    Ok(ConsoleSession {
        id: d::read_id(row, "id")?,
        secret_hash: digest(row.try_get("secret_hash")?)?,
        key_id: d::read_opt_id(row, "key_id")?,
        key_digest: key_digest.map(digest).transpose()?,
        principal_id: d::read_id(row, "principal_id")?,
        created_at: d::read_time(row, "created_at")?,
        last_seen_at: d::read_time(row, "last_seen_at")?,
        expires_at: d::read_time(row, "expires_at")?,
    })
}

fn count(row: &Row, column: &str) -> Result<u64, StoreError> {
    let n: i64 = row.try_get(column)?;
    Ok(u64::try_from(n).unwrap_or_default())
}

/// `text` as a LIKE pattern that matches it anywhere, its own `%`, `_`
/// and `\\` taken literally.
fn contains_pattern(text: &str) -> String {
    let mut p = String::from("%");
    for c in text.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

#[async_trait::async_trait]
impl ConsoleStore for d::Store {
    async fn console_workers(
        &self,
        search: Option<&str>,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<meatspace_domain::identity::Worker>, StoreError> {
        let sql = format!(
            "SELECT {WORKER_COLUMNS} FROM workers \
             WHERE ($1 IS NULL OR lower(name) LIKE $1 ESCAPE '\\') AND id > $2 \
             ORDER BY id LIMIT $3"
        );
        let query = sqlx::query(&sql)
            .bind(search.map(contains_pattern))
            .bind(d::id(after.unwrap_or_default()))
            .bind(i64::from(limit));
        read_all(self, query, worker_from_row).await
    }

    async fn console_tasks(&self, f: &TaskFilter) -> Result<Vec<(Task, Uuid)>, StoreError> {
        let (before_at, before_id) = match f.before {
            Some((at, id)) => (Some(d::time(at)), Some(d::id(id))),
            None => (None, None),
        };
        let sql = format!(
            "SELECT {TASK_COLUMNS}, owner_id AS console_owner FROM tasks \
             WHERE ($1 IS NULL OR state = $1) AND ($2 IS NULL OR owner_id = $2) \
             AND ($3 IS NULL OR created_at >= $3) AND ($4 IS NULL OR created_at < $4) \
             AND ($5 IS NULL OR lower(description) LIKE $5 ESCAPE '\\') \
             AND ($6 IS NULL OR created_at < $6 OR (created_at = $6 AND id < $7)) \
             ORDER BY created_at DESC, id DESC LIMIT $8"
        );
        let query = sqlx::query(&sql)
            .bind(f.state.map(|s| s.as_str()))
            .bind(f.owner.map(d::id))
            .bind(d::opt_time(f.since))
            .bind(d::opt_time(f.until))
            .bind(f.search.as_deref().map(contains_pattern))
            .bind(before_at)
            .bind(before_id)
            .bind(i64::from(f.limit));
        read_all(self, query, |row| {
            Ok((task_from_row(row)?, d::read_id(row, "console_owner")?))
        })
        .await
    }

    async fn create_console_session(&self, s: &ConsoleSession) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO console_sessions ({SESSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        );
        let query = sqlx::query(&sql)
            .bind(d::id(s.id))
            .bind(&s.secret_hash.0[..])
            .bind(s.key_id.map(d::id))
            .bind(s.key_digest.as_ref().map(|k| k.0.to_vec()))
            .bind(d::id(s.principal_id))
            .bind(d::time(s.created_at))
            .bind(d::time(s.last_seen_at))
            .bind(d::time(s.expires_at));
        d::write_statement(self, query).await?;
        Ok(())
    }

    async fn console_session(
        &self,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM console_sessions WHERE id = $1 AND expires_at > $2"
        ))
        .bind(d::id(id))
        .bind(d::time(now))
        .fetch_optional(d::reader(self))
        .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn touch_console_session(&self, id: Uuid, at: DateTime<Utc>) -> Result<(), StoreError> {
        let query = sqlx::query(
            "UPDATE console_sessions SET last_seen_at = $1 WHERE id = $2 AND last_seen_at < $1",
        )
        .bind(d::time(at))
        .bind(d::id(id));
        d::write_statement(self, query).await?;
        Ok(())
    }

    async fn end_console_session(&self, id: Uuid) -> Result<(), StoreError> {
        let query = sqlx::query("DELETE FROM console_sessions WHERE id = $1").bind(d::id(id));
        d::write_statement(self, query).await?;
        Ok(())
    }

    async fn purge_console_sessions(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        crate::sql::delete_due(
            self,
            "console_sessions",
            "id",
            "expires_at <= $1",
            now,
            limit,
        )
        .await
    }

    async fn health(&self) -> Result<Health, StoreError> {
        let reader = d::reader(self);
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM webhooks WHERE state = 'failing') AS failing, \
             (SELECT COUNT(*) FROM webhooks WHERE state = 'disabled') AS disabled",
        )
        .fetch_one(reader)
        .await?;
        // The review's state is in its JSON: read those of the active
        // tasks under review, and let the domain say which wait.
        let reviews =
            sqlx::query("SELECT review FROM tasks WHERE state = 'active' AND review IS NOT NULL")
                .fetch_all(reader)
                .await?;
        let mut waiting = 0;
        for r in &reviews {
            let text: String = r.try_get("review")?;
            let review: meatspace_domain::Review = serde_json::from_str(&text)
                .map_err(|_| StoreError::Corrupt("a task's review".into()))?;
            waiting += u64::from(review.is_waiting());
        }
        Ok(Health {
            webhooks_failing: count(&row, "failing")?,
            webhooks_disabled: count(&row, "disabled")?,
            reviews_waiting: waiting,
        })
    }

    async fn task_counts(&self) -> Result<Vec<(TaskState, u64)>, StoreError> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")
            .fetch_all(d::reader(self))
            .await?;
        let mut counts = rows
            .iter()
            .map(|row| {
                let state: &str = row.try_get("state")?;
                let state = TaskState::parse(state)
                    .ok_or_else(|| StoreError::Corrupt(format!("task state {state:?}")))?;
                Ok((state, count(row, "n")?))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        counts.sort_by_key(|(state, _)| TaskState::ALL.iter().position(|s| s == state));
        Ok(counts)
    }

    async fn oldest_open_task(&self) -> Result<Option<Task>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE state = 'open' \
             ORDER BY published_at, id LIMIT 1"
        ))
        .fetch_optional(d::reader(self))
        .await?;
        row.as_ref().map(task_from_row).transpose()
    }

    async fn tasks_per_hour(&self, since: DateTime<Utc>) -> Result<Vec<HourCount>, StoreError> {
        let created = d::hour_of("created_at");
        let ended = d::hour_of("ended_at");
        let sql = format!(
            "SELECT hour, SUM(created) AS created, SUM(completed) AS completed FROM ( \
               SELECT {created} AS hour, 1 AS created, 0 AS completed FROM tasks \
                 WHERE created_at >= $1 \
               UNION ALL \
               SELECT {ended} AS hour, 0 AS created, 1 AS completed FROM tasks \
                 WHERE state = 'completed' AND ended_at >= $1 \
             ) AS t GROUP BY hour ORDER BY hour"
        );
        let query = sqlx::query(&sql).bind(d::time(since));
        read_all(self, query, |row| {
            Ok(HourCount {
                hour: d::read_time(row, "hour")?,
                created: count(row, "created")?,
                completed: count(row, "completed")?,
            })
        })
        .await
    }
}
