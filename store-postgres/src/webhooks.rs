//! Webhook endpoints in PostgreSQL: the engine's insert and the claim of due
//! endpoints (`FOR UPDATE SKIP LOCKED`); the rest of their SQL is shared
//! (`store/sql/deliveries.rs`). The model is
//! [`meatspace_store::webhooks`]'s.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use meatspace_store::webhooks::DueWebhook;
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) async fn insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    task_id: Uuid,
    url: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO webhooks (task_id, url, state, next_attempt_at, updated_at) \
         VALUES ($1, $2, 'active', $3, $3)",
    )
    .bind(task_id)
    .bind(url)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(crate) async fn claim_due(
    pool: &PgPool,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<DueWebhook>, StoreError> {
    Ok(sqlx::query_as(
        "UPDATE webhooks w SET next_attempt_at = $2 FROM ( \
           SELECT w2.task_id FROM webhooks w2 JOIN tasks t ON t.id = w2.task_id \
           WHERE w2.next_attempt_at IS NOT NULL AND w2.next_attempt_at <= $1 \
             AND w2.state <> 'disabled' AND t.last_event_id > w2.delivered_event_id \
           ORDER BY w2.next_attempt_at LIMIT $3 FOR UPDATE OF w2 SKIP LOCKED) d \
         WHERE w.task_id = d.task_id \
         RETURNING w.task_id, w.url, w.delivered_event_id, w.attempts, w.failing_since",
    )
    .bind(now)
    .bind(lease_until)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?)
}
