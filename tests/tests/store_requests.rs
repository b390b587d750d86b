//! The store's record of tasks requested from Kubernetes, on both backends:
//! however many writers race with the same resource UID, exactly one task
//! is created and every writer is told which; the record outlives the task.

mod controller_support;

use chrono::TimeDelta;
use meatspace_domain::{Policy, clock};
use meatspace_store::token::TokenHash;
use meatspace_store::{NewTask, requests::TaskRequest};
use meatspace_tests::{Db, TestDb};
use uuid::Uuid;

on_both_backends!(racing_writers_create_one_task_per_resource_uid);

async fn racing_writers_create_one_task_per_resource_uid(db: Db) {
    let db = TestDb::new(db).await;
    let store = db.store(Policy::default()).await;
    let uid = Uuid::new_v4().to_string();
    let attempt = |store: std::sync::Arc<dyn meatspace_store::Store>, uid: String| async move {
        let now = clock::now();
        let id = Uuid::new_v4();
        let request = TaskRequest {
            resource_uid: uid,
            task_id: id,
            namespace: "agents".into(),
            name: "fetch-milk".into(),
            created_at: now,
        };
        let new = NewTask::development(
            id,
            "Buy milk.",
            TokenHash::of(&id.to_string()),
            now,
            now + TimeDelta::hours(1),
        );
        let row = store
            .create_requested_task(new, &request)
            .await
            .expect("create");
        (id, row.task_id)
    };
    let results = futures::future::join_all(
        (0..8).map(|_| tokio::spawn(attempt(store.clone(), uid.clone()))),
    )
    .await;
    let results: Vec<(Uuid, Uuid)> = results.into_iter().map(|r| r.unwrap()).collect();
    let winner = results[0].1;
    assert!(results.iter().all(|(_, got)| *got == winner), "{results:?}");
    assert_eq!(
        results.iter().filter(|(mine, got)| mine == got).count(),
        1,
        "exactly one writer created the task: {results:?}"
    );
    assert!(store.task(winner).await.unwrap().is_some());
    for (mine, _) in &results {
        if *mine != winner {
            assert!(store.task(*mine).await.unwrap().is_none(), "no second task");
        }
    }
    let row = store.task_request(&uid).await.unwrap().expect("the row");
    assert_eq!(row.task_id, winner);
    assert_eq!(
        (row.namespace.as_str(), row.name.as_str()),
        ("agents", "fetch-milk")
    );
    assert!(store.task_request("no-such-uid").await.unwrap().is_none());
    let stranger = Uuid::new_v4();
    assert_eq!(
        store.requested_among(&[winner, stranger]).await.unwrap(),
        vec![winner]
    );
    assert!(store.requested_among(&[]).await.unwrap().is_empty());
}
