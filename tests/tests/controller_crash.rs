//! Crash safety on both real backends: a `meatspace-controller` process
//! killed with SIGKILL in the middle of expiring a backlog leaves every task
//! either untouched or expired with its one event, and a restarted one
//! finishes the job without a duplicate.

mod controller_support;

use std::time::Duration;

use meatspace_domain::{EventType, Policy, TaskState, clock};
use meatspace_tests::{Db, TestDb};
use sqlx::Connection;
use uuid::Uuid;

use controller_support::*;
use meatspace_tests::eventually;

on_both_backends!(a_controller_killed_mid_sweep_leaves_the_store_consistent);

const TASKS: usize = 3000;

/// Polls the database (over one connection, without pause) until some
/// tasks are expired; returns how many were.
async fn first_expiries(url: &str) -> i64 {
    let sql = "SELECT count(*) FROM tasks WHERE state = 'expired'";
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        first_positive(async || {
            sqlx::query_scalar(sql)
                .fetch_one(&mut c)
                .await
                .expect("count")
        })
        .await
    } else {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        first_positive(async || {
            tokio::task::yield_now().await;
            sqlx::query_scalar(sql)
                .fetch_one(&mut c)
                .await
                .expect("count")
        })
        .await
    }
}

/// Calls `count` until it is positive (within 30 s): that count.
async fn first_positive(mut count: impl AsyncFnMut() -> i64) -> i64 {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n = count().await;
        if n > 0 {
            return n;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "nothing expired in 30 s"
        );
    }
}

/// Every task is consistent; returns how many are expired.
async fn check_all(store: &std::sync::Arc<dyn meatspace_store::Store>, ids: &[Uuid]) -> usize {
    let mut expired = 0;
    for id in ids {
        let (t, evs) = check_consistent(store, *id).await;
        match t.state {
            TaskState::Expired => {
                assert_eq!(
                    evs.iter().map(|e| e.kind).collect::<Vec<_>>(),
                    [EventType::TaskExpired]
                );
                expired += 1;
            }
            TaskState::Draft => assert!(evs.is_empty(), "untouched task {id} has events"),
            other => panic!("task {id} is {other}"),
        }
    }
    expired
}

async fn a_controller_killed_mid_sweep_leaves_the_store_consistent(db: Db) {
    let db = TestDb::new(db).await;
    let store = db.store(Policy::default()).await;
    // Every deadline has passed when the controller starts.
    let ids = drafts_until(&store, TASKS, clock::now()).await;

    // Small batches: the process is almost always inside a transaction.
    let env = [("MEATSPACE_CONTROLLER_BATCH_SIZE", "10")];
    let mut first = controller_process(&db.url, &env);
    let at_kill = first_expiries(&db.url).await;
    first.kill().await;
    assert!(
        (at_kill as usize) < TASKS,
        "the controller finished all {TASKS} tasks before it could be killed; nothing was tested"
    );
    let after_kill = check_all(&store, &ids).await;
    println!("killed after {at_kill} expiries were visible; {after_kill} committed in all");
    assert!(after_kill < TASKS, "the kill came after the last batch");

    let mut second = controller_process(&db.url, &env);
    second.ready().await;
    eventually(
        Duration::from_secs(60),
        "the restarted controller to finish",
        || async { store.next_deadline().await.unwrap().is_none().then_some(()) },
    )
    .await;
    assert_eq!(check_all(&store, &ids).await, TASKS);
    assert!(
        second.terminate().await,
        "did not shut down cleanly:\n{}",
        second.logs()
    );
}
