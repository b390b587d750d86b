//! Racing clients over HTTP: one winner per claim, one terminal state and
//! one terminal event per task, and a feed that a poller following
//! `after=<last id>` reads completely while writers commit concurrently.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::TimeDelta;
use futures::future::join_all;
use meatspace_tests::Db;
use meatspace_tests::prometheus::counter;
use meatspace_tests::server::{ActiveTask, Expect, TestServer, ids, types, worker_path};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

meatspace_tests::api_tests!(
    twenty_workers_race_to_claim_one_task,
    racing_endings_leave_one_terminal_state_and_event,
    every_answer_to_waiting_submissions_raced_gives_one_end_each,
    pollers_see_every_committed_event_in_order,
    an_empty_poll_never_hides_an_acknowledged_write,
    an_empty_poll_answered_from_memory_still_checks_the_token,
);

const TERMINAL_EVENTS: [&str; 4] = [
    "task.completed",
    "task.stopped",
    "task.cancelled",
    "task.expired",
];

/// How long a loop that waits for the others may wait before it fails
/// (instead of hanging the test run).
const PATIENCE: Duration = Duration::from_secs(120);

async fn twenty_workers_race_to_claim_one_task(db: Db) {
    let srv = &TestServer::start(db).await;
    let workers =
        join_all((0..20).map(|i| async move { srv.register_worker(&format!("racer {i}")).await }))
            .await;
    for round in 0..3 {
        let (id, token) = srv.create_open_task(&format!("Prize {round}")).await;
        let answers = join_all(workers.iter().map(|(worker_id, worker_token)| async {
            let res = srv
                .worker(worker_token)
                .post(&worker_path(id, "/claim"))
                .send()
                .await
                .unwrap();
            let status = res.status();
            let body: Value = res.json().await.unwrap();
            (*worker_id, status, body)
        }))
        .await;
        let winners: Vec<Uuid> = answers
            .iter()
            .filter(|(_, status, _)| *status == StatusCode::OK)
            .map(|(worker, _, _)| *worker)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {answers:?}");
        // For the losers the task is no longer open: like any task that is
        // not theirs, it does not exist for them.
        for (_, status, body) in &answers {
            if *status != StatusCode::OK {
                assert_eq!(*status, StatusCode::NOT_FOUND, "{body}");
                assert!(body.get("task_state").is_none(), "{body}");
            }
        }
        let task = srv.task(id, &token).await;
        assert_eq!(task["worker_id"], winners[0].to_string());
        let feed = srv.feed(id, &token).await;
        assert_eq!(types(&feed), ["task.published", "task.assigned"]);
        assert_eq!(feed[1]["data"]["worker_id"], winners[0].to_string());
    }
}

/// Rounds of [`RACES`] races at most, until each side has won one.
const MAX_ROUNDS: usize = 10;
const RACES: usize = 16;

