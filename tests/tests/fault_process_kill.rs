//! Fault: the API server and the controller killed with SIGKILL, in loops,
//! under load, on both backends (SQLite runs the controller inside the API
//! server; PostgreSQL runs it as its own process, killed in the same
//! rounds).
//!
//! Each round starts the processes, lets workers write messages and agents
//! create tasks that expire a second or two later, and kills everything
//! without warning mid-stream. At the end, with the processes running once more,
//! the promises checked are:
//!
//! - nothing acknowledged is lost: every message answered 200 is in its
//!   feed exactly once, every task whose create was answered 201 exists;
//! - feeds stay in order with no duplicate ids;
//! - every short-lived task ends expired with exactly one terminal event,
//!   and that event is its last, however often the controller died
//!   mid-sweep.
//!
//! Each round ends with a second kill aimed at the controller's sweep: the
//! round's short-lived tasks become due while nothing runs, so the next
//! controller finds them all due at once and expires them one per
//! transaction; the processes are killed as soon as the first expiry is
//! in. The test fails unless some such kill left part of the sweep undone
//! (the count is read after the kill): a kill that only ever hit an idle
//! controller, or one that had finished, tests nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use meatspace_domain::{Policy, TaskState};

use meatspace_store::Store;
use meatspace_tests::Db;
use meatspace_tests::TestDb;
use meatspace_tests::process::{Binary, ServerProcess};
use meatspace_tests::server::{ids, str_at, types};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

const ROUNDS: usize = 4;
const WRITERS: usize = 4;
/// Tasks per round that expire a second after they are created.
const SHORT_LIVED: usize = 60;
const DEV_KEY: &str = "msd_fault_test_dev_key_0123456789abcdef";

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn killing_the_processes_in_loops_loses_nothing() {
        super::killing_the_processes_in_loops_loses_nothing(super::Db::Postgres).await;
    }
}
mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn killing_the_processes_in_loops_loses_nothing() {
        super::killing_the_processes_in_loops_loses_nothing(super::Db::Sqlite).await;
    }
}

/// The processes of one round.
struct Round {
    api: ServerProcess,
    controller: Option<ServerProcess>,
}

async fn start(db: Db, url: &str) -> Round {
    let mut round = spawn(db, url);
    round.api.ready().await;
    if let Some(c) = &mut round.controller {
        c.ready().await;
    }
    round
}

/// [`start`] without waiting for readiness: the controller sweeps what is
/// due as soon as it runs, one task per transaction.
fn spawn(db: Db, url: &str) -> Round {
    let common = [
        ("DATABASE_URL", url),
        ("MEATSPACE_DEV_KEY", DEV_KEY),
        ("MEATSPACE_RATE_LIMIT_PER_SECOND", "0"),
        ("MEATSPACE_CONTROLLER_MAX_SLEEP_SECONDS", "1"),
        ("MEATSPACE_CONTROLLER_BATCH_SIZE", "1"),
        (
            "MEATSPACE_SECRET_KEY",
            "fault-test-server-key-of-at-least-32-characters",
        ),
    ];
    let api = ServerProcess::start(Binary::ApiServer, &common);
    let controller = match db {
        Db::Sqlite => None,
        Db::Postgres => Some(ServerProcess::start(Binary::Controller, &common)),
    };
    Round { api, controller }
}

impl Round {
    async fn kill(mut self) {
        // The controller first, so that it dies mid-sweep rather than idle.
        if let Some(c) = &mut self.controller {
            c.kill().await;
        }
        self.api.kill().await;
    }
}

/// One agent's or worker's credentials and what it was told.
#[derive(Debug, Default)]
struct Ledger {
    /// Acknowledged message texts per writer task.
    acked: HashMap<Uuid, Vec<String>>,
    /// Tasks whose create was answered 201, with their tokens.
    short_lived: Vec<(Uuid, String)>,
}

