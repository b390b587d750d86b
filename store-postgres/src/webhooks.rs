//! Webhook endpoints and their delivery cursors in PostgreSQL: the SQL only
//! (claims with `FOR UPDATE SKIP LOCKED`). The model is
//! [`meatspace_store::webhooks`]'s.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use meatspace_store::webhooks::{DueWebhook, Webhook, WebhookOutcome, WebhookState};
use sqlx::{PgPool, Row};
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

pub(crate) async fn get(pool: &PgPool, task_id: Uuid) -> Result<Option<Webhook>, StoreError> {
    let row = sqlx::query(
        "SELECT url, state, delivered_event_id, attempts, next_attempt_at, failing_since, last_error \
         FROM webhooks WHERE task_id = $1",
    )
    .bind(task_id)
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(Webhook {
            url: r.try_get("url")?,
            state: {
                let state: String = r.try_get("state")?;
                WebhookState::parse(&state)
                    .ok_or_else(|| StoreError::Corrupt(format!("webhook state {state:?}")))?
            },
            last_delivered_event_id: r.try_get("delivered_event_id")?,
            attempts: r.try_get("attempts")?,
            next_attempt_at: r.try_get("next_attempt_at")?,
            failing_since: r.try_get("failing_since")?,
            last_error: r.try_get("last_error")?,
        })
    })
    .transpose()
}

pub(crate) async fn claim_due(
    pool: &PgPool,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<DueWebhook>, StoreError> {
    let rows = sqlx::query(
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
    .await?;
    rows.iter()
        .map(|r| {
            Ok(DueWebhook {
                task_id: r.try_get("task_id")?,
                url: r.try_get("url")?,
                delivered_event_id: r.try_get("delivered_event_id")?,
                attempts: r.try_get("attempts")?,
                failing_since: r.try_get("failing_since")?,
            })
        })
        .collect()
}

pub(crate) async fn next_attempt(pool: &PgPool) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT min(w.next_attempt_at) FROM webhooks w JOIN tasks t ON t.id = w.task_id \
         WHERE w.next_attempt_at IS NOT NULL AND w.state <> 'disabled' \
           AND t.last_event_id > w.delivered_event_id",
    )
    .fetch_one(pool)
    .await?)
}

pub(crate) async fn record(
    pool: &PgPool,
    task_id: Uuid,
    outcome: &WebhookOutcome,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let q = match outcome {
        WebhookOutcome::Delivered {
            event_id,
            next_attempt_at,
        } => sqlx::query(
            "UPDATE webhooks SET state = 'active', delivered_event_id = GREATEST(delivered_event_id, $2), \
             attempts = 0, failing_since = NULL, last_error = NULL, next_attempt_at = $3, updated_at = $4 \
             WHERE task_id = $1 AND state <> 'disabled'",
        )
        .bind(task_id)
        .bind(event_id)
        .bind(next_attempt_at),
        WebhookOutcome::Failed {
            error,
            next_attempt_at,
        } => sqlx::query(
            "UPDATE webhooks SET state = 'failing', attempts = attempts + 1, \
             failing_since = COALESCE(failing_since, $4), last_error = $2, next_attempt_at = $3, updated_at = $4 \
             WHERE task_id = $1 AND state <> 'disabled'",
        )
        .bind(task_id)
        .bind(error)
        .bind(next_attempt_at),
        WebhookOutcome::Disabled { error } => sqlx::query(
            "UPDATE webhooks SET state = 'disabled', last_error = $2, next_attempt_at = NULL, \
             updated_at = $3 WHERE task_id = $1",
        )
        .bind(task_id)
        .bind(error),
    };
    q.bind(now).execute(pool).await?;
    Ok(())
}
