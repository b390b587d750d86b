//! The controller's Prometheus metrics, through the `metrics` facade.
//!
//! The library only records; whoever owns the process installs the
//! recorder. The controller binary does it with [`install_recorder`]; the API
//! server, running the reconcilers in-process, should pass its own
//! `PrometheusBuilder` through [`with_buckets`] so the histograms below are
//! exported with buckets rather than as summaries.

use std::time::Duration;

use meatspace_domain::ExpiryReason;
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Tasks the controller expired, labelled `reason` (`lifetime`, `active_time_limit`).
pub const TASKS_EXPIRED: &str = "meatspace_tasks_expired_total";
/// Assignments the controller ended because the worker did not start in time.
pub const TASKS_UNASSIGNED: &str = "meatspace_tasks_unassigned_total";
pub const TASKS_AUTO_ACCEPTED: &str = "meatspace_tasks_auto_accepted_total";
/// Terminal tasks deleted by retention.
pub const TASKS_PURGED: &str = "meatspace_tasks_purged_total";
/// Seconds from a task's deadline until its expiry was committed.
pub const EXPIRY_LAG: &str = "meatspace_expiry_lag_seconds";
/// Seconds one reconcile pass (one batch) took, labelled `reconciler`.
pub const RECONCILE_DURATION: &str = "meatspace_reconcile_duration_seconds";
/// Failed reconcile passes, labelled `reconciler` and `error`.
pub const RECONCILE_ERRORS: &str = "meatspace_reconcile_errors_total";

/// Reconcilers restarted after a panic, labelled `reconciler`.
pub const RECONCILER_RESTARTS: &str = "meatspace_reconciler_restarts_total";
/// Webhook attempts, labelled `outcome` (`delivered`, `failed`, `gone`).
pub const WEBHOOK_ATTEMPTS: &str = "meatspace_webhook_attempts_total";
/// Seconds from an event's creation until its webhook delivery was acknowledged.
pub const WEBHOOK_LAG: &str = "meatspace_webhook_delivery_lag_seconds";

/// Notifications by `channel` (`push`, `email`) and `outcome` (`sent`,
/// `failed`, `retried`, `dropped_by_cap`, `withdrawn`).
pub const NOTIFICATIONS: &str = "meatspace_notifications_total";
/// Seconds from a notification's making until it was sent, by `channel`.
pub const NOTIFICATION_LAG: &str = "meatspace_notification_lag_seconds";
/// What waits in the outbox: `kind` `cause` (not yet fanned out) or
/// `notification` (not yet sent).
pub const NOTIFICATION_BACKLOG: &str = "meatspace_notification_backlog";
/// Age in seconds of the oldest thing waiting in the outbox (0 when empty).
pub const NOTIFICATION_OLDEST: &str = "meatspace_notification_oldest_seconds";
/// Push subscriptions removed because the push service said they are gone.
pub const PUSH_SUBSCRIPTIONS_REMOVED: &str = "meatspace_push_subscriptions_removed_total";

/// Buckets of [`EXPIRY_LAG`]: the target is "within about a second", so the
/// resolution is finest below that.
const LAG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets of [`RECONCILE_DURATION`].
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Adds the controller's histogram buckets to a Prometheus builder.
pub fn with_buckets(builder: PrometheusBuilder) -> Result<PrometheusBuilder, BuildError> {
    builder
        .set_buckets_for_metric(Matcher::Full(EXPIRY_LAG.into()), LAG_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(RECONCILE_DURATION.into()), DURATION_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(WEBHOOK_LAG.into()), LAG_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(NOTIFICATION_LAG.into()), LAG_BUCKETS)
}