async fn killing_the_processes_in_loops_loses_nothing(db: Db) {
    let test_db = TestDb::new(db).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // The writers' tasks, made active in a first round.
    let first = start(db, &test_db.url).await;
    let mut writers = Vec::new();
    for i in 0..WRITERS {
        writers.push(active_task(&client, &first.api, i).await);
    }
    first.kill().await;

    // Read straight from the database: how far the expiries had got when
    // a round was killed.
    let store = test_db.store(Policy::default()).await;
    let mut ledger = Ledger::default();
    let mut n = 0;
    let mut kills_mid_sweep = 0;
    for round in 0..ROUNDS {
        let procs = start(db, &test_db.url).await;
        // Load until a few writes are in, then kill in the middle of it.
        let target = 10 + round * 5;
        let mut acked_this_round = 0;
        while acked_this_round < target * WRITERS {
            for (task, _, worker_token) in &writers {
                n += 1;
                let text = format!("r{round}-m{n}");
                let res = client
                    .post(
                        procs
                            .api
                            .url(&format!("/api/v1/worker/tasks/{task}/messages")),
                    )
                    .bearer_auth(worker_token)
                    .json(&json!({ "text": text }))
                    .send()
                    .await
                    .expect("the server is up in this round");
                assert!(
                    res.status() == StatusCode::OK,
                    "round {round}: {} {}",
                    res.status(),
                    res.text().await.unwrap_or_default()
                );
                ledger.acked.entry(*task).or_default().push(text);
                acked_this_round += 1;
            }
        }
        // Short-lived tasks, due a second after their create.
        for _ in 0..SHORT_LIVED {
            let (id, token) = create(&client, &procs.api, 1).await;
            publish(&client, &procs.api, id, &token).await;
            ledger.short_lived.push((id, token));
        }
        let this_round: Vec<Uuid> = ledger.short_lived[ledger.short_lived.len() - SHORT_LIVED..]
            .iter()
            .map(|(id, _)| *id)
            .collect();
        // Kill with requests in flight: fire some and do not wait.
        let in_flight: Vec<_> = writers
            .iter()
            .map(|(task, _, worker_token)| {
                client
                    .post(
                        procs
                            .api
                            .url(&format!("/api/v1/worker/tasks/{task}/messages")),
                    )
                    .bearer_auth(worker_token)
                    .json(&json!({ "text": format!("r{round}-unacknowledged-{task}") }))
                    .send()
            })
            .collect();
        let flying = tokio::spawn(futures::future::join_all(in_flight));
        procs.kill().await;
        // Whatever those got, a 200 would count as acknowledged.
        for (res, (task, _, _)) in flying.await.unwrap().into_iter().zip(&writers) {
            if let Ok(res) = res
                && res.status() == StatusCode::OK
            {
                ledger
                    .acked
                    .entry(*task)
                    .or_default()
                    .push(format!("r{round}-unacknowledged-{task}"));
            }
        }

        // The round's deadlines pass while nothing runs (a bounded poll of
        // the clock: the deadlines are what the test waits for) ...
        let due = store
            .tasks_by_id(&this_round)
            .await
            .expect("read the round's tasks")
            .iter()
            .map(|t| t.expires_at)
            .max()
            .expect("the round's tasks exist");
        let what = format!("round {round}: its tasks are due");
        meatspace_tests::eventually(Duration::from_secs(30), &what, || async {
            (chrono::Utc::now() > due).then_some(())
        })
        .await;
        let before = expired_count(&store, &this_round).await;
        // ... so the next controller finds those still open due at once;
        // the processes die as soon as it has expired one.
        let sweeping = spawn(db, &test_db.url);
        let what = format!("round {round}: the controller expires one of its tasks");
        meatspace_tests::eventually_every(
            Duration::from_millis(1),
            Duration::from_secs(60),
            &what,
            || async { (expired_count(&store, &this_round).await > before).then_some(()) },
        )
        .await;
        sweeping.kill().await;
        let after = expired_count(&store, &this_round).await;
        println!(
            "round {round}: {before} of its {SHORT_LIVED} short-lived tasks expired before the \
             sweep, {after} when it was killed"
        );
        if after < SHORT_LIVED {
            kills_mid_sweep += 1;
        }
    }

    assert!(
        kills_mid_sweep > 0,
        "every kill aimed at a sweep came after it had expired all of its round's tasks: \
         no kill hit a sweep under way"
    );

    // Everything running once more: the controller finishes what is due.
    let last = start(db, &test_db.url).await;
    for (task, agent_token, _) in &writers {
        let feed = feed(&client, &last.api, *task, agent_token).await;
        check_order(&feed);
        let texts = message_texts(&feed);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for t in &texts {
            *counts.entry(t).or_default() += 1;
        }
        assert!(counts.values().all(|&n| n == 1), "a message appears twice");
        for text in &ledger.acked[task] {
            assert_eq!(
                counts.get(text.as_str()),
                Some(&1),
                "acknowledged message {text} is missing"
            );
        }
    }
    assert_eq!(ledger.short_lived.len(), ROUNDS * SHORT_LIVED);
    for (id, token) in &ledger.short_lived {
        let what = format!("task {id} expires");
        let feed = meatspace_tests::eventually(Duration::from_secs(60), &what, || async {
            let feed = feed(&client, &last.api, *id, token).await;
            feed.last()
                .is_some_and(|e| e["type"] == "task.expired")
                .then_some(feed)
        })
        .await;
        check_order(&feed);
        let terminal = types(&feed)
            .iter()
            .filter(|t| {
                matches!(
                    **t,
                    "task.completed" | "task.stopped" | "task.cancelled" | "task.expired"
                )
            })
            .count();
        assert_eq!(terminal, 1, "task {id}: {:?}", types(&feed));
    }
    last.kill().await;
}

