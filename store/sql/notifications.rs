//! Notifications: preferences, push subscriptions, the outbox of causes
//! and the notifications the controller delivers. One source for both
//! backends, compiled by each over its `dialect` module like `identity.rs`
//! (see there). The outbox itself is filled by each database's trigger
//! (migration `0080`), in the transaction that appends the event.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use meatspace_domain::notify::{Area, Cause, Channel, Preferences};
use meatspace_domain::qualification::Qualification;
use meatspace_domain::{Actor, EventType};
use meatspace_store::StoreError;
use meatspace_store::notify::{
    Backlog, DueNotification, Lapsing, Listener, NewNotification, NotificationOutcome,
    Notifications, PendingCause, PushSubscription,
};
use sqlx::Row as _;
use uuid::Uuid;

use crate::dialect::{self as d, Row};
use crate::reads::placeholders;
use crate::sql::{lock_due, read_all};

/// Rows per multi-row insert: well under either database's limit of bound
/// parameters.
const INSERT_CHUNK: usize = 500;

const PREFERENCE_COLUMNS: &str = "area_latitude, area_longitude, area_radius_m, \
    notify_new_tasks, notify_my_tasks, notify_email";

fn preferences_from_row(row: &Row) -> Result<Preferences, StoreError> {
    let latitude: Option<f64> = row.try_get("area_latitude")?;
    let longitude: Option<f64> = row.try_get("area_longitude")?;
    let radius: Option<i64> = row.try_get("area_radius_m")?;
    let area = match (latitude, longitude, radius) {
        (Some(latitude), Some(longitude), Some(radius)) => Some(Area {
            latitude,
            longitude,
            radius_m: u32::try_from(radius)
                .map_err(|_| StoreError::Corrupt(format!("area radius {radius}")))?,
        }),
        _ => None,
    };
    Ok(Preferences {
        area,
        new_tasks: row.try_get("notify_new_tasks")?,
        my_tasks: row.try_get("notify_my_tasks")?,
        email: row.try_get("notify_email")?,
    })
}

fn cause_of(name: &str) -> Result<Cause, StoreError> {
    Cause::parse(name).ok_or_else(|| StoreError::Corrupt(format!("notification cause {name:?}")))
}

fn channel_of(name: &str) -> Result<Channel, StoreError> {
    Channel::parse(name).ok_or_else(|| StoreError::Corrupt(format!("channel {name:?}")))
}

