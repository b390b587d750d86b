//! Claiming due webhook endpoints in SQLite: an inline job, under the write
//! lock. The rest of the endpoints' SQL is shared (`store/sql/deliveries.rs`);
//! the model is [`meatspace_store::webhooks`]'s.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use meatspace_store::webhooks::DueWebhook;

use crate::inline::Inline;
use crate::{RowReader, ms, uuid};

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
