//! Webhook endpoints' cursors and the answers of idempotent requests: one
//! source for both backends, compiled by each over its `dialect` module
//! like `identity.rs` (see there). Claiming due endpoints is each
//! database's own (`d::claim_due_webhooks`), as is claiming a key (the
//! engine's).

use chrono::{DateTime, Utc};
use meatspace_store::webhooks::{DueWebhook, Webhook, WebhookOutcome, WebhookState};
use meatspace_store::{DeliveryRecords, StoreError};
use sqlx::Row as _;
use uuid::Uuid;

use crate::dialect as d;

#[async_trait::async_trait]
impl DeliveryRecords for d::Store {
    async fn idempotency_complete(
        &self,
        scope: &[u8; 32],
        key: &str,
        status: u16,
        response: &[u8],
    ) -> Result<(), StoreError> {
        let query = sqlx::query(
            "UPDATE idempotency_keys SET state = 'done', status = $3, response = $4 \
             WHERE scope = $1 AND key = $2",
        )
        .bind(&scope[..])
        .bind(key)
        .bind(i32::from(status))
        .bind(response);
        d::write_statement(self, query).await?;
        Ok(())
    }

    async fn idempotency_release(&self, scope: &[u8; 32], key: &str) -> Result<(), StoreError> {
        let query = sqlx::query(
            "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND state = 'in_flight'",
        )
        .bind(&scope[..])
        .bind(key);
        d::write_statement(self, query).await?;
        Ok(())
    }

    async fn webhook(&self, task_id: Uuid) -> Result<Option<Webhook>, StoreError> {
        let row = sqlx::query(
            "SELECT url, state, delivered_event_id, attempts, next_attempt_at, failing_since, last_error \
             FROM webhooks WHERE task_id = $1",
        )
        .bind(d::id(task_id))
        .fetch_optional(d::reader(self))
        .await?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get("state")?;
        Ok(Some(Webhook {
            url: row.try_get("url")?,
            state: WebhookState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("webhook state {state:?}")))?,
            last_delivered_event_id: row.try_get("delivered_event_id")?,
            attempts: row.try_get("attempts")?,
            next_attempt_at: d::read_opt_time(&row, "next_attempt_at")?,
            failing_since: d::read_opt_time(&row, "failing_since")?,
            last_error: row.try_get("last_error")?,
        }))
    }

    async fn claim_due_webhooks(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<DueWebhook>, StoreError> {
        d::claim_due_webhooks(self, now, lease_until, limit).await
    }

    async fn next_webhook_attempt(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = sqlx::query(
            "SELECT min(w.next_attempt_at) AS next FROM webhooks w JOIN tasks t ON t.id = w.task_id \
             WHERE w.next_attempt_at IS NOT NULL AND w.state <> 'disabled' \
               AND t.last_event_id > w.delivered_event_id",
        )
        .fetch_one(d::reader(self))
        .await?;
        d::read_opt_time(&row, "next")
    }

    async fn record_webhook(
        &self,
        task_id: Uuid,
        outcome: &WebhookOutcome,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // The cursor never moves back: a late acknowledgement of an older
        // event leaves a newer one delivered.
        let query = match outcome {
            WebhookOutcome::Delivered {
                event_id,
                next_attempt_at,
            } => sqlx::query(
                "UPDATE webhooks SET state = 'active', \
                 delivered_event_id = CASE WHEN delivered_event_id > $2 THEN delivered_event_id ELSE $2 END, \
                 attempts = 0, failing_since = NULL, last_error = NULL, next_attempt_at = $3, updated_at = $4 \
                 WHERE task_id = $1 AND state <> 'disabled'",
            )
            .bind(d::id(task_id))
            .bind(event_id)
            .bind(d::opt_time(*next_attempt_at)),
            WebhookOutcome::Failed {
                error,
                next_attempt_at,
            } => sqlx::query(
                "UPDATE webhooks SET state = 'failing', attempts = attempts + 1, \
                 failing_since = COALESCE(failing_since, $4), last_error = $2, next_attempt_at = $3, updated_at = $4 \
                 WHERE task_id = $1 AND state <> 'disabled'",
            )
            .bind(d::id(task_id))
            .bind(error)
            .bind(d::time(*next_attempt_at)),
            WebhookOutcome::Disabled { error } => sqlx::query(
                "UPDATE webhooks SET state = 'disabled', last_error = $2, next_attempt_at = NULL, \
                 updated_at = $3 WHERE task_id = $1",
            )
            .bind(d::id(task_id))
            .bind(error),
        };
        d::write_statement(self, query.bind(d::time(now))).await?;
        Ok(())
    }
}
