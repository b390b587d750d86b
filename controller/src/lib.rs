//! The meatspace controller as a library: level-triggered reconcilers that
//! apply task deadlines and retention to the store.
//!
//! The whole public surface is [`run`]:
//!
//! ```text
//! pub async fn run(
//!     store: Arc<dyn Store>,
//!     config: ControllerConfig,
//!     shutdown: impl Future<Output = ()>,
//! ) -> Result<(), Error>
//! ```
//!
//! It runs every reconciler concurrently until `shutdown` resolves, then lets
//! each finish the batch it is writing and returns. The API server calls it
//! in its own process for the embedded SQLite default; the
//! `meatspace-controller` binary calls it for PostgreSQL. [`ControllerConfig`]
//! carries the tuning, and [`ControllerArgs`] is its clap form, which a
//! binary `#[command(flatten)]`s.
//!
//! # Reconcilers
//!
//! - [`expiry`]: lifetime and active time limit → `expired`; an assignment
//!   whose worker did not start in time → back to `open`. Deadline-driven: it
//!   sleeps until the earliest deadline in the store and wakes early when a
//!   task changes.
//! - [`retention`]: deletes terminal tasks (with events, issues and photos)
//!   once they have been terminal for the retention period.
//! - [`notify`]: turns the outbox of causes into notifications for the
//!   workers who may hear of them, and sends them by Web Push and email;
//! - [`webhooks`]: delivers every event of a task with a webhook endpoint,
//!   signed (Standard Webhooks 1.0), at least once, with backoff.
//! - `mirror` (optional, with the `kubernetes` feature): keeps a `MeatspaceTask` custom resource per
//!   task in step with the store; with `leader` election, one replica
//!   at a time does it.
//! - `requests` (optional, with the mirror): turns the `MeatspaceTask`
//!   resources an agent applies (`spec.origin: Requested`) into tasks,
//!   once each, and drives them from their spec.
//!
//! # Terminal-state rules
//!
//! A terminal task has exactly one terminal event, its open issues are
//! closed with a recorded resolution, and nothing is appended after the
//! terminal event. These rules are not repaired after the fact: the pure
//! `decide` refuses every command on a terminal task, and the store writes
//! the state change, the terminal event and the issue closures in the one
//! transaction that holds the task's row lock, with a conditional
//! `UPDATE … WHERE state = <expected>`. A state that breaks the rules can
//! therefore never be committed, by any replica, killed or not, so there is
//! nothing for a reconciler to find; an audit would only add a scan of every
//! terminal task. The tests check the rules after races, crashes and
//! replicas.
//!
//! # Several replicas
//!
//! Replicas coordinate through row locks, not a lease: each sweep takes
//! `FOR UPDATE SKIP LOCKED` on a batch of due rows (PostgreSQL) or the
//! database write lock (SQLite, `BEGIN IMMEDIATE`), so two controllers never
//! act on the same task, and each picks up the rows the other is not
//! holding. Row locks need no leader election, no heartbeat and no lease
//! expiry to wait out: a replica killed mid-sweep loses its connection, the
//! database rolls its transaction back and releases its locks at once, and
//! the surviving replica (or the restarted one) finds the same rows still
//! due. A lease would make one replica do all the work and make the others
//! wait out its term after a crash.

use std::future::Future;
use std::sync::Arc;

use meatspace_store::Store;
use tokio::sync::watch;

mod backoff;
pub mod config;
mod error;
pub mod expiry;
pub mod health;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(feature = "kubernetes")]
pub mod leader;
pub mod metrics;
#[cfg(feature = "kubernetes")]
pub mod mirror;
pub mod notify;
#[cfg(feature = "kubernetes")]
pub mod requests;
pub mod retention;
mod supervisor;
pub mod telemetry;
pub mod webhooks;

pub use config::{Config, ControllerArgs, ControllerConfig};
pub use error::Error;

