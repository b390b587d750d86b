//! Storage of webhook endpoints and their delivery cursors, for both
//! backends.
//!
//! The events table is the outbox: an endpoint is due when its task has an
//! event after `delivered_event_id` and `next_attempt_at` has come. A
//! controller claims due endpoints by moving `next_attempt_at` forward by a
//! lease (with `FOR UPDATE SKIP LOCKED` on PostgreSQL, under the write lock
//! on SQLite), so replicas do not deliver the same endpoint at once, and a
//! replica that dies mid-delivery only delays the endpoint until the lease
//! ends. The cursor advances only after the receiver acknowledged an event:
//! delivery is at least once, in event order.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row, SqlitePool};
use uuid::Uuid;

use super::StoreError;

/// Delivery state of an endpoint, as shown on the task resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookState {
    /// Delivering (or caught up).
    Active,
    /// The last attempt failed; retrying with backoff.
    Failing,
    /// No more deliveries: the receiver answered 410 Gone, or it failed
    /// for longer than the retry period.
    Disabled,
}

impl WebhookState {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookState::Active => "active",
            WebhookState::Failing => "failing",
            WebhookState::Disabled => "disabled",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "active" => Ok(WebhookState::Active),
            "failing" => Ok(WebhookState::Failing),
            "disabled" => Ok(WebhookState::Disabled),
            other => Err(StoreError::Corrupt(format!("webhook state {other:?}"))),
        }
    }
}

/// A task's webhook endpoint (no secret: it is derived, never stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Webhook {
    pub url: String,
    pub state: WebhookState,
    /// The last event the receiver acknowledged (0 before the first).
    pub last_delivered_event_id: i64,
    /// Failed attempts since the last success.
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub failing_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// An endpoint a controller claimed for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueWebhook {
    pub task_id: Uuid,
    pub url: String,
    pub delivered_event_id: i64,
    pub attempts: i32,
    pub failing_since: Option<DateTime<Utc>>,
}

/// What a delivery attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// The receiver acknowledged `event_id`; `next_attempt_at` is `None`
    /// once the task's terminal event is delivered.
    Delivered {
        event_id: i64,
        next_attempt_at: Option<DateTime<Utc>>,
    },
    /// The attempt failed; try again then.
    Failed {
        error: String,
        next_attempt_at: DateTime<Utc>,
    },
    /// Stop delivering to this endpoint.
    Disabled { error: String },
}

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

// ---- PostgreSQL ----

pub(super) async fn pg_insert(
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

pub(super) async fn pg_get(pool: &PgPool, task_id: Uuid) -> Result<Option<Webhook>, StoreError> {
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
            state: WebhookState::parse(r.try_get("state")?)?,
            last_delivered_event_id: r.try_get("delivered_event_id")?,
            attempts: r.try_get("attempts")?,
            next_attempt_at: r.try_get("next_attempt_at")?,
            failing_since: r.try_get("failing_since")?,
            last_error: r.try_get("last_error")?,
        })
    })
    .transpose()
}

pub(super) async fn pg_claim_due(
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

pub(super) async fn pg_next_attempt(pool: &PgPool) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT min(w.next_attempt_at) FROM webhooks w JOIN tasks t ON t.id = w.task_id \
         WHERE w.next_attempt_at IS NOT NULL AND w.state <> 'disabled' \
           AND t.last_event_id > w.delivered_event_id",
    )
    .fetch_one(pool)
    .await?)
}

pub(super) async fn pg_record(
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

// ---- SQLite ----

pub(super) async fn sqlite_insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    task_id: Uuid,
    url: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO webhooks (task_id, url, state, next_attempt_at, updated_at) \
         VALUES (?, ?, 'active', ?, ?)",
    )
    .bind(task_id.to_string())
    .bind(url)
    .bind(ms(now))
    .bind(ms(now))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn sqlite_get(
    pool: &SqlitePool,
    task_id: Uuid,
) -> Result<Option<Webhook>, StoreError> {
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

pub(super) async fn sqlite_claim_due(
    writer: &SqlitePool,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<DueWebhook>, StoreError> {
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
    let rows = sqlx::query(
        "SELECT w.task_id, w.url, w.delivered_event_id, w.attempts, w.failing_since \
         FROM webhooks w JOIN tasks t ON t.id = w.task_id \
         WHERE w.next_attempt_at IS NOT NULL AND w.next_attempt_at <= ? \
           AND w.state <> 'disabled' AND t.last_event_id > w.delivered_event_id \
         ORDER BY w.next_attempt_at LIMIT ?",
    )
    .bind(ms(now))
    .bind(i64::from(limit))
    .fetch_all(&mut *tx)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let id: String = r.try_get("task_id")?;
        sqlx::query("UPDATE webhooks SET next_attempt_at = ? WHERE task_id = ?")
            .bind(ms(lease_until))
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        out.push(DueWebhook {
            task_id: uuid(&id)?,
            url: r.try_get("url")?,
            delivered_event_id: r.try_get("delivered_event_id")?,
            attempts: r.try_get("attempts")?,
            failing_since: opt_from_ms(r.try_get("failing_since")?)?,
        });
    }
    tx.commit().await?;
    Ok(out)
}

pub(super) async fn sqlite_next_attempt(
    pool: &SqlitePool,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let v: Option<i64> = sqlx::query_scalar(
        "SELECT min(w.next_attempt_at) FROM webhooks w JOIN tasks t ON t.id = w.task_id \
         WHERE w.next_attempt_at IS NOT NULL AND w.state <> 'disabled' \
           AND t.last_event_id > w.delivered_event_id",
    )
    .fetch_one(pool)
    .await?;
    opt_from_ms(v)
}

pub(super) async fn sqlite_record(
    writer: &SqlitePool,
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
    q.execute(writer).await?;
    Ok(())
}
