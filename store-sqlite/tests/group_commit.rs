//! The SQLite writer's group commit, on a real file: writes queued together
//! commit in one transaction, a write refused or failing on its own is
//! undone alone while its batch-mates commit, and a failed `COMMIT` fails
//! every write of its batch and writes none of them. The WAL's checkpoints
//! run off the writer's path and the WAL still starts over.
//!
//! Each test first holds the writer on a write of its own ([`hold`]) and
//! waits until the writes under test are all queued behind it: the writer
//! then takes them together, as it does under load. Both kinds of write
//! are covered: inline jobs (the engine's writes) and lending writes.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::future::join_all;
use meatspace_domain::{Command, Policy, TaskState};
use meatspace_store::engine::Backend as _;
use meatspace_store::token::{self, TokenHash};
use meatspace_store::{
    ConnectOptions, EngineWrites, IdentityStore, NewTask, Store, StoreError, TaskReads,
};
use meatspace_store_sqlite::SqliteStore;
use meatspace_store_sqlite::inline;
use uuid::Uuid;

async fn store(dir: &tempfile::TempDir) -> SqliteStore {
    let url = format!("sqlite://{}", dir.path().join("group.db").display());
    let options = ConnectOptions {
        max_connections: 4,
        acquire_timeout: Duration::from_secs(30),
    };
    SqliteStore::connect(&url, Policy::default(), &options)
        .await
        .expect("open the store")
}

/// Holds the writer thread inside a write until the returned sender is
/// used or dropped, so that the writes queued meanwhile form the next batch.
async fn hold(store: &SqliteStore) -> std::sync::mpsc::Sender<()> {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (running, started) = tokio::sync::oneshot::channel();
    let store = store.clone();
    tokio::spawn(async move {
        store
            .write_inline(move |_| {
                let _ = running.send(());
                let _ = held.recv();
                Ok(())
            })
            .await
    });
    started.await.expect("the writer runs the holding write");
    release
}

/// Waits until `n` writes are queued behind the held writer; a write that
/// never reaches the queue fails the test instead of hanging it.
async fn queued(store: &SqliteStore, n: usize) {
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
    let deadline = std::time::Instant::now() + LIMIT;
    while store.queued_writes() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} writes queued after {LIMIT:?}",
            store.queued_writes()
        );
        tokio::task::yield_now().await;
    }
}

fn new_task(id: Uuid, now: DateTime<Utc>) -> NewTask {
    NewTask::development(
        id,
        "water the plants",
        TokenHash::of(&token::generate("mst_")),
        now,
        now + TimeDelta::hours(1),
    )
}

async fn new_worker(store: &SqliteStore, now: DateTime<Utc>) -> Uuid {
    let id = Uuid::new_v4();
    let hash = TokenHash::of(&token::generate("msw_"));
    store
        .create_worker(id, "Ada", hash, now)
        .await
        .expect("create a worker");
    id
}

