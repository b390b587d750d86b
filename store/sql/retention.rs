//! What the controller deletes once it is no longer needed: ended tasks
//! past their retention, the tombstones of purged tasks, used sign-ins and
//! expired idempotency records. One source for both backends, compiled by
//! each over its `dialect` module like `identity.rs` (see there).

use chrono::{DateTime, Utc};
use meatspace_store::{Retention, StoreError};
use uuid::Uuid;

use crate::dialect as d;

#[async_trait::async_trait]
impl Retention for d::Store {
    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn purge_ended_before(
        &self,
        cutoff: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let mut tx = d::begin(self).await?;
        let rows = sqlx::query(&format!(
            "SELECT id FROM tasks WHERE ended_at < $1 ORDER BY ended_at LIMIT $2{}",
            d::SKIP_LOCKED
        ))
        .bind(d::time(cutoff))
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        let ids = rows
            .iter()
            .map(|row| d::read_id(row, "id"))
            .collect::<Result<Vec<Uuid>, _>>()?;
        let mut deleted = 0;
        // Well under either database's limit of bound parameters.
        for chunk in ids.chunks(500) {
            let list = crate::reads::placeholders(chunk.len());
            let now_at = chunk.len() + 1;
            // Issues reference events, so they go first; events and photos
            // cascade from the task.
            let issues = format!("DELETE FROM issues WHERE task_id IN ({list})");
            let tombstones = format!(
                "INSERT INTO purged_tasks (id, agent_token_hash, purged_at) \
                 SELECT id, agent_token_hash, ${now_at} FROM tasks WHERE id IN ({list}) \
                 ON CONFLICT DO NOTHING"
            );
            let tasks = format!("DELETE FROM tasks WHERE id IN ({list})");
            let bind_ids = |sql| {
                chunk
                    .iter()
                    .fold(sqlx::query(sql), |q, &id| q.bind(d::id(id)))
            };
            bind_ids(&issues).execute(&mut *tx).await?;
            bind_ids(&tombstones)
                .bind(d::time(now))
                .execute(&mut *tx)
                .await?;
            deleted += bind_ids(&tasks).execute(&mut *tx).await?.rows_affected();
            for &id in chunk {
                d::announce_task(&mut tx, id).await?;
            }
        }
        let committed = tx.commit().await;
        // Whether or not the commit is known to have happened, nothing read
        // of these tasks before may be served again.
        d::forget_tasks(self, &ids);
        committed?;
        Ok(deleted)
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn forget_purged_before(
        &self,
        cutoff: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let query = sqlx::query(
            "DELETE FROM purged_tasks WHERE id IN \
             (SELECT id FROM purged_tasks WHERE purged_at < $1 ORDER BY purged_at LIMIT $2)",
        )
        .bind(d::time(cutoff))
        .bind(i64::from(limit));
        d::write_statement(self, query).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn purge_sign_ins(&self, now: DateTime<Utc>, limit: u32) -> Result<u64, StoreError> {
        let sessions = sqlx::query(
            "DELETE FROM worker_sessions WHERE id IN \
             (SELECT id FROM worker_sessions WHERE expires_at <= $1 LIMIT $2)",
        )
        .bind(d::time(now))
        .bind(i64::from(limit));
        let sessions = d::write_statement(self, sessions).await?;
        let invites = sqlx::query(
            "DELETE FROM worker_invites WHERE id IN \
             (SELECT id FROM worker_invites \
              WHERE used_at IS NOT NULL OR revoked_at IS NOT NULL OR expires_at <= $1 LIMIT $2)",
        )
        .bind(d::time(now))
        .bind(i64::from(limit));
        Ok(sessions + d::write_statement(self, invites).await?)
    }

    async fn purge_idempotency_keys(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let sql = format!(
            "DELETE FROM idempotency_keys WHERE {row} IN \
             (SELECT {row} FROM idempotency_keys WHERE expires_at <= $1 LIMIT $2)",
            row = d::ROW_ADDRESS
        );
        let query = sqlx::query(&sql)
            .bind(d::time(before))
            .bind(i64::from(limit));
        d::write_statement(self, query).await
    }
}
