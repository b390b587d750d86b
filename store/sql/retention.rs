//! What the controller deletes once it is no longer needed: ended tasks
//! past their retention, the tombstones of purged tasks, used sign-ins and
//! expired idempotency records. One source for both backends, compiled by
//! each over its `dialect` module like `identity.rs` (see there).

use chrono::{DateTime, Utc};
use meatspace_store::{Retention, StoreError};
use uuid::Uuid;

use crate::dialect as d;
use crate::sql::{delete_due, lock_due};

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
        let select = "SELECT id FROM tasks WHERE ended_at < $1 ORDER BY ended_at LIMIT $2";
        let rows = lock_due(&mut tx, select, cutoff, limit).await?;
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
        let due = "purged_at < $1 ORDER BY purged_at";
        delete_due(self, "purged_tasks", "id", due, cutoff, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn purge_sign_ins(&self, now: DateTime<Utc>, limit: u32) -> Result<u64, StoreError> {
        let expired = "expires_at <= $1";
        let sessions = delete_due(self, "worker_sessions", "id", expired, now, limit).await?;
        let done = "used_at IS NOT NULL OR revoked_at IS NOT NULL OR expires_at <= $1";
        let invites = delete_due(self, "worker_invites", "id", done, now, limit).await?;
        Ok(sessions + invites)
    }

    async fn purge_idempotency_keys(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        // Keyed by two columns: a row is deleted by its address.
        let key = d::ROW_ADDRESS;
        delete_due(
            self,
            "idempotency_keys",
            key,
            "expires_at <= $1",
            before,
            limit,
        )
        .await
    }
}
