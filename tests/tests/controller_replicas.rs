//! Several replicas: two `meatspace-controller` processes on one PostgreSQL
//! database share thousands of due tasks and expire each exactly once.

mod controller_support;

use std::time::Duration;

use chrono::TimeDelta;
use meatspace_controller::metrics::TASKS_EXPIRED;
use meatspace_domain::{EventType, Policy, TaskState, clock};
use meatspace_tests::{Db, TestDb};

use controller_support::*;
use meatspace_tests::eventually;

const TASKS: usize = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_share_the_work_and_expire_each_task_once() {
    let db = TestDb::new(Db::Postgres).await;
    let store = db.store(Policy::default()).await;
    // Small batches, so both replicas come back for more many times.
    let env = [("MEATSPACE_CONTROLLER_BATCH_SIZE", "50")];
    let mut a = controller_process(&db.url, &env);
    let mut b = controller_process(&db.url, &env);
    a.ready().await;
    b.ready().await;

    // All due at the same instant, while both replicas sleep towards it.
    let deadline = clock::now() + TimeDelta::seconds(8);
    let ids = drafts_until(&store, TASKS, deadline).await;
    eventually(Duration::from_secs(60), "every task to expire", || async {
        store.next_deadline().await.unwrap().is_none().then_some(())
    })
    .await;

    let (by_a, by_b) = (
        a.counter(TASKS_EXPIRED).await,
        b.counter(TASKS_EXPIRED).await,
    );
    println!("replica a expired {by_a}, replica b expired {by_b}");
    assert_eq!(
        by_a + by_b,
        TASKS as f64,
        "each expiry is counted by exactly one replica"
    );
    assert!(
        by_a > 0.0 && by_b > 0.0,
        "both replicas should take a share: a {by_a}, b {by_b}"
    );

    let mut lags = Vec::with_capacity(TASKS);
    for id in ids {
        let (t, evs) = check_consistent(&store, id).await;
        assert_eq!(t.state, TaskState::Expired);
        assert_eq!(
            evs.len(),
            1,
            "task {id}: one event, task.expired, and no duplicate"
        );
        assert_eq!(evs[0].kind, EventType::TaskExpired);
        lags.push(ms_after(evs[0].created_at, deadline));
    }
    let (median, worst) = median_and_max(&lags);
    println!("{TASKS} tasks due at once, two replicas: lag median {median} ms, worst {worst} ms");
    assert!(
        lags.iter().all(|l| *l >= 0),
        "nothing expires before its deadline"
    );
    assert!(
        worst <= 10_000,
        "the last of {TASKS} simultaneous expiries took {worst} ms"
    );

    assert!(
        a.terminate().await,
        "replica a did not shut down cleanly:\n{}",
        a.logs()
    );
    assert!(
        b.terminate().await,
        "replica b did not shut down cleanly:\n{}",
        b.logs()
    );
}