/// Withdraws the worker's pending notifications on `channel`.
async fn withdraw(
    tx: &mut d::Tx,
    worker: Uuid,
    channel: Channel,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE notifications SET next_attempt_at = NULL, outcome = 'withdrawn', done_at = $1 \
         WHERE worker_id = $2 AND channel = $3 AND next_attempt_at IS NOT NULL",
    )
    .bind(d::time(now))
    .bind(d::id(worker))
    .bind(channel.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Rows the controller claims: those due are read and held for a while, so
/// that no other controller takes them meanwhile.
struct Claimed<T> {
    /// Reads the due rows, binding the time as `$1` and how many as `$2`.
    select: &'static str,
    /// What holds a row, set to the lease's end: `"notifications SET
    /// next_attempt_at"`.
    lease: &'static str,
    /// The rows' key column.
    key: &'static str,
    from_row: fn(&Row) -> Result<T, StoreError>,
    key_of: fn(&T) -> i64,
}

const CAUSES: Claimed<PendingCause> = Claimed {
    select: "SELECT event_id, task_id, type, actor, created_at, next_worker \
        FROM notification_causes WHERE lease_until IS NULL OR lease_until <= $1 \
        ORDER BY event_id LIMIT $2",
    lease: "notification_causes SET lease_until",
    key: "event_id",
    from_row: |row| {
        let kind: String = row.try_get("type")?;
        let actor: String = row.try_get("actor")?;
        Ok(PendingCause {
            event_id: row.try_get("event_id")?,
            task_id: d::read_id(row, "task_id")?,
            kind: EventType::parse(&kind)
                .ok_or_else(|| StoreError::Corrupt(format!("event type {kind:?}")))?,
            actor: Actor::parse(&actor)
                .ok_or_else(|| StoreError::Corrupt(format!("actor {actor:?}")))?,
            created_at: d::read_time(row, "created_at")?,
            next_worker: d::read_opt_id(row, "next_worker")?,
        })
    },
    key_of: |cause| cause.event_id,
};

const DUE_NOTIFICATIONS: Claimed<DueNotification> = Claimed {
    select: "SELECT id, worker_id, cause, task_id, channel, attempts, created_at \
        FROM notifications WHERE next_attempt_at <= $1 \
        ORDER BY next_attempt_at, id LIMIT $2",
    lease: "notifications SET next_attempt_at",
    key: "id",
    from_row: |row| {
        let attempts: i64 = row.try_get("attempts")?;
        Ok(DueNotification {
            id: row.try_get("id")?,
            worker_id: d::read_id(row, "worker_id")?,
            cause: cause_of(row.try_get("cause")?)?,
            task_id: d::read_id(row, "task_id")?,
            channel: channel_of(row.try_get("channel")?)?,
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            created_at: d::read_time(row, "created_at")?,
        })
    },
    key_of: |notification| notification.id,
};

impl<T> Claimed<T> {
    /// Claims at most `limit` rows due at `now`, holding them until
    /// `lease_until`.
    async fn claim(
        &self,
        store: &d::Store,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<T>, StoreError> {
        let mut tx = d::begin(store).await?;
        let rows = lock_due(&mut tx, self.select, now, limit).await?;
        let claimed = rows
            .iter()
            .map(self.from_row)
            .collect::<Result<Vec<_>, StoreError>>()?;
        if !claimed.is_empty() {
            let keys: Vec<i64> = claimed.iter().map(self.key_of).collect();
            let sql = format!(
                "UPDATE {} = ${} WHERE {} IN ({})",
                self.lease,
                keys.len() + 1,
                self.key,
                placeholders(keys.len())
            );
            let mut query = sqlx::query(&sql);
            for key in keys {
                query = query.bind(key);
            }
            query.bind(d::time(lease_until)).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }
}

#[async_trait::async_trait]
impl Notifications for d::Store {
    async fn preferences(&self, worker: Uuid) -> Result<Option<Preferences>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {PREFERENCE_COLUMNS} FROM workers WHERE id = $1"
        ))
        .bind(d::id(worker))
        .fetch_optional(d::reader(self))
        .await?;
        row.as_ref().map(preferences_from_row).transpose()
    }

    async fn set_preferences(
        &self,
        worker: Uuid,
        preferences: &Preferences,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let area = preferences.area.as_ref();
        let mut tx = d::begin(self).await?;
        let changed = sqlx::query(
            "UPDATE workers SET area_latitude = $1, area_longitude = $2, area_radius_m = $3, \
             notify_new_tasks = $4, notify_my_tasks = $5, notify_email = $6 WHERE id = $7",
        )
        .bind(area.map(|a| a.latitude))
        .bind(area.map(|a| a.longitude))
        .bind(area.map(|a| i64::from(a.radius_m)))
        .bind(preferences.new_tasks)
        .bind(preferences.my_tasks)
        .bind(preferences.email.as_deref())
        .bind(d::id(worker))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if preferences.email.is_none() {
            withdraw(&mut tx, worker, Channel::Email, now).await?;
        }
        tx.commit().await?;
        Ok(changed == 1)
    }

    async fn add_push_subscription(
        &self,
        worker: Uuid,
        subscription: &PushSubscription,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // A browser that subscribes again (new keys, or another worker
        // signed in on it) replaces what was there.
        let query = sqlx::query(
            "INSERT INTO push_subscriptions (endpoint, worker_id, p256dh, auth, created_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (endpoint) DO UPDATE SET worker_id = excluded.worker_id, \
             p256dh = excluded.p256dh, auth = excluded.auth, created_at = excluded.created_at",
        )
        .bind(&subscription.endpoint)
        .bind(d::id(worker))
        .bind(&subscription.p256dh)
        .bind(&subscription.auth)
        .bind(d::time(now));
        d::write_statement(self, query).await?;
        Ok(())
    }

    async fn push_subscriptions(&self, worker: Uuid) -> Result<Vec<PushSubscription>, StoreError> {
        let query = sqlx::query(
            "SELECT endpoint, p256dh, auth FROM push_subscriptions WHERE worker_id = $1 \
             ORDER BY created_at, endpoint",
        )
        .bind(d::id(worker));
        read_all(self, query, |row| {
            Ok(PushSubscription {
                endpoint: row.try_get("endpoint")?,
                p256dh: row.try_get("p256dh")?,
                auth: row.try_get("auth")?,
            })
        })
        .await
    }

    async fn remove_push_subscription(
        &self,
        worker: Option<Uuid>,
        endpoint: &str,
    ) -> Result<bool, StoreError> {
        let query = match worker {
            Some(worker) => {
                sqlx::query("DELETE FROM push_subscriptions WHERE endpoint = $1 AND worker_id = $2")
                    .bind(endpoint)
                    .bind(d::id(worker))
            }
            None => {
                sqlx::query("DELETE FROM push_subscriptions WHERE endpoint = $1").bind(endpoint)
            }
        };
        Ok(d::write_statement(self, query).await? > 0)
    }

    async fn unsubscribe(
        &self,
        worker: Uuid,
        channel: Channel,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = d::begin(self).await?;
        let stop = match channel {
            Channel::Email => "UPDATE workers SET notify_email = NULL WHERE id = $1",
            Channel::Push => "DELETE FROM push_subscriptions WHERE worker_id = $1",
        };
        sqlx::query(stop)
            .bind(d::id(worker))
            .execute(&mut *tx)
            .await?;
        withdraw(&mut tx, worker, channel, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn claim_causes(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<PendingCause>, StoreError> {
        CAUSES.claim(self, now, lease_until, limit).await
    }

    async fn listeners(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<Listener>, StoreError> {
        let reader = d::reader(self);
        let rows = sqlx::query(&format!(
            "SELECT id, {PREFERENCE_COLUMNS}, \
             EXISTS (SELECT 1 FROM push_subscriptions p WHERE p.worker_id = w.id) AS has_push \
             FROM workers w WHERE notify_new_tasks AND suspended_at IS NULL AND id > $1 \
             ORDER BY id LIMIT $2"
        ))
        .bind(d::id(after.unwrap_or_default()))
        .bind(i64::from(limit))
        .fetch_all(reader)
        .await?;
        let mut listeners = rows
            .iter()
            .map(|row| {
                Ok(Listener {
                    worker_id: d::read_id(row, "id")?,
                    preferences: preferences_from_row(row)?,
                    qualifications: Vec::new(),
                    has_push: row.try_get("has_push")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        if listeners.is_empty() {
            return Ok(listeners);
        }
        // Their qualifications in one read.
        let list = placeholders(listeners.len());
        let sql = format!(
            "SELECT worker_id, name, value_text, value_int, granted_at, expires_at \
             FROM worker_qualifications WHERE worker_id IN ({list})"
        );
        let mut query = sqlx::query(&sql);
        for l in &listeners {
            query = query.bind(d::id(l.worker_id));
        }
        let mut held: HashMap<Uuid, Vec<Qualification>> = HashMap::new();
        for row in query.fetch_all(reader).await? {
            held.entry(d::read_id(&row, "worker_id")?)
                .or_default()
                .push(crate::identity::qualification_from_row(&row)?);
        }
        for l in &mut listeners {
            l.qualifications = held.remove(&l.worker_id).unwrap_or_default();
        }
        Ok(listeners)
    }

    async fn fan_out(
        &self,
        cause_event_id: Option<i64>,
        notifications: &[NewNotification],
        next_worker: Option<Uuid>,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let mut tx = d::begin(self).await?;
        let mut made = 0;
        for chunk in notifications.chunks(INSERT_CHUNK) {
            let values = (0..chunk.len())
                .map(|i| {
                    let p = i * 7;
                    format!(
                        "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                        p + 1,
                        p + 2,
                        p + 3,
                        p + 4,
                        p + 5,
                        p + 6,
                        p + 7,
                        p + 6
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "INSERT INTO notifications \
                 (worker_id, cause_key, cause, task_id, channel, created_at, attempts, \
                 next_attempt_at) VALUES {values} \
                 ON CONFLICT (worker_id, cause_key, channel) DO NOTHING"
            );
            let mut insert = sqlx::query(&sql);
            for n in chunk {
                insert = insert
                    .bind(d::id(n.worker_id))
                    .bind(&n.cause_key)
                    .bind(n.cause.as_str())
                    .bind(d::id(n.task_id))
                    .bind(n.channel.as_str())
                    .bind(d::time(now))
                    .bind(0_i64);
            }
            made += insert.execute(&mut *tx).await?.rows_affected();
        }
        if let Some(event_id) = cause_event_id {
            match next_worker {
                Some(next) => {
                    sqlx::query(
                        "UPDATE notification_causes SET next_worker = $1 WHERE event_id = $2",
                    )
                    .bind(d::id(next))
                    .bind(event_id)
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    sqlx::query("DELETE FROM notification_causes WHERE event_id = $1")
                        .bind(event_id)
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(made)
    }

    async fn claim_due_notifications(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<DueNotification>, StoreError> {
        DUE_NOTIFICATIONS.claim(self, now, lease_until, limit).await
    }

    async fn next_notification_work(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = sqlx::query(
            "SELECT (SELECT MIN(next_attempt_at) FROM notifications) AS due, \
             (SELECT MIN(COALESCE(lease_until, created_at)) FROM notification_causes) AS cause",
        )
        .fetch_one(d::reader(self))
        .await?;
        let due = d::read_opt_time(&row, "due")?;
        let cause = d::read_opt_time(&row, "cause")?;
        Ok(due.into_iter().chain(cause).min())
    }

    async fn record_notification(
        &self,
        id: i64,
        outcome: NotificationOutcome,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let tried = i64::from(matches!(
            outcome,
            NotificationOutcome::Sent | NotificationOutcome::Failed | NotificationOutcome::Retry(_)
        ));
        let query = match outcome.as_str() {
            None => {
                let NotificationOutcome::Retry(at) = outcome else {
                    unreachable!("only a retry has no final name")
                };
                sqlx::query(
                    "UPDATE notifications SET next_attempt_at = $1, attempts = attempts + $2 \
                     WHERE id = $3",
                )
                .bind(d::time(at))
                .bind(tried)
                .bind(id)
            }
            Some(name) => sqlx::query(
                "UPDATE notifications SET next_attempt_at = NULL, outcome = $1, done_at = $2, \
                 attempts = attempts + $3 WHERE id = $4",
            )
            .bind(name)
            .bind(d::time(now))
            .bind(tried)
            .bind(id),
        };
        d::write_statement(self, query).await?;
        Ok(())
    }

    async fn sent_since(
        &self,
        worker: Uuid,
        channel: Channel,
        since: DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        let n: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM notifications WHERE worker_id = $1 AND channel = $2 \
             AND outcome = 'sent' AND done_at >= $3",
        )
        .bind(d::id(worker))
        .bind(channel.as_str())
        .bind(d::time(since))
        .fetch_one(d::reader(self))
        .await?
        .try_get("n")?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    async fn notification_backlog(&self) -> Result<Backlog, StoreError> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM notification_causes) AS causes, \
             (SELECT COUNT(*) FROM notifications WHERE next_attempt_at IS NOT NULL) AS due, \
             (SELECT MIN(created_at) FROM notification_causes) AS oldest_cause, \
             (SELECT MIN(created_at) FROM notifications WHERE next_attempt_at IS NOT NULL) \
             AS oldest_due",
        )
        .fetch_one(d::reader(self))
        .await?;
        let causes: i64 = row.try_get("causes")?;
        let due: i64 = row.try_get("due")?;
        let oldest_cause = d::read_opt_time(&row, "oldest_cause")?;
        let oldest_due = d::read_opt_time(&row, "oldest_due")?;
        Ok(Backlog {
            causes: u64::try_from(causes).unwrap_or_default(),
            notifications: u64::try_from(due).unwrap_or_default(),
            oldest: oldest_cause.into_iter().chain(oldest_due).min(),
        })
    }

    async fn lapsing(
        &self,
        now: DateTime<Utc>,
        by: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Lapsing>, StoreError> {
        let query = sqlx::query(
            "SELECT id, worker_id, next_deadline FROM tasks \
             WHERE next_deadline > $1 AND next_deadline <= $2 \
             AND state IN ('assigned', 'active') AND worker_id IS NOT NULL \
             ORDER BY next_deadline LIMIT $3",
        )
        .bind(d::time(now))
        .bind(d::time(by))
        .bind(i64::from(limit));
        read_all(self, query, |row| {
            Ok(Lapsing {
                task_id: d::read_id(row, "id")?,
                worker_id: d::read_id(row, "worker_id")?,
                at: d::read_time(row, "next_deadline")?,
            })
        })
        .await
    }
}
