//! Checkpoints of the WAL, off the writer's path.
//!
//! A checkpoint copies the WAL's pages into the database file and syncs
//! both files. In the writer's own `COMMIT` (SQLite's auto-checkpoint,
//! every 1,000 pages) it stalls every write queued behind it: under a
//! stream of creates that was a checkpoint every 30 ms or so, each holding
//! the writer for 5–10 ms of `fsync`, and the tail of every write's
//! latency (a create's p99 was 11–15 ms, its p50 1.3 ms).
//!
//! So a thread of its own, `sqlite-checkpoint`, on its own connection, runs
//! `PASSIVE` checkpoints while the writer goes on appending: it copies and
//! syncs what was in the WAL when it started. Such a checkpoint never
//! catches up with a writer that keeps appending, and SQLite starts the WAL
//! over only once every page in it was copied, so alone it would let the
//! WAL grow without end. The writer finishes the job: once a pass finds the
//! WAL at [`CATCH_UP_AT`] pages or more, the thread stops and asks the
//! writer, which checkpoints on its own connection between two batches —
//! after the one before is answered, with no pass running — copying only
//! what the last pass left (a few batches' pages), so that its next write
//! starts the WAL over. The two never checkpoint at once: the thread runs a
//! pass only when no catch-up is asked for, and asks for one only after
//! its pass.
//!
//! Durability is SQLite's: a checkpoint, from whichever connection, syncs
//! the WAL before it copies and the database file before the WAL restarts.
//! If the thread is gone, the writer's own auto-checkpoint (at
//! [`BACKSTOP_PAGES`]) still bounds the WAL. A pass slowed down (a busy
//! machine) keeps the writer's checkpoints out while it runs, so the WAL
//! can outgrow the backstop for a while; the writer's connection cuts the
//! file back to the backstop's size when the WAL starts over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use rusqlite::Connection;

/// The WAL's size, in pages, at which the writer is asked to catch up: its
/// start over comes as often as with SQLite's default auto-checkpoint.
pub(crate) const CATCH_UP_AT: i64 = 1000;

/// The writer connection's own auto-checkpoint: only a WAL the checkpoint
/// thread did not keep down reaches it.
pub(crate) const BACKSTOP_PAGES: i64 = 4 * CATCH_UP_AT;

/// How many checkpoints ran, by whom (see
/// [`crate::SqliteStore::checkpoint_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointCounts {
    /// Passes of the checkpoint thread.
    pub passes: u64,
    /// The writer's catch-ups, each letting the WAL start over.
    pub catch_ups: u64,
}

/// What the thread and the writer share; the store reads the counts.
#[derive(Debug, Default)]
pub(crate) struct CheckpointState {
    /// The thread asked the writer to finish: set only after a pass, by the
    /// thread, and cleared only by the writer, after its checkpoint.
    catch_up: AtomicBool,
    passes: AtomicU64,
    catch_ups: AtomicU64,
}

/// The writer's side of the checkpoint thread.
#[derive(Debug)]
pub(crate) struct Checkpoints {
    /// A pass is wanted (the writer committed since the last one).
    nudge: SyncSender<()>,
    shared: Arc<CheckpointState>,
}

impl Checkpoints {
    /// Starts the checkpoint thread on `conn`, a connection of its own to
    /// the writer's file; it ends once the writer's side is dropped.
    pub(crate) fn spawn(conn: Connection) -> std::io::Result<Self> {
        let (nudge, nudged) = sync_channel(1);
        let shared = Arc::<CheckpointState>::default();
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || passes(&conn, &nudged, &thread))?;
        Ok(Checkpoints { nudge, shared })
    }

    /// A handle on the counts, for the store to read.
    pub(crate) fn shared(&self) -> Arc<CheckpointState> {
        self.shared.clone()
    }

    /// After a batch was committed and answered, with `writer` (the
    /// writer's connection, out of any transaction): its checkpoint when the
    /// thread asked for one, and a pass wanted either way.
    pub(crate) fn after_batch(&self, writer: Option<&Connection>) {
        let shared = &self.shared;
        if shared.catch_up.load(Ordering::Acquire) {
            if let Some(conn) = writer {
                match checkpoint(conn) {
                    Ok(_) => {
                        shared.catch_ups.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!(CATCH_UPS).increment(1);
                    }
                    // As a failing auto-checkpoint: the next write says why.
                    Err(e) => tracing::debug!(error = %e, "the writer's WAL checkpoint failed"),
                }
            }
            shared.catch_up.store(false, Ordering::Release);
        }
        // Full: a pass is already wanted, and will see this commit.
        // Disconnected: the thread is gone, and the backstop bounds the WAL.
        let _ = self.nudge.try_send(());
    }
}

/// Checkpoint passes of the thread, one per nudge, none while the writer
/// is asked to catch up.
fn passes(conn: &Connection, nudged: &Receiver<()>, shared: &CheckpointState) {
    let mut failing = false;
    while nudged.recv().is_ok() {
        if shared.catch_up.load(Ordering::Acquire) {
            continue;
        }
        match checkpoint(conn) {
            Ok(pages) => {
                failing = false;
                shared.passes.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(PASSES).increment(1);
                if pages >= CATCH_UP_AT {
                    shared.catch_up.store(true, Ordering::Release);
                }
            }
            // Once per run of failures (a full disk fails every pass).
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "WAL checkpoints fail; the writer's own bound the WAL");
            }
            Err(_) => {}
        }
    }
}

impl CheckpointState {
    pub(crate) fn counts(&self) -> CheckpointCounts {
        CheckpointCounts {
            passes: self.passes.load(Ordering::Relaxed),
            catch_ups: self.catch_ups.load(Ordering::Relaxed),
        }
    }
}

/// Counter of the checkpoint thread's passes.
const PASSES: &str = "meatspace_sqlite_checkpoint_passes_total";
/// Counter of the writer's catch-up checkpoints.
const CATCH_UPS: &str = "meatspace_sqlite_checkpoint_catch_ups_total";

/// A `PASSIVE` checkpoint on `conn`: the pages in the WAL when it ran.
fn checkpoint(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
}
