//! Retention against both real backends: terminal tasks older than the
//! retention period go, with their events, issues and photos; every other
//! task (live, or terminal for less than the period) stays untouched.

mod controller_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use meatspace_controller::ControllerConfig;
use meatspace_domain::{Command, IssueKind, NewPhoto, Policy, TaskState};
use meatspace_store::Store;
use meatspace_tests::{Db, TestDb};
use uuid::Uuid;

use controller_support::*;
use meatspace_tests::eventually;

on_both_backends!(retention_removes_old_terminal_tasks_and_nothing_else);

/// Worker `worker` sends a tiny photo on task `task`; returns its id.
async fn send_photo(store: &Arc<dyn Store>, task: Uuid, worker: Uuid) -> Uuid {
    let photo = NewPhoto {
        id: Uuid::new_v4(),
        content_type: "image/png".into(),
        width: 1,
        height: 1,
        bytes: vec![0x89, b'P', b'N', b'G'],
    };
    let id = photo.id;
    apply(
        store,
        task,
        Command::Photo {
            worker,
            photo,
            position: None,
        },
    )
    .await;
    id
}

async fn retention_removes_old_terminal_tasks_and_nothing_else(db: Db) {
    let db = TestDb::new(db).await;
    let store = db.store(Policy::default()).await;
    let w = worker(&store).await;
    let long = TimeDelta::days(365);

    // Terminal for 31 days: completed with a photo, messages and an issue;
    // stopped; and a backlog of cancelled drafts larger than a batch.
    let completed = active(&store, long, w).await;
    let photo_id = send_photo(&store, completed.id, w).await;
    apply(
        &store,
        completed.id,
        Command::RaiseIssue {
            worker: w,
            kind: IssueKind::Other,
            text: "?".into(),
        },
    )
    .await;
    apply(
        &store,
        completed.id,
        Command::Complete {
            worker: w,
            note: None,
            result: None,
        },
    )
    .await;
    let stopped = open(&store, long).await;
    apply(&store, stopped.id, Command::Claim { worker: w }).await;
    apply(
        &store,
        stopped.id,
        Command::Stop {
            worker: w,
            reason: None,
        },
    )
    .await;
    let mut old = vec![completed.id, stopped.id];
    for _ in 0..25 {
        let t = draft(&store, long).await;
        apply(&store, t.id, Command::Cancel { reason: None }).await;
        old.push(t.id);
    }
    for id in &old {
        age(&db.url, *id, 31).await;
    }

    // Must stay: terminal for 29 days, terminal just now, and live tasks
    // created long ago, one of them active with an open issue and a photo.
    let recent_end = draft(&store, long).await;
    apply(&store, recent_end.id, Command::Cancel { reason: None }).await;
    age(&db.url, recent_end.id, 29).await;
    let just_ended = open(&store, long).await;
    apply(&store, just_ended.id, Command::Cancel { reason: None }).await;
    let live_open = open(&store, long).await;
    age(&db.url, live_open.id, 60).await;
    let live_active = active(&store, long, w).await;
    apply(
        &store,
        live_active.id,
        Command::RaiseIssue {
            worker: w,
            kind: IssueKind::NeedsMoreTime,
            text: "…".into(),
        },
    )
    .await;
    let live_photo_id = send_photo(&store, live_active.id, w).await;
    age(&db.url, live_active.id, 60).await;
    let kept = [recent_end.id, just_ended.id, live_open.id, live_active.id];
    let mut before = HashMap::new();
    for id in kept {
        before.insert(
            id,
            (
                task(&store, id).await,
                events(&store, id).await,
                store.issues(id).await.unwrap(),
            ),
        );
    }

    // The default retention (30 days), in batches of 10.
    let config = ControllerConfig {
        batch_size: 10,
        ..config()
    };
    assert_eq!(config.retention, TimeDelta::days(30));
    let controller = InProcess::start(&store, config);
    for id in &old {
        eventually(
            Duration::from_secs(10),
            "old terminal tasks to be deleted",
            || async { store.task(*id).await.unwrap().is_none().then_some(()) },
        )
        .await;
    }
    controller.stop().await;

    for id in &old {
        assert!(
            events(&store, *id).await.is_empty(),
            "events of {id} remain"
        );
        assert!(
            store.issues(*id).await.unwrap().is_empty(),
            "issues of {id} remain"
        );
        // Only a tombstone stays: the task is gone, its token digest is
        // kept so the agent is told 404 rather than 401.
        assert!(
            store.task(*id).await.unwrap().is_none(),
            "the task {id} remains"
        );
    }
    assert!(
        store.photo(completed.id, photo_id).await.unwrap().is_none(),
        "the photo remains"
    );

    for id in kept {
        let (t, evs) = check_consistent(&store, id).await;
        let (t0, evs0, issues0) = &before[&id];
        assert_eq!((&t, &evs), (t0, evs0), "task {id} changed");
        assert_eq!(&store.issues(id).await.unwrap(), issues0);
    }
    assert_eq!(task(&store, live_active.id).await.state, TaskState::Active);
    assert!(
        store
            .photo(live_active.id, live_photo_id)
            .await
            .unwrap()
            .is_some(),
        "a live task's photo was deleted"
    );
}
