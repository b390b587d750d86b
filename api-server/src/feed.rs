//! Wake-ups for long polls of the event feed (`GET …/events?wait=S`).
//!
//! One process-wide hub, [`Feed`], follows [`Store::changes`] (PostgreSQL
//! LISTEN/NOTIFY on one connection, or SQLite's in-process broadcast) in a
//! background task and fans the changed task ids out through a
//! `tokio::sync::broadcast` channel. A waiting request holds only a receiver
//! of that channel: no database connection and no LISTEN of its own.
//!
//! A wake-up is a hint to re-read, never data: the feed in the database is
//! the authority. So a waiter subscribes ([`Feed::watch`]) *before* it reads
//! the events, and re-reads on every hint that may concern its task: its own
//! id, a lagged receiver (ids were skipped), a resubscription of the hub, or
//! a gap the store reports in its change stream (its notification
//! connection was lost and re-established): in the last two, notifications
//! may have been lost while nobody was listening.
//!
//! The hub counts the requests waiting in [`Watch::changed`]
//! ([`Feed::waiting`], and the `meatspace_long_polls_waiting` gauge on
//! `/metrics`), so an operator sees how many long polls are held open.
//!
//! The hub also keeps the process's [`Heads`] honest: it bumps a task's
//! change counter for every change the stream reports and retires every
//! head when it (re)subscribes, when the stream reports a gap and while it
//! is not subscribed (see [`crate::feed_heads`]).
//!
//! [`Feed::close`] is the server's shutdown: every waiter answers at once
//! with what it has, and the hub stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use meatspace_store::{Change, Store};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use uuid::Uuid;

use crate::feed_heads::Heads;

/// Wake-ups a slow waiter may fall behind by before it just re-reads.
const CAPACITY: usize = 1024;
/// First and longest pause before subscribing to the store's changes again.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What the hub tells waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// This task changed.
    Task(Uuid),
    /// Anything may have changed (the hub (re)subscribed): re-read.
    All,
}

/// The process-wide hub of feed wake-ups. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Feed {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    wakes: broadcast::Sender<Wake>,
    closed: watch::Sender<bool>,
    /// Requests inside [`Watch::changed`] right now.
    waiting: Arc<AtomicUsize>,
    /// Known feed heads, kept current by the hub.
    heads: Heads,
}

impl Feed {
    /// Starts the hub following `store`'s changes. Call it inside the
    /// Tokio runtime; the hub runs until [`Feed::close`] or until every
    /// clone of the returned `Feed` is dropped.
    /// Starts the hub; it also keeps `credentials` true to the store's
    /// revocations (see [`crate::auth::Credentials`]).
    pub fn start(store: Arc<dyn Store>, credentials: crate::auth::Credentials) -> Feed {
        let (wakes, _) = broadcast::channel(CAPACITY);
        let (closed, closed_rx) = watch::channel(false);
        let heads = Heads::new(Arc::clone(&store));
        tokio::spawn(follow(
            store,
            wakes.clone(),
            closed_rx,
            heads.clone(),
            credentials,
        ));
        Feed {
            inner: Arc::new(Inner {
                wakes,
                closed,
                waiting: Arc::default(),
                heads,
            }),
        }
    }

    /// The feed heads this hub keeps current.
    pub fn heads(&self) -> &Heads {
        &self.inner.heads
    }

    /// Shuts the hub down: waiting requests answer now, later ones do not
    /// wait, and the hub stops following the store.
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
    }

    /// True once [`Feed::close`] was called.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// Starts watching one task. Call it before reading the feed: every
    /// change committed after this call wakes [`Watch::changed`].
    pub fn watch(&self, task_id: Uuid) -> Watch {
        Watch {
            task_id,
            wakes: self.inner.wakes.subscribe(),
            closed: self.inner.closed.subscribe(),
            waiting: self.inner.waiting.clone(),
        }
    }

    /// How many requests of this hub are waiting for a change right now
    /// (subscribed, feed read and found empty). Also the
    /// `meatspace_long_polls_waiting` gauge, summed over the process.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::SeqCst)
    }
}

/// Why [`Watch::changed`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The task may have changed: read it again.
    Changed,
    /// The deadline passed.
    Deadline,
    /// The server is shutting down.
    Closed,
}

/// One waiter's subscription to the hub.
#[derive(Debug)]
pub struct Watch {
    task_id: Uuid,
    wakes: broadcast::Receiver<Wake>,
    closed: watch::Receiver<bool>,
    waiting: Arc<AtomicUsize>,
}

/// Counts one request as waiting for as long as it exists (the wait may
/// end by being dropped, when the client goes away).
struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        metrics::gauge!(WAITING_GAUGE).increment(1.0);
        Waiting(count.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        metrics::gauge!(WAITING_GAUGE).decrement(1.0);
    }
}

/// Gauge of the long polls waiting for a change, process-wide.
const WAITING_GAUGE: &str = "meatspace_long_polls_waiting";

impl Watch {
    /// Waits until the task may have changed since the subscription (or the
    /// previous call), the deadline passes, or the feed closes. Wake-ups
    /// for other tasks are skipped without touching the database.
    pub async fn changed(&mut self, deadline: Instant) -> Woken {
        let _waiting = Waiting::new(&self.waiting);
        let sleep = tokio::time::sleep_until(deadline);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                biased;
                // A dropped sender (the hub is gone) also ends the wait.
                _ = self.closed.wait_for(|closed| *closed) => return Woken::Closed,
                () = &mut sleep => return Woken::Deadline,
                wake = self.wakes.recv() => match wake {
                    Ok(Wake::Task(id)) if id != self.task_id => {}
                    Ok(Wake::Task(_) | Wake::All) => return Woken::Changed,
                    // Some ids were skipped, maybe this task's.
                    Err(broadcast::error::RecvError::Lagged(_)) => return Woken::Changed,
                    Err(broadcast::error::RecvError::Closed) => return Woken::Closed,
                },
            }
        }
    }
}