/// Twenty creates, eight claims of one open task, a create of an id that
/// exists and four redemptions of one invite, all at once: fewer commits
/// than half the writes, every create landed, exactly one claim and one
/// redemption won, and what each loser wrote before it lost is gone.
#[tokio::test]
async fn queued_writes_share_commits_and_a_losing_write_fails_alone() {
    const CREATES: usize = 20;
    const CLAIMS: usize = 8;
    const REDEMPTIONS: usize = 4;
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = store(&dir).await;
    let now = Utc::now();
    let open = store
        .create_task(new_task(Uuid::new_v4(), now))
        .await
        .expect("create");
    store
        .apply(open.id, Command::Publish, now)
        .await
        .expect("publish");
    let mut workers = Vec::new();
    for _ in 0..CLAIMS {
        workers.push(new_worker(&store, now).await);
    }
    let invite = Uuid::new_v4();
    store
        .create_invite(
            invite,
            TokenHash::of("code"),
            now + TimeDelta::hours(1),
            meatspace_store::NewAudit {
                at: now,
                principal_id: meatspace_domain::identity::DEVELOPMENT_PRINCIPAL,
                action: meatspace_domain::identity::AuditAction::InviteCreated,
                target: format!("invite:{invite}"),
                address: None,
                detail: None,
            },
        )
        .await
        .expect("create an invite");
    let release = hold(&store).await;
    let before = store.write_counts();

    let creates: Vec<_> = (0..CREATES)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.create_task(new_task(Uuid::new_v4(), now)).await })
        })
        .collect();
    let claims: Vec<_> = workers
        .iter()
        .map(|&worker| {
            let store = store.clone();
            tokio::spawn(async move {
                let claimed = store.apply(open.id, Command::Claim { worker }, now).await;
                (worker, claimed)
            })
        })
        .collect();
    let duplicate = {
        let store = store.clone();
        tokio::spawn(async move { store.create_task(new_task(open.id, now)).await })
    };
    let redemptions: Vec<_> = (0..REDEMPTIONS)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let worker = Uuid::new_v4();
                let hash = TokenHash::of(&token::generate("msw_"));
                let redeemed = store.redeem_invite(invite, worker, "Bo", hash, now).await;
                (worker, redeemed)
            })
        })
        .collect();
    queued(&store, CREATES + CLAIMS + 1 + REDEMPTIONS).await;
    drop(release);

    let creates: Vec<_> = join_all(creates)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let claims: Vec<_> = join_all(claims)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let duplicate = duplicate.await.unwrap();
    let redemptions: Vec<_> = join_all(redemptions)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();

    for created in &creates {
        let task = created.as_ref().expect("every create commits");
        let stored = store.task(task.id).await.expect("read").expect("landed");
        assert_eq!(stored.state, TaskState::Draft);
    }
    let winners: Vec<Uuid> = claims
        .iter()
        .filter(|(_, claimed)| claimed.is_ok())
        .map(|(worker, _)| *worker)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one claim wins: {winners:?}");
    for (_, claimed) in &claims {
        if let Err(e) = claimed {
            assert!(
                matches!(e, StoreError::Refused(_)),
                "a losing claim is refused: {e}"
            );
        }
    }
    let stored = store.task(open.id).await.expect("read").expect("task");
    assert_eq!(stored.worker_id, Some(winners[0]));
    assert_eq!(stored.state, TaskState::Assigned);
    assert!(
        matches!(duplicate, Err(StoreError::Database(_))),
        "a create of an existing id fails: {duplicate:?}"
    );
    assert_eq!(
        stored.description, "water the plants",
        "the failed create left the task it collided with as it was"
    );
    let mut redeemed = 0;
    for (worker, outcome) in &redemptions {
        let kept = store.worker_token_hash(*worker).await.expect("read");
        match outcome.as_ref().expect("a redemption answers") {
            Some(_) => {
                redeemed += 1;
                assert!(kept.is_some(), "the winner's worker is stored");
            }
            None => assert!(kept.is_none(), "a losing redemption's worker is undone"),
        }
    }
    assert_eq!(redeemed, 1, "exactly one redemption wins");

    let after = store.write_counts();
    let writes = after.writes - before.writes;
    let commits = after.commits - before.commits;
    assert_eq!(
        writes,
        u64::try_from(CREATES + 2).unwrap(),
        "every create, one claim and one redemption committed"
    );
    assert!(
        commits * 2 < writes,
        "queued writes share commits: {writes} writes in {commits} commits"
    );
}

/// A write that breaks a deferred foreign key commits into the batch, so the
/// batch's `COMMIT` fails: every write queued with it gets the error, none
/// of them is written, and the next write commits as usual. The orphan is
/// an inline job, as the creates are.
#[tokio::test]
async fn a_failed_commit_fails_every_write_of_its_batch() {
    const CREATES: usize = 6;
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = store(&dir).await;
    let now = Utc::now();
    let release = hold(&store).await;

    let orphan = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .write_inline(|db| {
                    inline::run_to_end(async {
                        let tx = db.begin_write().await?;
                        db.execute("PRAGMA defer_foreign_keys = ON")?;
                        db.execute(ORPHAN_EVENT)?;
                        db.commit(tx).await
                    })
                })
                .await
        })
    };
    let ids: Vec<Uuid> = (0..CREATES).map(|_| Uuid::new_v4()).collect();
    let creates: Vec<_> = ids
        .iter()
        .map(|&id| {
            let store = store.clone();
            tokio::spawn(async move { store.create_task(new_task(id, now)).await })
        })
        .collect();
    queued(&store, 1 + CREATES).await;
    drop(release);

    let orphan = orphan.await.unwrap();
    assert!(orphan.is_err(), "the orphan's commit fails");
    for (id, created) in ids.iter().zip(join_all(creates).await) {
        assert!(
            created.unwrap().is_err(),
            "a write of the failed batch is answered with its error"
        );
        assert!(
            store.task(*id).await.expect("read").is_none(),
            "and is not written"
        );
    }
    assert_eq!(
        count(&store, "events").await,
        0,
        "the orphan event is not written"
    );

    let task = store
        .create_task(new_task(Uuid::new_v4(), now))
        .await
        .expect("the next write commits");
    assert!(store.task(task.id).await.expect("read").is_some());
}

