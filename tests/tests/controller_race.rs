//! Workers and agents racing the controller at the deadline, against both
//! real backends: whoever commits first wins and every other actor gets a
//! clean refusal, so each task ends with exactly one terminal event.

mod controller_support;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use meatspace_domain::{Command, Policy, TaskState, clock};
use meatspace_tests::{Db, TestDb};

use controller_support::*;
use meatspace_tests::eventually;

on_both_backends!(racing_the_deadline_ends_each_task_exactly_once);

const TASKS: usize = 100;

async fn racing_the_deadline_ends_each_task_exactly_once(backend: Db) {
    let db = TestDb::new(backend).await;
    let policy = Policy {
        active_time_limit: TimeDelta::seconds(2),
        ..Policy::default()
    };
    let store = db.store(policy).await;
    let w = worker(&store).await;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        tasks.push(active(&store, TimeDelta::hours(1), w).await);
    }
    let controller = InProcess::start(&store, config());

    // For every task: the worker's completion was stamped a millisecond
    // before the active time limit (the moment the API received it) but
    // reaches the database a few milliseconds after it, when the controller
    // is expiring the task; and the agent cancels or the worker stops right
    // at the deadline, which both are allowed to do past it.
    let mut racers = tokio::task::JoinSet::new();
    for (i, t) in tasks.iter().enumerate() {
        let deadline = t.active_until.expect("active");
        let second = match i % 3 {
            0 => Command::Cancel {
                reason: Some("changed my mind".into()),
            },
            1 => Command::Stop {
                worker: w,
                reason: Some("it started raining".into()),
            },
            _ => Command::Complete {
                worker: w,
                note: Some("late".into()),
                result: None,
            },
        };
        let complete = Command::Complete {
            worker: w,
            note: Some("done".into()),
            result: None,
        };
        let jitter = TimeDelta::milliseconds((i % 10) as i64 * 2);
        for (command, at, stamped) in [
            (
                complete,
                deadline + jitter,
                Some(deadline - TimeDelta::milliseconds(1)),
            ),
            (second, deadline + jitter, None),
        ] {
            let (store, id) = (store.clone(), t.id);
            racers.spawn(async move {
                let wait = (at - Utc::now()).to_std().unwrap_or_default();
                // Real time is the behaviour: each racer acts at its instant,
                // against the controller acting at the deadline.
                tokio::time::sleep(wait).await;
                let name = command.name();
                let now = stamped.unwrap_or_else(clock::now);
                let outcome = store.apply(id, command, now).await;
                (id, name, outcome)
            });
        }
    }
    let mut winners: BTreeMap<uuid::Uuid, Vec<&'static str>> = BTreeMap::new();
    while let Some(joined) = racers.join_next().await {
        let (id, name, outcome) = joined.expect("racer");
        match outcome {
            Ok(a) => {
                assert!(a.task.state.is_terminal(), "{name} of {id} did not end it");
                winners.entry(id).or_default().push(name);
            }
            Err(e) => assert!(is_clean_loss(&e), "{name} of {id} failed uncleanly: {e}"),
        }
    }

    // Tasks nobody else ended are the controller's.
    for t in &tasks {
        eventually(Duration::from_secs(5), "every task to end", || async {
            task(&store, t.id).await.state.is_terminal().then_some(())
        })
        .await;
    }
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &tasks {
        let (t, _) = check_consistent(&store, t.id).await;
        let won = winners.get(&t.id).map_or(0, Vec::len);
        match t.state {
            TaskState::Expired => assert_eq!(
                won, 0,
                "task {} expired, yet a racer's change also committed",
                t.id
            ),
            _ => assert_eq!(
                won, 1,
                "task {} is {} with {won} winning racers",
                t.id, t.state
            ),
        }
        *outcomes.entry(t.state.as_str()).or_default() += 1;
    }
    println!("{backend:?}: outcomes of {TASKS} races: {outcomes:?}");
    // Otherwise nothing raced and the test proved nothing.
    assert!(
        outcomes.contains_key("expired") && outcomes.len() > 1,
        "the controller and the racers should each win some races: {outcomes:?}"
    );
    controller.stop().await;
}