async fn racing_endings_leave_one_terminal_state_and_event(db: Db) {
    let srv = &TestServer::start(db).await;
    let (mut worker_wins, mut agent_wins) = (0, 0);
    let mut rounds = 0;
    // A race one side always wins would make this test weaker than it
    // looks: more rounds until each side has won at least once (and, on
    // PostgreSQL, until racing writes were grouped).
    while rounds < MAX_ROUNDS
        && (worker_wins == 0 || agent_wins == 0 || !commands_grouped(srv, db).await)
    {
        rounds += 1;
        let tasks = join_all(
            (0..RACES).map(|i| async move { srv.active_task(&format!("Contested {i}")).await }),
        )
        .await;
        let races = tasks.iter().enumerate().map(|(i, t)| {
            let ending = if i % 2 == 0 { "/complete" } else { "/stop" };
            async move {
                let worker = srv
                    .worker(&t.worker_token)
                    .post(&worker_path(t.task_id, ending))
                    .send();
                let agent = srv
                    .agent(&t.agent_token)
                    .post(&format!("/api/v1/tasks/{}/cancel", t.task_id))
                    .send();
                // Either side's request goes out first in half the races.
                let (worker, agent) = if i % 4 < 2 {
                    tokio::join!(worker, agent)
                } else {
                    let (agent, worker) = tokio::join!(agent, worker);
                    (worker, agent)
                };
                let (worker, agent) = (worker.unwrap(), agent.unwrap());
                let statuses = (worker.status(), agent.status());
                let bodies: (Value, Value) =
                    (worker.json().await.unwrap(), agent.json().await.unwrap());
                (t, ending, statuses, bodies)
            }
        });
        for (t, ending, (worker_status, agent_status), (worker_body, agent_body)) in
            join_all(races).await
        {
            let (winner_state, loser) = match (worker_status, agent_status) {
                (StatusCode::OK, StatusCode::CONFLICT) => {
                    worker_wins += 1;
                    let state = if ending == "/complete" {
                        "completed"
                    } else {
                        "stopped"
                    };
                    (state, agent_body)
                }
                (StatusCode::CONFLICT, StatusCode::OK) => {
                    agent_wins += 1;
                    ("cancelled", worker_body)
                }
                other => {
                    panic!("exactly one ending must win: {other:?} {worker_body} {agent_body}")
                }
            };
            assert_eq!(loser["task_state"], winner_state, "{loser}");
            assert_terminal_once(srv, t, winner_state).await;
        }
    }
    println!(
        "{} races: the worker won {worker_wins}, the agent {agent_wins}",
        rounds * RACES
    );
    assert!(
        worker_wins > 0 && agent_wins > 0,
        "one side won all {} races: nothing was raced",
        rounds * RACES
    );
    if db == Db::Postgres {
        assert_commands_grouped(srv).await;
    }
}

/// Submissions waiting for review on many tasks at once, each raced by
/// everything that can end it: the agent's accept and reject, the worker's
/// stop, the agent's cancel and, every other round (the auto-accept time
/// passed), the controller's reconcile. Exactly one of them wins per task,
/// and the task ends once, in the winner's state.
async fn every_answer_to_waiting_submissions_raced_gives_one_end_each(db: Db) {
    let srv = &TestServer::start(db).await;
    let mut wins: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rounds = 0;
    // More rounds until two different answers have won, and the controller
    // has raced at least once: a race one side always wins tests little.
    while rounds < MAX_ROUNDS && (rounds < 2 || wins.len() < 2) {
        let round = rounds;
        rounds += 1;
        let tasks = join_all((0..RACES).map(|i| async move {
            let t = srv
                .active_task_with(json!({
                    "description": format!("Reviewed {i}"),
                    "review": { "auto_accept_seconds": 60 },
                }))
                .await;
            let submitted = srv
                .worker_post(t.task_id, &t.worker_token, "complete")
                .await;
            assert_eq!(submitted["task"]["review"]["state"], "submitted");
            t
        }))
        .await;
        let due = round % 2 == 1;
        if due {
            srv.advance_clock(TimeDelta::seconds(61));
        }
        let status = |req: RequestBuilder| async move { req.send().await.unwrap().status() };
        let races = tasks.iter().map(|t| async move {
            let review = |body: Value| {
                srv.agent(&t.agent_token)
                    .post(&format!("/api/v1/tasks/{}/review", t.task_id))
                    .json(&body)
            };
            let (accept, reject, stop, cancel) = tokio::join!(
                status(review(json!({ "action": "accept" }))),
                status(review(json!({ "action": "reject", "text": "blurry" }))),
                status(
                    srv.worker(&t.worker_token)
                        .post(&worker_path(t.task_id, "/stop"))
                ),
                status(
                    srv.agent(&t.agent_token)
                        .post(&format!("/api/v1/tasks/{}/cancel", t.task_id))
                ),
            );
            (t, [accept, reject, stop, cancel])
        });
        let (answers, reconciled) = tokio::join!(
            join_all(races),
            srv.store.reconcile_due(srv.now(), 10 * RACES as u32)
        );
        let reconciled: HashSet<Uuid> = reconciled
            .expect("reconcile")
            .iter()
            .map(|a| a.task.id)
            .collect();
        if !due {
            assert!(reconciled.is_empty(), "nothing was due yet");
        }
        for (t, statuses) in answers {
            let won: Vec<(&str, &str)> = ["accept", "reject", "stop", "cancel"]
                .into_iter()
                .zip(["completed", "cancelled", "stopped", "cancelled"])
                .zip(statuses)
                .filter(|(_, s)| *s == StatusCode::OK)
                .map(|(w, _)| w)
                .chain(
                    reconciled
                        .contains(&t.task_id)
                        .then_some(("auto-accept", "completed")),
                )
                .collect();
            for s in statuses {
                assert!(s == StatusCode::OK || s == StatusCode::CONFLICT, "{s}");
            }
            assert_eq!(won.len(), 1, "round {round}: one winner, not {won:?}");
            let (winner, state) = won[0];
            *wins.entry(winner).or_default() += 1;
            assert_terminal_once(srv, t, state).await;
        }
    }
    println!("{} raced submissions ended by: {wins:?}", rounds * RACES);
    assert!(wins.len() >= 2, "one answer won every race: {wins:?}");
}

