//! Notifications: who is told what, by Web Push and by email.
//!
//! # The outbox
//!
//! An event that may concern someone (a task published, an issue answered,
//! a revision asked for, a task accepted or cancelled) is recorded in the
//! store's outbox by the database itself, in the transaction that appends
//! the event, so nothing that happened is missed and nothing that was
//! rolled back is announced. This reconciler turns each cause into one
//! notification per worker and channel: an announcement goes to the
//! workers the domain says may hear of it ([`meatspace_domain::notify`]),
//! a page of workers per transaction that also records how far it got,
//! and news of a task goes to its holder. A notification is made once per
//! worker, cause and channel (the table's key), so a controller that
//! restarts in the middle of a fan-out, or two that race, make no
//! duplicates. Assignments about to lapse are found from the tasks table
//! and notified the same way, once per deadline.
//!
//! # Delivery
//!
//! Due notifications are claimed with a lease, so replicas share the work
//! and a crashed controller's claims come back. Before sending, each is
//! checked again: the task must still be for this worker (an announced
//! task still open, news of a task still the worker's), the worker must
//! not be over its hourly cap on the channel, and the channel must still
//! be on. A failed attempt is retried with exponential backoff and jitter
//! until the give-up period; a push subscription the push service calls
//! gone (404 or 410) is removed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use meatspace_domain::clock::Clock;
use meatspace_domain::notify::{self, Cause, Channel, Preferences};
use meatspace_domain::qualification::all_met;
use meatspace_domain::{Task, TaskState};
use meatspace_store::Store;
use meatspace_store::notify::{
    DueNotification, NewNotification, NotificationOutcome, PendingCause,
};
use meatspace_store::secret::ServerKey;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::webhooks::AllowList;
use crate::{ControllerConfig, Error, Shutdown, metrics};

pub mod email;
pub mod push;

pub use email::{SmtpSettings, SmtpTls};

const NAME: &str = "notifications";
/// Causes claimed per pass.
const CAUSES_PER_PASS: u32 = 16;
/// Workers read, decided on and written per fan-out transaction.
const LISTENERS_PER_PAGE: u32 = 1000;
/// Notifications claimed per pass, and sent concurrently.
const DUE_PER_PASS: u32 = 256;
const SEND_CONCURRENCY: usize = 32;
/// How long a claim is held: far longer than a page or a send takes.
const LEASE: TimeDelta = TimeDelta::seconds(60);
/// Least time between two looks for lapsing assignments.
const LAPSE_LOOK_EVERY: TimeDelta = TimeDelta::seconds(30);

/// How notifications are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifySettings {
    /// Email's SMTP server; without one, no email is sent.
    pub smtp: Option<SmtpSettings>,
    /// Most notifications per worker per hour on each channel.
    pub hourly_cap: u32,
    /// How long before an assignment lapses its holder is warned.
    pub lapse_notice: Duration,
    /// First retry delay; doubled per failed attempt, with jitter.
    pub retry_base: Duration,
    /// Longest delay between two attempts.
    pub retry_max: Duration,
    /// A notification still failing this long after it was made is
    /// dropped.
    pub give_up_after: Duration,
    /// Longest time one attempt may take.
    pub timeout: Duration,
    /// Push endpoints that are not public addresses allowed (as for
    /// webhooks: none by default).
    pub push_allow: AllowList,
    /// The contact the VAPID signature names (`mailto:` or `https:`).
    pub push_contact: String,
    /// `scheme://host[:port]` of the links in messages.
    pub links_origin: String,
    /// Signs push messages (the VAPID key is derived from it) and
    /// unsubscribe links; without it nothing is sent.
    pub server_key: Option<ServerKey>,
}

impl Default for NotifySettings {
    fn default() -> Self {
        NotifySettings {
            smtp: None,
            hourly_cap: notify::DEFAULT_HOURLY_CAP,
            lapse_notice: Duration::from_secs(15 * 60),
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(3600),
            give_up_after: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(10),
            push_allow: AllowList::default(),
            push_contact: "mailto:operator@meatspace.invalid".into(),
            links_origin: "http://127.0.0.1:8080".into(),
            server_key: None,
        }
    }
}

/// Absolute links into the server: the task in the worker app, and the
/// unsubscribe page.
#[derive(Debug, Clone)]
pub struct Links {
    origin: String,
    key: ServerKey,
}

impl Links {
    pub fn new(origin: &str, key: ServerKey) -> Links {
        Links {
            origin: origin.trim_end_matches('/').to_owned(),
            key,
        }
    }

    pub fn app(&self, path: &str) -> String {
        format!("{}{path}", self.origin)
    }

