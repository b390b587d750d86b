//! Webhook endpoints and their delivery cursors in SQLite: the SQL and its
//! codecs only (claims under the write lock). The model is
//! [`meatspace_store::webhooks`]'s.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use meatspace_store::webhooks::{DueWebhook, Webhook, WebhookOutcome, WebhookState};
use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use crate::WriteTx;

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn from_ms(v: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(v).ok_or_else(|| StoreError::Corrupt(format!("timestamp {v}")))
}

fn opt_from_ms(v: Option<i64>) -> Result<Option<DateTime<Utc>>, StoreError> {
    v.map(from_ms).transpose()
}

fn uuid(s: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(s).map_err(|_| StoreError::Corrupt(format!("uuid {s:?}")))
}

pub(crate) async fn get(pool: &SqlitePool, task_id: Uuid) -> Result<Option<Webhook>, StoreError> {
    let row = sqlx::query(
        "SELECT url, state, delivered_event_id, attempts, next_attempt_at, failing_since, last_error \
         FROM webhooks WHERE task_id = ?",
    )
    .bind(task_id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(Webhook {
            url: r.try_get("url")?,
            state: WebhookState::parse(r.try_get("state")?)?,
            last_delivered_event_id: r.try_get("delivered_event_id")?,
            attempts: r.try_get("attempts")?,
            next_attempt_at: opt_from_ms(r.try_get("next_attempt_at")?)?,
            failing_since: opt_from_ms(r.try_get("failing_since")?)?,
            last_error: r.try_get("last_error")?,
        })
    })
    .transpose()
}

pub(crate) async fn claim_due(
    tx: &mut WriteTx,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<DueWebhook>, StoreError> {
    let rows = sqlx::query(
        "SELECT w.task_id, w.url, w.delivered_event_id, w.attempts, w.failing_since \
         FROM webhooks w JOIN tasks t ON t.id = w.task_id \
         WHERE w.next_attempt_at IS NOT NULL AND w.next_attempt_at <= ? \
           AND w.state <> 'disabled' AND t.last_event_id > w.delivered_event_id \
         ORDER BY w.next_attempt_at LIMIT ?",
    )
    .bind(ms(now))
    .bind(i64::from(limit))
    .fetch_all(&mut **tx)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let id: String = r.try_get("task_id")?;
        sqlx::query("UPDATE webhooks SET next_attempt_at = ? WHERE task_id = ?")
            .bind(ms(lease_until))
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        out.push(DueWebhook {
            task_id: uuid(&id)?,
            url: r.try_get("url")?,
            delivered_event_id: r.try_get("delivered_event_id")?,
            attempts: r.try_get("attempts")?,
            failing_since: opt_from_ms(r.try_get("failing_since")?)?,
        });
    }
    Ok(out)
}

pub(crate) async fn next_attempt(pool: &SqlitePool) -> Result<Option<DateTime<Utc>>, StoreError> {
    let v: Option<i64> = sqlx::query_scalar(
        "SELECT min(w.next_attempt_at) FROM webhooks w JOIN tasks t ON t.id = w.task_id \
         WHERE w.next_attempt_at IS NOT NULL AND w.state <> 'disabled' \
           AND t.last_event_id > w.delivered_event_id",
    )
    .fetch_one(pool)
    .await?;
    opt_from_ms(v)
}

pub(crate) async fn record(
    tx: &mut WriteTx,
    task_id: Uuid,
    outcome: &WebhookOutcome,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let id = task_id.to_string();
    let q = match outcome {
        WebhookOutcome::Delivered {
            event_id,
            next_attempt_at,
        } => sqlx::query(
            "UPDATE webhooks SET state = 'active', delivered_event_id = max(delivered_event_id, ?), \
             attempts = 0, failing_since = NULL, last_error = NULL, next_attempt_at = ?, updated_at = ? \
             WHERE task_id = ? AND state <> 'disabled'",
        )
        .bind(event_id)
        .bind(next_attempt_at.map(ms))
        .bind(ms(now))
        .bind(id),
        WebhookOutcome::Failed {
            error,
            next_attempt_at,
        } => sqlx::query(
            "UPDATE webhooks SET state = 'failing', attempts = attempts + 1, \
             failing_since = COALESCE(failing_since, ?), last_error = ?, next_attempt_at = ?, updated_at = ? \
             WHERE task_id = ? AND state <> 'disabled'",
        )
        .bind(ms(now))
        .bind(error)
        .bind(ms(*next_attempt_at))
        .bind(ms(now))
        .bind(id),
        WebhookOutcome::Disabled { error } => sqlx::query(
            "UPDATE webhooks SET state = 'disabled', last_error = ?, next_attempt_at = NULL, \
             updated_at = ? WHERE task_id = ?",
        )
        .bind(error)
        .bind(ms(now))
        .bind(id),
    };
    q.execute(&mut **tx).await?;
    Ok(())
}