/// The hub: follows the store's changes until the feed closes,
/// resubscribing with a short backoff whenever the stream fails or ends.
async fn follow(
    store: Arc<dyn Store>,
    wakes: broadcast::Sender<Wake>,
    closed: watch::Receiver<bool>,
    heads: Heads,
    credentials: crate::auth::Credentials,
) {
    follow_changes(store, wakes, closed, &heads, &credentials).await;
    heads.lost();
    // Nobody tells this process of revocations any more.
    credentials.clear();
}

async fn follow_changes(
    store: Arc<dyn Store>,
    wakes: broadcast::Sender<Wake>,
    mut closed: watch::Receiver<bool>,
    heads: &Heads,
    credentials: &crate::auth::Credentials,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let subscribed = tokio::select! {
            _ = closed.wait_for(|c| *c) => return,
            s = store.changes() => s,
        };
        match subscribed {
            Ok(mut changes) => {
                // Changes committed while nobody listened sent no wake-up:
                // let every waiter re-read once, and trust no older head.
                heads.resubscribed();
                credentials.clear();
                let _ = wakes.send(Wake::All);
                let since = Instant::now();
                loop {
                    tokio::select! {
                        _ = closed.wait_for(|c| *c) => return,
                        change = changes.next() => match change {
                            // No receiver just means nobody is waiting.
                            Some(Change::Task(id)) => {
                                heads.changed(id);
                                let _ = wakes.send(Wake::Task(id));
                            }
                            // Notifications were lost (the database
                            // connection dropped and came back): every
                            // waiter re-reads.
                            Some(Change::Credential(id)) => credentials.forget(id),
                            Some(Change::Gap) => {
                                heads.resubscribed();
                                credentials.clear();
                                let _ = wakes.send(Wake::All);
                            }
                            None => break,
                        },
                    }
                }
                heads.lost();
                credentials.clear();
                if since.elapsed() > MAX_BACKOFF {
                    backoff = MIN_BACKOFF;
                }
                tracing::warn!("the task change stream ended; following it again");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow task changes; retrying");
            }
        }
        tokio::select! {
            _ = closed.wait_for(|c| *c) => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub without a store: the test plays the hub's part.
    fn detached() -> Feed {
        let (wakes, _) = broadcast::channel(4);
        let (closed, _) = watch::channel(false);
        Feed {
            inner: Arc::new(Inner {
                wakes,
                closed,
                waiting: Arc::default(),
                heads: Heads::detached(),
            }),
        }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(200)
    }

    #[tokio::test]
    async fn a_watch_wakes_for_its_task_and_skips_the_others() {
        let feed = detached();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut watch = feed.watch(a);
        feed.inner.wakes.send(Wake::Task(b)).unwrap();
        assert_eq!(watch.changed(soon()).await, Woken::Deadline);
        feed.inner.wakes.send(Wake::Task(b)).unwrap();
        feed.inner.wakes.send(Wake::Task(a)).unwrap();
        assert_eq!(watch.changed(soon()).await, Woken::Changed);
        feed.inner.wakes.send(Wake::All).unwrap();
        assert_eq!(watch.changed(soon()).await, Woken::Changed);
    }

    /// A detached hub and a watch of one new task.
    fn watching() -> (Feed, Uuid, Watch) {
        let feed = detached();
        let task = Uuid::new_v4();
        let watch = feed.watch(task);
        (feed, task, watch)
    }

    #[tokio::test]
    async fn a_wake_sent_before_the_wait_is_not_lost() {
        // Subscribed, then the change happens while the caller reads.
        let (feed, a, mut watch) = watching();
        feed.inner.wakes.send(Wake::Task(a)).unwrap();
        assert_eq!(watch.changed(soon()).await, Woken::Changed);
    }

    #[tokio::test]
    async fn a_lagging_watch_re_reads() {
        let (feed, _, mut watch) = watching();
        for _ in 0..10 {
            feed.inner.wakes.send(Wake::Task(Uuid::new_v4())).unwrap();
        }
        assert_eq!(watch.changed(soon()).await, Woken::Changed);
    }

    #[tokio::test]
    async fn closing_ends_every_wait_now() {
        let feed = detached();
        let far = Instant::now() + Duration::from_secs(60);
        let mut before = feed.watch(Uuid::new_v4());
        let waiting = tokio::spawn(async move { before.changed(far).await });
        // Close only once the wait is under way (the hub counts it), so that
        // this is the close of a wait in progress, not one that starts after.
        let give_up = Instant::now() + Duration::from_secs(30);
        while feed.waiting() == 0 {
            assert!(Instant::now() < give_up, "the wait never started");
            tokio::task::yield_now().await;
        }
        feed.close();
        assert!(feed.is_closed());
        let woken = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the wait ended")
            .unwrap();
        assert_eq!(woken, Woken::Closed);
        // A wait that starts after the close does not wait at all.
        let mut after = feed.watch(Uuid::new_v4());
        assert_eq!(after.changed(far).await, Woken::Closed);
    }
}