/// Runs the reconcilers against `store` until `shutdown` resolves.
///
/// Database errors do not end it: each reconciler logs them, counts them in
/// `meatspace_reconcile_errors_total` and retries with backoff, because a
/// controller must outlive a database restart. A reconciler that panics is
/// restarted with backoff by its [`supervisor`] (and counted in
/// `meatspace_reconciler_restarts_total`), so no reconciler stays dead
/// while the process serves. It returns an error only if a supervisor
/// itself ends before shutdown, which would be a bug.
pub async fn run(
    store: Arc<dyn Store>,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    metrics::describe();
    let (stop, stopped) = watch::channel(false);
    let mut reconcilers = tokio::task::JoinSet::new();
    {
        let (store, config) = (store.clone(), config.clone());
        reconcilers.spawn(supervisor::supervise(
            "expiry",
            move |s| expiry::Expiry::new(store.clone(), &config).run(s),
            Shutdown(stopped.clone()),
        ));
    }
    {
        let (store, config) = (store.clone(), config.clone());
        reconcilers.spawn(supervisor::supervise(
            "retention",
            move |s| retention::Retention::new(store.clone(), &config).run(s),
            Shutdown(stopped.clone()),
        ));
    }
    // Without a server key nothing can be signed, so nothing is delivered.
    if config.webhooks.server_key.is_some() {
        let (store, config) = (store.clone(), config.clone());
        reconcilers.spawn(supervisor::supervise(
            "webhooks",
            move |s| {
                webhooks::Webhooks::new(store.clone(), &config)
                    .expect("a server key is set and the HTTP client builds")
                    .run(s)
            },
            Shutdown(stopped.clone()),
        ));
    } else {
        tracing::warn!("no server secret key: webhooks are not delivered");
    }
    // Push messages and unsubscribe links are signed with the server key.
    if config.notify.server_key.is_some() {
        let (store, config) = (store.clone(), config.clone());
        reconcilers.spawn(supervisor::supervise(
            "notifications",
            move |s| {
                notify::Notifier::new(store.clone(), &config)
                    .expect("a server key is set and the push client builds")
                    .run(s)
            },
            Shutdown(stopped.clone()),
        ));
    } else {
        tracing::warn!("no server secret key: workers are not notified");
    }
    #[cfg(feature = "kubernetes")]
    if let Some(settings) = config.mirror.clone() {
        let clock = config.clock.clone();
        reconcilers.spawn(supervisor::supervise(
            "mirror",
            move |s| kubernetes::run(store.clone(), settings.clone(), clock.clone(), s),
            Shutdown(stopped),
        ));
    }
    #[cfg(not(feature = "kubernetes"))]
    let _ = (store, stopped);
    #[cfg(feature = "kubernetes")]
    let mirror_namespace = config
        .mirror
        .as_ref()
        .map(|m| m.namespace.as_str())
        .unwrap_or("(off)");
    #[cfg(not(feature = "kubernetes"))]
    let mirror_namespace = "(not built in)";
    // Plain numbers, not Rust's Debug of the settings: operators read this.
    tracing::info!(
        retention_seconds = config.retention.num_seconds(),
        tombstone_retention_seconds = config.tombstone_retention.num_seconds(),
        retention_interval_seconds = config.retention_interval.as_secs(),
        batch_size = config.batch_size,
        max_sleep_seconds = config.max_sleep.as_secs(),
        webhook_retry_base_ms = config.webhooks.retry_base.as_millis() as u64,
        webhook_retry_max_seconds = config.webhooks.retry_max.as_secs(),
        webhook_give_up_after_seconds = config.webhooks.give_up_after.as_secs(),
        webhooks_signed = config.webhooks.server_key.is_some(),
        email = config
            .notify
            .smtp
            .as_ref()
            .map_or("(off)".to_owned(), |s| format!("{}:{}", s.host, s.port)),
        notify_hourly_cap = config.notify.hourly_cap,
        mirror_namespace,
        "controller running"
    );

    let mut result = Ok(());
    tokio::select! {
        () = shutdown => tracing::info!("shutting down: finishing the batches in flight"),
        Some(ended) = reconcilers.join_next() => {
            result = Err(Error::ReconcilerStopped(match ended {
                Ok(()) => "its supervisor returned".to_owned(),
                Err(e) => e.to_string(),
            }));
        }
    }
    let _ = stop.send(true);
    while let Some(ended) = reconcilers.join_next().await {
        if let Err(e) = ended {
            result = Err(Error::ReconcilerStopped(e.to_string()));
        }
    }
    if let Err(e) = &result {
        tracing::error!(error = %e, "controller stopped");
    } else {
        tracing::info!("controller stopped");
    }
    result
}

/// Tells a reconciler to stop; it checks between batches, never inside one.
#[derive(Debug, Clone)]
pub(crate) struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    pub(crate) fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once shutdown is requested (or its sender is gone).
    pub(crate) async fn requested(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}
