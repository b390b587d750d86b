//! What the server knows of each polled task's feed without asking the
//! database: the agent token's digest, the task's state and its last event
//! id (the feed's *head*). An empty poll (`events?after=<last id>`) of a task
//! whose head is known and current is answered from memory.
//!
//! # Why a head that is used is current
//!
//! A head is kept together with a *stamp* taken **before** the database
//! read that filled it: the hub's epoch and the task's counter in the
//! store's [`TaskVersions`]. It is used only while the hub is live, the
//! epoch is the same and the task's counter still has the stamped value
//! (and it is younger than [`MAX_AGE`]). The counter is bumped
//!
//! 1. by the store of this process, right after each commit that touches
//!    the task and before the call that made it returns, so before any
//!    client hears of the change from this process (a worker's message
//!    answered 200 is seen by the very next poll, on any connection); and
//! 2. by the hub, for each change the store's change stream reports
//!    (`NOTIFY` from every process sharing the PostgreSQL database).
//!
//! A commit that the filling read did not see happened after the read's
//! snapshot, so after the stamp; its bump therefore comes after the stamp
//! too and retires the head. A change made by another process is known
//! here once its notification arrives, as for long polls; the epoch is
//! bumped whenever the hub (re)subscribes or the stream reports a
//! [`Change::Gap`](meatspace_store::Change::Gap) (notifications may have been
//! lost), and no head is trusted while the hub is not subscribed, or when it
//! was stamped before the current subscription: so every change committed
//! after a head's stamp has been or will be announced to this process, and
//! the head is retired by then. [`MAX_AGE`] bounds what a writer outside
//! every change stream (another process on the same SQLite file) could hide.
//!
//! An answer from a head never advances the client's cursor (an empty page
//! says `next_cursor = after`), so at worst a poll racing a change made
//! elsewhere sees the event on its next poll, as if it had come a moment
//! earlier; no event is skipped.
//!
//! Only heads of non-terminal tasks are kept: a task is purged only after it
//! ended, and the head of a task that ended was retired by that change long
//! before retention removes the task; so a head never answers for a purged
//! task, and a removed tombstone (a token that must now be refused) never
//! meets a kept digest.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use meatspace_domain::TaskState;
use meatspace_store::Store;
use meatspace_store::token::TokenHash;
use uuid::Uuid;

/// Longest a head is trusted after the read that filled it.
pub const MAX_AGE: Duration = Duration::from_secs(1);
/// Heads kept at most (memory bound): a shard that fills up is emptied.
const CAPACITY: usize = 64 * 1024;
const SHARDS: usize = 16;

/// What a poll needs to answer an empty page.
#[derive(Debug, Clone)]
pub struct Head {
    pub agent_token_hash: TokenHash,
    pub state: TaskState,
    pub last_event_id: i64,
}

/// Taken before the database read that fills a head.
#[derive(Debug, Clone, Copy)]
pub struct Stamp {
    epoch: u64,
    version: u64,
    at: Instant,
}

#[derive(Debug)]
struct Entry {
    head: Head,
    stamp: Stamp,
}

/// The process's known feed heads. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Heads {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Holds the change counters (`None`: a hub without a store, in tests).
    store: Option<Arc<dyn Store>>,
    /// Bumped whenever announcements may have been missed.
    epoch: AtomicU64,
    /// The hub is subscribed to the store's changes.
    live: AtomicBool,
    shards: Vec<Mutex<HashMap<Uuid, Entry>>>,
}

impl Heads {
    pub fn new(store: Arc<dyn Store>) -> Heads {
        Heads::with(Some(store))
    }

    /// Heads that are never kept (a hub without a store, in tests).
    pub fn detached() -> Heads {
        Heads::with(None)
    }

    fn with(store: Option<Arc<dyn Store>>) -> Heads {
        Heads {
            inner: Arc::new(Inner {
                store,
                epoch: AtomicU64::new(0),
                live: AtomicBool::new(false),
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            }),
        }
    }

    fn shard(&self, id: Uuid) -> &Mutex<HashMap<Uuid, Entry>> {
        let (high, low) = id.as_u64_pair();
        &self.inner.shards[((high ^ low) as usize) % SHARDS]
    }

    /// The stamp for a read of `id` about to start; `None` when nothing
    /// read now could be kept (the hub is not subscribed, or the store keeps
    /// no change counters).
    pub fn stamp(&self, id: Uuid) -> Option<Stamp> {
        let versions = self.inner.store.as_ref()?.versions()?;
        if !self.inner.live.load(Ordering::SeqCst) {
            return None;
        }
        Some(Stamp {
            epoch: self.inner.epoch.load(Ordering::SeqCst),
            version: versions.current(id),
            at: Instant::now(),
        })
    }

    fn current(&self, id: Uuid, stamp: &Stamp) -> bool {
        self.inner.live.load(Ordering::SeqCst)
            && stamp.epoch == self.inner.epoch.load(Ordering::SeqCst)
            && stamp.at.elapsed() < MAX_AGE
            && self
                .inner
                .store
                .as_ref()
                .and_then(|s| s.versions())
                .is_some_and(|v| v.current(id) == stamp.version)
    }

    /// Keeps what a read stamped with `stamp` found (heads of terminal
    /// tasks are not kept; see the module documentation).
    pub fn remember(&self, id: Uuid, stamp: Stamp, head: Head) {
        if head.state.is_terminal() || !self.current(id, &stamp) {
            return;
        }
        let mut shard = self
            .shard(id)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.len() >= CAPACITY / SHARDS && !shard.contains_key(&id) {
            shard.clear();
        }
        shard.insert(id, Entry { head, stamp });
    }

    /// The task's head, if it is known and current.
    pub fn get(&self, id: Uuid) -> Option<Head> {
        let mut shard = self
            .shard(id)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = shard.get(&id)?;
        if self.current(id, &entry.stamp) {
            Some(entry.head.clone())
        } else {
            shard.remove(&id);
            None
        }
    }

    /// The hub saw a change of `id` (from any process).
    pub fn changed(&self, id: Uuid) {
        if let Some(versions) = self.inner.store.as_ref().and_then(|s| s.versions()) {
            versions.bump(id);
        }
    }

    /// The hub (re)subscribed, or changes may have been missed: no head
    /// stamped before now is trusted again.
    pub fn resubscribed(&self) {
        self.inner.epoch.fetch_add(1, Ordering::SeqCst);
        self.inner.live.store(true, Ordering::SeqCst);
    }

    /// The hub lost its subscription: nothing is trusted until it is back.
    pub fn lost(&self) {
        self.inner.live.store(false, Ordering::SeqCst);
        self.inner.epoch.fetch_add(1, Ordering::SeqCst);
    }
}