/// Installs the global Prometheus recorder and starts its upkeep (which
/// keeps histogram memory bounded). Call once, inside a Tokio runtime.
pub fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let handle = with_buckets(PrometheusBuilder::new())?.install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Describes every metric and registers the counters at zero, so dashboards
/// and alerts see the series before the first event.
pub fn describe() {
    describe_counter!(
        TASKS_EXPIRED,
        Unit::Count,
        "Tasks the controller expired, by reason."
    );
    describe_counter!(
        TASKS_UNASSIGNED,
        Unit::Count,
        "Assignments reopened because the worker did not start in time."
    );
    describe_counter!(
        TASKS_AUTO_ACCEPTED,
        Unit::Count,
        "Submissions accepted because the agent did not review them in time."
    );
    describe_counter!(
        TASKS_PURGED,
        Unit::Count,
        "Terminal tasks deleted by retention."
    );
    describe_histogram!(
        EXPIRY_LAG,
        Unit::Seconds,
        "Time from a task's deadline until its expiry was committed."
    );
    describe_histogram!(
        RECONCILE_DURATION,
        Unit::Seconds,
        "Duration of one reconcile pass, by reconciler."
    );
    describe_counter!(
        RECONCILE_ERRORS,
        Unit::Count,
        "Failed reconcile passes, by reconciler and error."
    );
    describe_counter!(
        RECONCILER_RESTARTS,
        Unit::Count,
        "Reconcilers restarted after they panicked, by reconciler."
    );
    for reason in [ExpiryReason::Lifetime, ExpiryReason::ActiveTimeLimit] {
        counter!(TASKS_EXPIRED, "reason" => reason.as_str()).increment(0);
    }
    counter!(TASKS_UNASSIGNED).increment(0);
    counter!(TASKS_AUTO_ACCEPTED).increment(0);
    counter!(TASKS_PURGED).increment(0);
    describe_counter!(
        WEBHOOK_ATTEMPTS,
        Unit::Count,
        "Webhook delivery attempts, by outcome (delivered, failed, gone)."
    );
    describe_histogram!(
        WEBHOOK_LAG,
        Unit::Seconds,
        "Time from an event's creation until its webhook delivery was acknowledged."
    );
    for outcome in ["delivered", "failed", "gone"] {
        counter!(WEBHOOK_ATTEMPTS, "outcome" => outcome).increment(0);
    }
    describe_counter!(
        NOTIFICATIONS,
        Unit::Count,
        "Notifications by channel and outcome (sent, failed, retried, dropped_by_cap, withdrawn)."
    );
    describe_histogram!(
        NOTIFICATION_LAG,
        Unit::Seconds,
        "Time from a notification's making until it was sent, by channel."
    );
    describe_gauge!(
        NOTIFICATION_BACKLOG,
        Unit::Count,
        "Causes not yet fanned out and notifications not yet sent, by kind."
    );
    describe_gauge!(
        NOTIFICATION_OLDEST,
        Unit::Seconds,
        "Age of the oldest cause or notification waiting in the outbox."
    );
    describe_counter!(
        PUSH_SUBSCRIPTIONS_REMOVED,
        Unit::Count,
        "Push subscriptions removed because the push service said they are gone."
    );
    for channel in meatspace_domain::notify::Channel::ALL {
        for outcome in ["sent", "failed", "retried", "dropped_by_cap", "withdrawn"] {
            counter!(NOTIFICATIONS, "channel" => channel.as_str(), "outcome" => outcome)
                .increment(0);
        }
    }
    counter!(PUSH_SUBSCRIPTIONS_REMOVED).increment(0);
}

pub(crate) fn notification(channel: &'static str, outcome: &'static str) {
    counter!(NOTIFICATIONS, "channel" => channel, "outcome" => outcome).increment(1);
}

pub(crate) fn notification_lag(channel: &'static str, lag: Duration) {
    histogram!(NOTIFICATION_LAG, "channel" => channel).record(lag.as_secs_f64());
}

pub(crate) fn notification_backlog(causes: u64, notifications: u64, oldest: Duration) {
    gauge!(NOTIFICATION_BACKLOG, "kind" => "cause").set(causes as f64);
    gauge!(NOTIFICATION_BACKLOG, "kind" => "notification").set(notifications as f64);
    gauge!(NOTIFICATION_OLDEST).set(oldest.as_secs_f64());
}

pub(crate) fn push_subscription_removed() {
    counter!(PUSH_SUBSCRIPTIONS_REMOVED).increment(1);
}

pub(crate) fn expired(reason: ExpiryReason, lag: Duration) {
    counter!(TASKS_EXPIRED, "reason" => reason.as_str()).increment(1);
    histogram!(EXPIRY_LAG).record(lag.as_secs_f64());
}

pub(crate) fn unassigned() {
    counter!(TASKS_UNASSIGNED).increment(1);
}

pub(crate) fn auto_accepted() {
    counter!(TASKS_AUTO_ACCEPTED).increment(1);
}

pub(crate) fn purged(n: u64) {
    counter!(TASKS_PURGED).increment(n);
}

pub(crate) fn reconciled(reconciler: &'static str, took: Duration) {
    histogram!(RECONCILE_DURATION, "reconciler" => reconciler).record(took.as_secs_f64());
}

/// Counts a failed reconcile; `error` is the failure's metric label
/// ([`crate::Error::metric_label`], or a reconciler's own).
pub(crate) fn failed(reconciler: &'static str, error: &'static str) {
    counter!(RECONCILE_ERRORS, "reconciler" => reconciler, "error" => error).increment(1);
}

pub(crate) fn restarted(reconciler: &'static str) {
    counter!(RECONCILER_RESTARTS, "reconciler" => reconciler).increment(1);
}

pub(crate) fn webhook_delivered(lag: Duration) {
    counter!(WEBHOOK_ATTEMPTS, "outcome" => "delivered").increment(1);
    histogram!(WEBHOOK_LAG).record(lag.as_secs_f64());
}

pub(crate) fn webhook_failed(outcome: &'static str) {
    counter!(WEBHOOK_ATTEMPTS, "outcome" => outcome).increment(1);
}