/// Whether PostgreSQL has written commands in groups so far (SQLite: true,
/// it groups in its own way, tested in store-sqlite's group_commit).
async fn commands_grouped(srv: &TestServer, db: Db) -> bool {
    if db != Db::Postgres {
        return true;
    }
    let text = srv.metrics().send().await.unwrap().text().await.unwrap();
    counter(
        &text,
        "meatspace_pg_write_groups_total",
        &[("kind", "command")],
    ) >= 1.0
}

/// On PostgreSQL, concurrent commands' writes share statements: the races
/// above made groups of two or more, and no group was written again one
/// write at a time (a grouped statement that fails for any reason would be,
/// and every answer would still look right). The counters are the
/// process's, so other tests' writes add to them too; none of this suite's
/// provokes a fallback.
async fn assert_commands_grouped(srv: &TestServer) {
    let text = srv.metrics().send().await.unwrap().text().await.unwrap();
    let command = [("kind", "command")];
    let groups = counter(&text, "meatspace_pg_write_groups_total", &command);
    let grouped = counter(&text, "meatspace_pg_grouped_writes_total", &command);
    let fallbacks = counter(&text, "meatspace_pg_write_group_fallbacks_total", &[]);
    println!(
        "PostgreSQL: {groups} groups of commands held {grouped} writes; {fallbacks} fallbacks"
    );
    assert!(
        groups >= 1.0 && grouped >= 2.0 * groups,
        "racing commands were never written together: {groups} groups, {grouped} writes"
    );
    assert_eq!(
        fallbacks, 0.0,
        "a group was written again one write at a time"
    );
}

/// The task is in `state`, and its feed ends with the one terminal event
/// that says so.
async fn assert_terminal_once(srv: &TestServer, t: &ActiveTask, state: &str) {
    assert_eq!(srv.task(t.task_id, &t.agent_token).await["state"], state);
    let feed = srv.feed(t.task_id, &t.agent_token).await;
    let terminal: Vec<&Value> = feed
        .iter()
        .filter(|e| TERMINAL_EVENTS.contains(&e["type"].as_str().unwrap()))
        .collect();
    assert_eq!(terminal.len(), 1, "{feed:?}");
    assert_eq!(terminal[0]["type"], format!("task.{state}"));
    assert_eq!(feed.last(), Some(terminal[0]), "nothing follows the end");
}