/// How many of the tasks are expired in the database (one read).
async fn expired_count(store: &Arc<dyn Store>, tasks: &[Uuid]) -> usize {
    store
        .tasks_by_id(tasks)
        .await
        .expect("read the tasks")
        .iter()
        .filter(|t| t.state == TaskState::Expired)
        .count()
}

fn check_order(feed: &[Value]) {
    let event_ids = ids(feed);
    assert!(
        event_ids.windows(2).all(|w| w[0] < w[1]),
        "feed out of order or duplicated: {event_ids:?}"
    );
}

fn message_texts(feed: &[Value]) -> Vec<&str> {
    feed.iter()
        .filter(|e| e["type"] == "worker.message")
        .map(|e| e["data"]["text"].as_str().expect("text"))
        .collect()
}

async fn create(client: &reqwest::Client, api: &ServerProcess, lifetime: u32) -> (Uuid, String) {
    let res = client
        .post(api.url("/api/v1/tasks"))
        .header("x-meatspace-dev-key", DEV_KEY)
        .json(&json!({ "description": "short-lived", "expires_in_seconds": lifetime }))
        .send()
        .await
        .expect("create");
    assert_eq!(res.status(), StatusCode::CREATED);
    let body: Value = res.json().await.unwrap();
    (
        str_at(&body, "/task/id").parse().unwrap(),
        str_at(&body, "/agent_token"),
    )
}

async fn publish(client: &reqwest::Client, api: &ServerProcess, id: Uuid, token: &str) {
    let res = client
        .post(api.url(&format!("/api/v1/tasks/{id}/publish")))
        .bearer_auth(token)
        .send()
        .await
        .expect("publish");
    // The task may already have expired: its lifetime is one second.
    assert!(
        matches!(res.status(), StatusCode::OK | StatusCode::CONFLICT),
        "{}",
        res.status()
    );
}

/// A task a new worker claimed and started; (task, agent token, worker token).
async fn active_task(
    client: &reqwest::Client,
    api: &ServerProcess,
    i: usize,
) -> (Uuid, String, String) {
    let (id, token) = create(client, api, 3600).await;
    publish(client, api, id, &token).await;
    let res = client
        .post(api.url("/api/v1/workers"))
        .header("x-meatspace-dev-key", DEV_KEY)
        .json(&json!({ "name": format!("writer {i}") }))
        .send()
        .await
        .unwrap();
    let body: Value = res.json().await.unwrap();
    let worker_token = str_at(&body, "/worker_token");
    for action in ["claim", "start"] {
        let res = client
            .post(api.url(&format!("/api/v1/worker/tasks/{id}/{action}")))
            .bearer_auth(&worker_token)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{action}");
    }
    (id, token, worker_token)
}

/// The whole feed, walked with the cursor as an agent does.
async fn feed(client: &reqwest::Client, api: &ServerProcess, id: Uuid, token: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page: Value = client
            .get(api.url(&format!(
                "/api/v1/tasks/{id}/events?after={after}&limit=1000"
            )))
            .bearer_auth(token)
            .send()
            .await
            .expect("read the feed")
            .json()
            .await
            .expect("a page");
        let batch = page["events"].as_array().expect("events").clone();
        after = page["next_cursor"].as_i64().expect("cursor");
        let more = page["has_more"].as_bool().expect("has_more");
        events.extend(batch);
        if !more {
            return events;
        }
    }
}