/// The same for lending writes (sqlx's connection, lent inside the batch):
/// a lending write that breaks a deferred foreign key fails the lending
/// writes queued with it, and a refused one is undone alone.
#[tokio::test]
async fn lending_writes_share_commits_and_a_failed_commit_fails_them_all() {
    const AUDITS: usize = 6;
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = store(&dir).await;

    // First a batch that commits: audits and one write that rolls back.
    let release = hold(&store).await;
    let before = store.write_counts();
    let audits: Vec<_> = (0..AUDITS)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.append_audit(audit()).await })
        })
        .collect();
    let undone = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = store.begin_write().await?;
            sqlx::query(
                "INSERT INTO audit (at, principal_id, action, target) \
                 VALUES (0, ?, 'key.created', 'key:undone')",
            )
            .bind(meatspace_domain::identity::DEVELOPMENT_PRINCIPAL.to_string())
            .execute(&mut *tx)
            .await?;
            tx.rollback().await
        })
    };
    queued(&store, AUDITS + 1).await;
    drop(release);
    for appended in join_all(audits).await {
        appended.unwrap().expect("an audit row commits");
    }
    undone.await.unwrap().expect("a rollback is answered");
    let after = store.write_counts();
    assert_eq!(
        after.writes - before.writes,
        AUDITS as u64,
        "the audits committed"
    );
    assert_eq!(after.commits - before.commits, 1, "in one commit");
    assert_eq!(count(&store, "audit").await, AUDITS as i64);

    // Then a batch whose COMMIT fails.
    let release = hold(&store).await;
    let orphan = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = store.begin_write().await?;
            sqlx::query("PRAGMA defer_foreign_keys = ON")
                .execute(&mut *tx)
                .await?;
            sqlx::query(ORPHAN_EVENT).execute(&mut *tx).await?;
            tx.commit().await
        })
    };
    let audits: Vec<_> = (0..AUDITS)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.append_audit(audit()).await })
        })
        .collect();
    queued(&store, 1 + AUDITS).await;
    drop(release);
    assert!(orphan.await.unwrap().is_err(), "the orphan's commit fails");
    for appended in join_all(audits).await {
        assert!(
            appended.unwrap().is_err(),
            "a write of the failed batch is answered with its error"
        );
    }
    assert_eq!(
        count(&store, "audit").await,
        AUDITS as i64,
        "none of them is written"
    );
    assert_eq!(count(&store, "events").await, 0, "nor the orphan");
    store
        .append_audit(audit())
        .await
        .expect("the next write commits");
}

/// An event of no task: it breaks a (deferred) foreign key.
const ORPHAN_EVENT: &str = "INSERT INTO events (task_id, type, actor, created_at, data) \
     VALUES ('no such task', 'task.published', 'agent', 0, '{}')";

fn audit() -> meatspace_store::NewAudit {
    meatspace_store::NewAudit {
        at: Utc::now(),
        principal_id: meatspace_domain::identity::DEVELOPMENT_PRINCIPAL,
        action: meatspace_domain::identity::AuditAction::KeyCreated,
        target: "key:test".into(),
        address: None,
        detail: None,
    }
}

async fn count(store: &SqliteStore, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(store.pool())
        .await
        .expect("count rows")
}

/// A stream of creates, 32 at a time, until the writer has caught up with
/// the checkpoint thread five times: every catch-up lets the WAL start
/// over, and the write after it cuts the WAL file back to the writer's own
/// auto-checkpoint (4,000 pages), although the creates wrote more than
/// that (on a busy machine a slow pass can let the WAL outgrow it between
/// two catch-ups). Without the writer's catch-up a checkpoint on another
/// connection never finishes and the WAL grows by every write; without the
/// thread nothing counts.
#[tokio::test]
async fn checkpoints_run_off_the_writer_and_the_wal_starts_over() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = store(&dir).await;
    let now = Utc::now();
    let mut creates = 0;
    while store.checkpoint_counts().catch_ups < 5 {
        assert!(
            creates < 100_000,
            "{creates} creates and only {:?}",
            store.checkpoint_counts()
        );
        let batch = (0..32).map(|_| store.create_task(new_task(Uuid::new_v4(), now)));
        for created in join_all(batch).await {
            created.expect("a create");
        }
        creates += 32;
    }
    // The write after the last catch-up starts the WAL over.
    store
        .create_task(new_task(Uuid::new_v4(), now))
        .await
        .expect("a create");
    let counts = store.checkpoint_counts();
    assert!(counts.passes >= counts.catch_ups, "{counts:?}");
    let wal = std::fs::metadata(dir.path().join("group.db-wal"))
        .expect("the WAL file")
        .len();
    let page = 4096;
    assert!(
        wal <= (4000 + 256) * page,
        "the WAL grew to {wal} bytes over {creates} creates ({counts:?})"
    );
}