    /// The link that stops `channel` for `worker` without a sign-in.
    pub fn unsubscribe(&self, worker: uuid::Uuid, channel: Channel) -> String {
        format!(
            "{}/app/unsubscribe?worker={worker}&channel={}&token={}",
            self.origin,
            channel.as_str(),
            self.key.unsubscribe_token(worker, channel.as_str())
        )
    }
}

/// What one send did.
#[derive(Debug)]
pub(crate) enum Sent {
    Delivered,
    /// Nowhere to send it (no address, every subscription gone).
    Nowhere,
    /// Failed; `transient` failures are retried.
    Failed {
        transient: bool,
        error: String,
    },
}

/// The notification reconciler of one controller replica.
pub(crate) struct Notifier {
    store: Arc<dyn Store>,
    settings: NotifySettings,
    clock: Clock,
    max_sleep: Duration,
    links: Links,
    email: Option<email::Email>,
    push: push::Push,
}

impl Notifier {
    /// `None` without a server key.
    pub(crate) fn new(store: Arc<dyn Store>, config: &ControllerConfig) -> Option<Self> {
        let settings = config.notify.clone();
        let key = settings.server_key.clone()?;
        let links = Links::new(&settings.links_origin, key.clone());
        let email = settings.smtp.as_ref().and_then(|smtp| {
            match email::Email::new(smtp, settings.timeout) {
                Ok(email) => Some(email),
                Err(e) => {
                    tracing::error!(error = %e, "the SMTP settings are unusable: no email is sent");
                    None
                }
            }
        });
        let push = push::Push::new(&key, &settings).ok()?;
        Some(Notifier {
            store,
            settings,
            clock: config.clock.clone(),
            max_sleep: config.max_sleep,
            links,
            email,
            push,
        })
    }