/// Follows a task's feed as an agent does, with varying page sizes, until
/// the task is terminal and the feed is drained.
async fn follow(srv: &TestServer, task_id: Uuid, token: &str) -> Vec<Value> {
    let mut delivered = Vec::new();
    let mut after = 0;
    let mut limit = 1;
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        assert!(
            tokio::time::Instant::now() < give_up,
            "task {task_id}: the feed was not terminal and drained after {PATIENCE:?} \
             ({} events read, cursor {after})",
            delivered.len()
        );
        let page = srv.events_page(task_id, token, after, limit).await;
        let events = page["events"].as_array().unwrap();
        delivered.extend(events.iter().cloned());
        after = page["next_cursor"].as_i64().unwrap();
        if page["terminal"] == true && page["has_more"] == false {
            return delivered;
        }
        limit = limit % 7 + 1;
        if events.is_empty() {
            // The interval of a bounded poll (an empty page: nothing new yet).
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Posts messages until `count` are sent or the task has ended; returns
/// the texts that were accepted.
async fn write_messages(
    srv: &TestServer,
    t: &ActiveTask,
    writer: usize,
    count: usize,
) -> Vec<String> {
    let mut sent = Vec::new();
    for i in 0..count {
        let text = format!("writer {writer} message {i}");
        let res = srv
            .worker(&t.worker_token)
            .post(&worker_path(t.task_id, "/messages"))
            .json(&json!({ "text": text }))
            .send()
            .await
            .unwrap();
        match res.status() {
            StatusCode::OK => sent.push(text),
            StatusCode::CONFLICT => break,
            other => panic!(
                "message {i} of writer {writer}: {other} {}",
                res.text().await.unwrap()
            ),
        }
    }
    sent
}

async fn pollers_see_every_committed_event_in_order(db: Db) {
    let srv = &TestServer::start(db).await;
    let tasks =
        join_all((0..4).map(|i| async move { srv.active_task(&format!("Chatty {i}")).await }))
            .await;
    let runs = tasks.iter().enumerate().map(|(n, t)| {
        async move {
            // Half the tasks end while the writers are still going: the
            // agent cancels mid-stream and the writers stop at the first
            // refusal. The others complete after the last message.
            let cancel_midway = n % 2 == 1;
            let per_writer = if cancel_midway { 500 } else { 15 };
            let writers = async {
                let sent = join_all((0..3).map(|w| write_messages(srv, t, w, per_writer))).await;
                sent.concat()
            };
            let ender = async {
                if cancel_midway {
                    let what = format!("the writers of task {} get 20 messages in", t.task_id);
                    meatspace_tests::eventually_every(
                        Duration::from_millis(2),
                        PATIENCE,
                        &what,
                        || async {
                            let events = srv.store.events(t.task_id, 0, 100).await.unwrap();
                            (events.len() >= 23).then_some(())
                        },
                    )
                    .await;
                    srv.agent_post(t.task_id, &t.agent_token, "cancel").await;
                }
            };
            let poller = follow(srv, t.task_id, &t.agent_token);
            let ((sent, ()), delivered) = tokio::join!(
                async {
                    let (sent, ()) = tokio::join!(writers, ender);
                    if !cancel_midway {
                        srv.worker_post(t.task_id, &t.worker_token, "complete")
                            .await;
                    }
                    (sent, ())
                },
                poller
            );
            (t, sent, delivered)
        }
    });
    for (t, sent, delivered) in join_all(runs).await {
        let committed = srv
            .store
            .events(t.task_id, 0, 100_000)
            .await
            .expect("read the committed feed");
        let committed_ids: Vec<i64> = committed.iter().map(|e| e.id).collect();
        let delivered_ids = ids(&delivered);
        assert_eq!(
            delivered_ids, committed_ids,
            "the poller missed, repeated or reordered events"
        );
        assert!(delivered_ids.windows(2).all(|w| w[0] < w[1]));
        // Every accepted message is in the feed exactly once.
        let texts: Vec<&str> = delivered
            .iter()
            .filter(|e| e["type"] == "worker.message")
            .map(|e| e["data"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), sent.len());
        let texts: HashSet<&str> = texts.into_iter().collect();
        assert_eq!(texts, sent.iter().map(String::as_str).collect());
        let terminal: Vec<&str> = types(&delivered)
            .into_iter()
            .filter(|k| TERMINAL_EVENTS.contains(k))
            .collect();
        assert_eq!(terminal.len(), 1, "{terminal:?}");
        assert_eq!(types(&delivered).last(), terminal.first());
        assert!(sent.len() >= 20, "only {} messages were sent", sent.len());
    }
}

/// The server answers an empty poll of a task it knows from memory (see
/// `meatspace_api::feed_heads`). That knowledge must never be older than a write
/// the server acknowledged: a message answered 200, a write through the
/// server's own store (the embedded controller's path) and, as soon as the
/// notification arrives, a write by another process (a second store on the
/// same database).
async fn an_empty_poll_never_hides_an_acknowledged_write(db: Db) {
    let server = TestServer::start(db).await;
    let srv = &server;
    let t = srv.active_task("Watched closely").await;
    let agent = srv.agent(&t.agent_token);
    let poll = |after: i64| {
        let path = format!("/api/v1/tasks/{}/events?after={after}", t.task_id);
        async move { agent.get_json(&path).await }
    };
    let mut after = poll(0).await["next_cursor"].as_i64().unwrap();
    for i in 0..100 {
        // Twice empty: the second is answered from memory when it can be.
        for _ in 0..2 {
            let page = poll(after).await;
            assert_eq!(page["events"], json!([]), "round {i}");
            assert_eq!(page["next_cursor"], after);
        }
        let sent = if i % 2 == 0 {
            srv.message(t.task_id, &t.worker_token, &format!("message {i}"))
                .await["events"][0]["id"]
                .as_i64()
                .unwrap()
        } else {
            let command = meatspace_domain::Command::Message {
                worker: t.worker_id,
                text: format!("message {i}"),
            };
            srv.store
                .apply(t.task_id, command, meatspace_domain::clock::now())
                .await
                .expect("a message through the server's store")
                .events[0]
                .id
        };
        let page = poll(after).await;
        assert_eq!(
            ids(page["events"].as_array().unwrap()),
            [sent],
            "round {i}: the poll after an acknowledged write missed it"
        );
        after = sent;
    }

    // Another process: its change reaches this server as a notification
    // (PostgreSQL) — the poll shows it once that has arrived. SQLite has no
    // notifications between processes; the server's memory is trusted for
    // at most a second there.
    let other = srv.db.store(meatspace_domain::Policy::default()).await;
    let page = poll(after).await;
    assert_eq!(page["events"], json!([]));
    let command = meatspace_domain::Command::Message {
        worker: t.worker_id,
        text: "from elsewhere".into(),
    };
    let sent = other
        .apply(t.task_id, command, meatspace_domain::clock::now())
        .await
        .expect("a message from another store")
        .events[0]
        .id;
    let events = meatspace_tests::eventually(
        Duration::from_secs(10),
        "another process's event",
        || async {
            let page = poll(after).await;
            let events = page["events"].as_array().unwrap().clone();
            if events.is_empty() {
                assert_eq!(
                    page["next_cursor"], after,
                    "an empty page never moves the cursor"
                );
                return None;
            }
            Some(events)
        },
    )
    .await;
    assert_eq!(ids(&events), [sent]);
    server.stop().await;
}

/// A feed head known to the server does not let a wrong token in, nor
/// another task's token (401 and 404, as from the database).
async fn an_empty_poll_answered_from_memory_still_checks_the_token(db: Db) {
    let server = TestServer::start(db).await;
    let srv = &server;
    let t = srv.active_task("Guarded").await;
    let (other, other_token) = srv.create_open_task("Another").await;
    let path = format!("/api/v1/tasks/{}/events?after=1000000", t.task_id);
    for _ in 0..3 {
        srv.agent(&t.agent_token).get_json(&path).await;
    }
    let forged = format!("mst_{}_{}", t.task_id.simple(), "x".repeat(43));
    let other_path = format!("/api/v1/tasks/{other}/events?after=1000000");
    let bad_limit = format!("{path}&limit=0");
    for (token, path, status) in [
        (&forged, &path, StatusCode::UNAUTHORIZED),
        (&other_token, &path, StatusCode::NOT_FOUND),
        (&t.agent_token, &other_path, StatusCode::NOT_FOUND),
        (&forged, &bad_limit, StatusCode::UNAUTHORIZED),
        (&t.agent_token, &bad_limit, StatusCode::BAD_REQUEST),
    ] {
        srv.agent(token).get(path).expect_problem(status).await;
    }
    server.stop().await;
}
