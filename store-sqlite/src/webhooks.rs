//! Webhook endpoints and their delivery cursors in SQLite: the SQL and its
//! codecs only (claims and cursors are inline jobs, under the write lock). The model is
//! [`meatspace_store::webhooks`]'s.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use meatspace_store::webhooks::{DueWebhook, Webhook, WebhookOutcome, WebhookState};
use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use crate::RowReader;
use crate::inline::Inline;

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
            state: {
                let state: String = r.try_get("state")?;
                WebhookState::parse(&state)
                    .ok_or_else(|| StoreError::Corrupt(format!("webhook state {state:?}")))?
            },
            last_delivered_event_id: r.try_get("delivered_event_id")?,
            attempts: r.try_get("attempts")?,
            next_attempt_at: opt_from_ms(r.try_get("next_attempt_at")?)?,
            failing_since: opt_from_ms(r.try_get("failing_since")?)?,
            last_error: r.try_get("last_error")?,
        })
    })
    .transpose()
}

/// Claims the due endpoints until `lease_until`; the caller's write (an
/// inline job) holds the write lock.
pub(crate) fn claim_due(
    db: &Inline,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<DueWebhook>, StoreError> {
    let due = db.all(
        "SELECT w.task_id, w.url, w.delivered_event_id, w.attempts, w.failing_since \
         FROM webhooks w JOIN tasks t ON t.id = w.task_id \
         WHERE w.next_attempt_at IS NOT NULL AND w.next_attempt_at <= ? \
           AND w.state <> 'disabled' AND t.last_event_id > w.delivered_event_id \
         ORDER BY w.next_attempt_at LIMIT ?",
        (ms(now), i64::from(limit)),
        |row| {
            let attempts = row.integer("attempts")?;
            Ok(DueWebhook {
                task_id: uuid(row.text("task_id")?)?,
                url: row.text("url")?.to_owned(),
                delivered_event_id: row.integer("delivered_event_id")?,
                attempts: i32::try_from(attempts)
                    .map_err(|_| StoreError::Corrupt(format!("attempts {attempts}")))?,
                failing_since: row.opt_time("failing_since")?,
            })
        },
    )?;
    for d in &due {
        db.exec(
            "UPDATE webhooks SET next_attempt_at = ? WHERE task_id = ?",
            (ms(lease_until), d.task_id.to_string()),
        )?;
    }
    Ok(due)
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

pub(crate) fn record(
    db: &Inline,
    task_id: Uuid,
    outcome: &WebhookOutcome,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let id = task_id.to_string();
    match outcome {
        WebhookOutcome::Delivered {
            event_id,
            next_attempt_at,
        } => db.exec(
            "UPDATE webhooks SET state = 'active', delivered_event_id = max(delivered_event_id, ?), \
             attempts = 0, failing_since = NULL, last_error = NULL, next_attempt_at = ?, updated_at = ? \
             WHERE task_id = ? AND state <> 'disabled'",
            (event_id, next_attempt_at.map(ms), ms(now), id),
        ),
        WebhookOutcome::Failed {
            error,
            next_attempt_at,
        } => db.exec(
            "UPDATE webhooks SET state = 'failing', attempts = attempts + 1, \
             failing_since = COALESCE(failing_since, ?), last_error = ?, next_attempt_at = ?, updated_at = ? \
             WHERE task_id = ? AND state <> 'disabled'",
            (ms(now), error, ms(*next_attempt_at), ms(now), id),
        ),
        WebhookOutcome::Disabled { error } => db.exec(
            "UPDATE webhooks SET state = 'disabled', last_error = ?, next_attempt_at = NULL, \
             updated_at = ? WHERE task_id = ?",
            (error, ms(now), id),
        ),
    }?;
    Ok(())
}