    pub(crate) async fn run(self, mut shutdown: Shutdown) {
        if let Some(email) = &self.email {
            email.check_ready().await;
        }
        let mut changes = self.store.changes().await.ok();
        let mut moved = self.clock.watch();
        let mut backoff = Backoff::default();
        let mut lapse_looked: Option<DateTime<Utc>> = None;
        while !shutdown.is_requested() {
            let now = self.clock.now();
            if lapse_looked.is_none_or(|at| now - at >= LAPSE_LOOK_EVERY) {
                match self.lapse(now).await {
                    Ok(()) => lapse_looked = Some(now),
                    Err(e) => self.failed(&e, "finding lapsing assignments"),
                }
            }
            match self.pass(now).await {
                Ok(true) => {
                    backoff.reset();
                    continue;
                }
                Ok(false) => backoff.reset(),
                Err(e) => {
                    self.failed(&e, "a notification pass");
                    backoff.wait(&mut shutdown).await;
                    continue;
                }
            }
            if let Err(e) = self.gauge_backlog().await {
                self.failed(&e, "reading the backlog");
            }
            let next = match self.store.next_notification_work().await {
                Ok(next) => next,
                Err(e) => {
                    self.failed(&e.into(), "reading the next attempt");
                    Some(now + TimeDelta::seconds(1))
                }
            };
            let until = next
                .map(|t| (t - self.clock.now()).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(self.max_sleep)
                .min(self.max_sleep)
                .min(LAPSE_LOOK_EVERY.to_std().unwrap_or(self.max_sleep));
            if until.is_zero() {
                continue;
            }
            let wake = tokio::time::Instant::now() + until;
            // A change (a new event, perhaps a cause) wakes the loop after a
            // short coalescing delay, as for the other reconcilers.
            crate::expiry::wait(
                wake,
                Duration::from_millis(20),
                &mut changes,
                &mut moved,
                &mut shutdown,
            )
            .await;
        }
    }

    fn failed(&self, e: &Error, what: &str) {
        metrics::failed(NAME, e.metric_label());
        tracing::warn!(error = %e, "{what} failed; retrying");
    }

    /// Fans out claimed causes and sends claimed notifications; `true`
    /// when a batch was full (more may wait).
    async fn pass(&self, now: DateTime<Utc>) -> Result<bool, Error> {
        let span = tracing::info_span!("reconcile", reconciler = NAME);
        async {
            let started = std::time::Instant::now();
            let causes = self
                .store
                .claim_causes(now, now + LEASE, CAUSES_PER_PASS)
                .await?;
            let more_causes = causes.len() == CAUSES_PER_PASS as usize;
            for cause in causes {
                self.fan_out(cause, now).await?;
            }
            let due = self
                .store
                .claim_due_notifications(now, now + LEASE, DUE_PER_PASS)
                .await?;
            let more_due = due.len() == DUE_PER_PASS as usize;
            // The tasks the batch is about, read once each (an
            // announcement's notifications share one).
            let mut tasks = std::collections::HashMap::new();
            for n in &due {
                if let std::collections::hash_map::Entry::Vacant(e) = tasks.entry(n.task_id) {
                    e.insert(self.store.task(n.task_id).await?);
                }
            }
            let tasks = &tasks;
            let results: Vec<Result<(), Error>> = futures::stream::iter(due)
                .map(|n| {
                    let task = tasks.get(&n.task_id).cloned().flatten();
                    self.deliver(n, task)
                })
                .buffer_unordered(SEND_CONCURRENCY)
                .collect()
                .await;
            metrics::reconciled(NAME, started.elapsed());
            results.into_iter().collect::<Result<Vec<()>, Error>>()?;
            Ok(more_causes || more_due)
        }
        .instrument(span)
        .await
    }

    /// Turns one cause into notifications, and takes it out of the outbox.
    async fn fan_out(&self, cause: PendingCause, now: DateTime<Utc>) -> Result<(), Error> {
        let task = self.store.task(cause.task_id).await?;
        let kind = notify::Cause::of_event(cause.kind, cause.actor);
        let (Some(task), Some(kind)) = (task, kind) else {
            self.store
                .fan_out(Some(cause.event_id), &[], None, now)
                .await?;
            return Ok(());
        };
        if kind == Cause::Published {
            return self.announce(&cause, &task, now).await;
        }
        let made = match task.worker_id {
            Some(worker) => {
                self.to_holder(worker, kind, &task, Some(cause.event_id))
                    .await?
            }
            None => Vec::new(),
        };
        self.store
            .fan_out(Some(cause.event_id), &made, None, now)
            .await?;
        Ok(())
    }

    /// The notifications of news of `task` for its holder, on every channel
    /// it can be reached on, if it wants news of its tasks.
    async fn to_holder(
        &self,
        worker: uuid::Uuid,
        cause: Cause,
        task: &Task,
        occurrence: Option<i64>,
    ) -> Result<Vec<NewNotification>, Error> {
        let Some(prefs) = self.store.preferences(worker).await? else {
            return Ok(Vec::new());
        };
        if !prefs.my_tasks {
            return Ok(Vec::new());
        }
        let has_push = !self.store.push_subscriptions(worker).await?.is_empty();
        Ok(channels(&prefs, has_push)
            .map(|channel| NewNotification {
                worker_id: worker,
                cause_key: cause.key(task.id, occurrence),
                cause,
                task_id: task.id,
                channel,
            })
            .collect())
    }

    /// Announces a published task to every worker who may hear of it, a
    /// page at a time, each page in one transaction with the cause's
    /// progress.
    async fn announce(
        &self,
        cause: &PendingCause,
        task: &Task,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        if task.state != TaskState::Open {
            // Taken or ended before anyone was told: nothing to announce.
            self.store
                .fan_out(Some(cause.event_id), &[], None, now)
                .await?;
            return Ok(());
        }
        let blocked: HashSet<uuid::Uuid> = match self.store.task_owner(task.id).await? {
            Some(owner) => self
                .store
                .blocked_workers(owner)
                .await?
                .into_iter()
                .map(|(worker, _)| worker)
                .collect(),
            None => HashSet::new(),
        };
        let started = std::time::Instant::now();
        let mut after = cause.next_worker;
        let mut made_total = 0;
        loop {
            let page = self.store.listeners(after, LISTENERS_PER_PAGE).await?;
            let next = (page.len() == LISTENERS_PER_PAGE as usize)
                .then(|| page.last().map(|l| l.worker_id))
                .flatten();
            let made: Vec<NewNotification> = page
                .iter()
                .filter(|l| {
                    notify::announce_to(task, &l.preferences)
                        && all_met(&task.requirements, &l.qualifications, now)
                        && !blocked.contains(&l.worker_id)
                })
                .flat_map(|l| {
                    channels(&l.preferences, l.has_push).map(|channel| NewNotification {
                        worker_id: l.worker_id,
                        cause_key: Cause::Published.key(task.id, None),
                        cause: Cause::Published,
                        task_id: task.id,
                        channel,
                    })
                })
                .collect();
            made_total += self
                .store
                .fan_out(Some(cause.event_id), &made, next, now)
                .await?;
            match next {
                Some(last) => after = Some(last),
                None => break,
            }
        }
        tracing::debug!(
            task_id = %task.id,
            notifications = made_total,
            took_ms = started.elapsed().as_millis() as u64,
            "announced a published task"
        );
        Ok(())
    }

    /// Warns the holders of assignments that lapse within the notice.
    async fn lapse(&self, now: DateTime<Utc>) -> Result<(), Error> {
        let notice =
            TimeDelta::from_std(self.settings.lapse_notice).unwrap_or(TimeDelta::minutes(15));
        for lapsing in self.store.lapsing(now, now + notice, 500).await? {
            let Some(task) = self.store.task(lapsing.task_id).await? else {
                continue;
            };
            if !notify::still_for(Cause::Lapsing, &task, lapsing.worker_id) {
                continue;
            }
            let made = self
                .to_holder(
                    lapsing.worker_id,
                    Cause::Lapsing,
                    &task,
                    Some(lapsing.at.timestamp_millis()),
                )
                .await?;
            if !made.is_empty() {
                self.store.fan_out(None, &made, None, now).await?;
            }
        }
        Ok(())
    }

    /// Checks a due notification again, sends it, and records the outcome.
    async fn deliver(&self, due: DueNotification, task: Option<Task>) -> Result<(), Error> {
        let outcome = match self.attempt(&due, task).await {
            Ok(outcome) => outcome,
            Err(e) if matches!(e, Error::StoreUnavailable(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, notification = due.id, "a notification failed");
                NotificationOutcome::Failed
            }
        };
        let label = match outcome {
            NotificationOutcome::Sent => "sent",
            NotificationOutcome::Retry(_) => "retried",
            NotificationOutcome::Failed => "failed",
            NotificationOutcome::Capped => "dropped_by_cap",
            NotificationOutcome::Withdrawn => "withdrawn",
        };
        metrics::notification(due.channel.as_str(), label);
        self.store
            .record_notification(due.id, outcome, self.clock.now())
            .await?;
        Ok(())
    }

    async fn attempt(
        &self,
        due: &DueNotification,
        task: Option<Task>,
    ) -> Result<NotificationOutcome, Error> {
        let now = self.clock.now();
        let Some(task) = task else {
            return Ok(NotificationOutcome::Withdrawn);
        };
        let worker = self.store.worker(due.worker_id).await?;
        if worker.is_none_or(|w| w.suspended_at.is_some())
            || !notify::still_for(due.cause, &task, due.worker_id)
        {
            return Ok(NotificationOutcome::Withdrawn);
        }
        let sent = self
            .store
            .sent_since(due.worker_id, due.channel, now - TimeDelta::hours(1))
            .await?;
        if sent >= self.settings.hourly_cap {
            return Ok(NotificationOutcome::Capped);
        }
        let message = notify::message(due.cause, &task);
        let sent = match due.channel {
            Channel::Email => {
                let Some(email) = &self.email else {
                    return Ok(NotificationOutcome::Withdrawn);
                };
                let prefs = self.store.preferences(due.worker_id).await?;
                match prefs.and_then(|p| p.email) {
                    Some(to) => {
                        email
                            .send(
                                &to,
                                &message,
                                &self.links.app(&message.path),
                                &self.links.unsubscribe(due.worker_id, Channel::Email),
                                due.id,
                            )
                            .await
                    }
                    None => Sent::Nowhere,
                }
            }
            Channel::Push => {
                let subscriptions = self.store.push_subscriptions(due.worker_id).await?;
                self.push
                    .send_all(
                        &*self.store,
                        &subscriptions,
                        &message,
                        &self.links.app(&message.path),
                        due.id,
                    )
                    .await?
            }
        };
        Ok(match sent {
            Sent::Delivered => {
                metrics::notification_lag(
                    due.channel.as_str(),
                    (self.clock.now() - due.created_at)
                        .to_std()
                        .unwrap_or_default(),
                );
                NotificationOutcome::Sent
            }
            Sent::Nowhere => NotificationOutcome::Withdrawn,
            Sent::Failed { transient, error } => {
                let give_up =
                    TimeDelta::from_std(self.settings.give_up_after).unwrap_or(TimeDelta::days(1));
                if transient && now - due.created_at < give_up {
                    tracing::info!(notification = due.id, %error, "a notification will be retried");
                    NotificationOutcome::Retry(now + self.retry_delay(due.attempts + 1))
                } else {
                    tracing::warn!(notification = due.id, %error, "a notification failed for good");
                    NotificationOutcome::Failed
                }
            }
        })
    }

    fn retry_delay(&self, attempts: u32) -> TimeDelta {
        crate::backoff::retry_delay(self.settings.retry_base, self.settings.retry_max, attempts)
    }

    async fn gauge_backlog(&self) -> Result<(), Error> {
        let backlog = self.store.notification_backlog().await?;
        let oldest = backlog
            .oldest
            .map(|t| (self.clock.now() - t).to_std().unwrap_or_default())
            .unwrap_or_default();
        metrics::notification_backlog(backlog.causes, backlog.notifications, oldest);
        Ok(())
    }
}

/// The channels a worker with `prefs` can be reached on.
fn channels(prefs: &Preferences, has_push: bool) -> impl Iterator<Item = Channel> {
    [
        has_push.then_some(Channel::Push),
        prefs.email.is_some().then_some(Channel::Email),
    ]
    .into_iter()
    .flatten()
}
