//! Long polls of the event feed (`GET …/events?after=N&wait=S`): a waiting
//! request answers as soon as another request appends an event, not
//! before; it times out empty on an idle task and does not wait at all on a
//! terminal one; other tasks' events do not end it; every concurrent waiter
//! sees the event; and shutting the server down answers waiting requests at
//! once instead of hanging.

use std::time::{Duration, Instant};

use meatspace_tests::Db;
use meatspace_tests::server::{Expect, TestServer, types};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

meatspace_tests::api_tests!(
    a_waiting_poll_answers_with_the_event_another_request_appends,
    a_waiting_worker_poll_answers_with_the_agents_response,
    a_wait_on_an_idle_task_times_out_empty,
    a_wait_on_a_terminal_task_answers_at_once,
    wait_outside_0_to_30_is_a_bad_request,
    another_tasks_events_do_not_end_a_wait,
    concurrent_waiters_all_see_the_event,
    http2_waiters_multiplexed_on_a_client_all_see_the_event,
    shutdown_answers_waiting_polls_at_once,
);

const OK: StatusCode = StatusCode::OK;
/// The wait of a poll that must be woken: far longer than a wake-up takes,
/// so a poll that answers with the event was woken by it (one that missed
/// its wake-up would answer empty at the end of its wait).
const LONG: u32 = 25;
/// Bound on "at once": generous for a busy 2-core machine, far below the
/// waits it is compared with, so it tells waiting from not waiting.
const AT_ONCE: Duration = Duration::from_secs(10);

fn events_path(id: Uuid, after: i64, wait: u32) -> String {
    format!("/api/v1/tasks/{id}/events?after={after}&wait={wait}")
}

fn worker_events_path(id: Uuid, after: i64, wait: u32) -> String {
    format!("/api/v1/worker/tasks/{id}/events?after={after}&wait={wait}")
}

fn message_path(id: Uuid) -> String {
    format!("/api/v1/worker/tasks/{id}/messages")
}

/// The id of the last event of a task's feed (the cursor a poller holds).
async fn cursor(srv: &TestServer, id: Uuid, agent_token: &str) -> i64 {
    let feed = srv.feed(id, agent_token).await;
    feed.last()
        .map_or(0, |e| e["id"].as_i64().expect("event id"))
}

/// Sends `req` in its own task; resolves to the page and when it arrived.
fn poll(req: RequestBuilder) -> tokio::task::JoinHandle<(Value, Instant)> {
    tokio::spawn(async move {
        let page = req.expect_json(OK).await;
        (page, Instant::now())
    })
}

/// Posts a worker message; returns the appended event's id and when the
/// append was answered.
async fn append_message(
    srv: &TestServer,
    id: Uuid,
    worker_token: &str,
    text: &str,
) -> (i64, Instant) {
    let change = srv
        .worker(worker_token)
        .post_json(&message_path(id), &json!({ "text": text }))
        .await;
    let event_id = change["events"][0]["id"].as_i64().expect("event id");
    (event_id, Instant::now())
}

fn page_events(page: &Value) -> &[Value] {
    page["events"].as_array().expect("events array")
}

async fn a_waiting_poll_answers_with_the_event_another_request_appends(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Check the bus stop timetable").await;
    let after = cursor(&srv, t.task_id, &t.agent_token).await;

    let waiter = poll(
        srv.agent(&t.agent_token)
            .get(&events_path(t.task_id, after, LONG)),
    );
    // The poll read an empty page and waits: the append must wake it.
    srv.until_waiting(1).await;
    let (event_id, _) = append_message(&srv, t.task_id, &t.worker_token, "On my way").await;
    let (page, _) = waiter.await.expect("waiter");

    assert_eq!(types(page_events(&page)), ["worker.message"], "{page}");
    assert_eq!(page["events"][0]["id"], event_id);
    assert_eq!(page["next_cursor"], event_id);
    assert_eq!(page["task_state"], "active");
    assert_eq!(page["terminal"], false);
    assert_eq!(page["has_more"], false);
}

/// The worker's copy of the feed waits too: the agent's answer to an issue
/// reaches a waiting worker.
async fn a_waiting_worker_poll_answers_with_the_agents_response(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Photograph the harbour crane").await;
    let worker = srv.worker(&t.worker_token);
    let change = worker
        .post_json(
            &format!("/api/v1/worker/tasks/{}/issues", t.task_id),
            &json!({ "kind": "unclear_instructions", "text": "Which crane?" }),
        )
        .await;
    let issue = change["events"][0]["id"].as_i64().expect("issue id");

    let waiter = poll(worker.get(&worker_events_path(t.task_id, issue, LONG)));
    srv.until_waiting(1).await;
    srv.agent(&t.agent_token)
        .post_json(
            &format!("/api/v1/tasks/{}/issues/{issue}/respond", t.task_id),
            &json!({ "action": "clarify", "text": "The red one" }),
        )
        .await;
    let (page, _) = waiter.await.expect("waiter");

    assert_eq!(
        types(page_events(&page)),
        ["agent.issue_response"],
        "{page}"
    );
}

async fn a_wait_on_an_idle_task_times_out_empty(db: Db) {
    let srv = TestServer::start(db).await;
    let (id, token) = srv.create_open_task("Count the swans in the park").await;
    let after = cursor(&srv, id, &token).await;
    assert!(after > 0);

    let sent = Instant::now();
    let page = srv.agent(&token).get_json(&events_path(id, after, 1)).await;
    let took = sent.elapsed();

    assert!(page_events(&page).is_empty(), "{page}");
    assert_eq!(page["next_cursor"], after);
    assert_eq!(page["task_state"], "open");
    assert_eq!(page["terminal"], false);
    assert_eq!(page["has_more"], false);
    assert!(
        took >= Duration::from_millis(950),
        "answered after {took:?}, before the wait was over"
    );
    assert!(took < AT_ONCE, "answered after {took:?}");
}

async fn a_wait_on_a_terminal_task_answers_at_once(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Buy a newspaper").await;
    srv.worker(&t.worker_token)
        .post(&format!("/api/v1/worker/tasks/{}/complete", t.task_id))
        .expect_json(OK)
        .await;
    let after = cursor(&srv, t.task_id, &t.agent_token).await;

    for req in [
        srv.agent(&t.agent_token)
            .get(&events_path(t.task_id, after, 30)),
        srv.worker(&t.worker_token)
            .get(&worker_events_path(t.task_id, after, 30)),
    ] {
        let sent = Instant::now();
        let page = req.expect_json(OK).await;
        let took = sent.elapsed();
        assert!(page_events(&page).is_empty(), "{page}");
        assert_eq!(page["task_state"], "completed");
        assert_eq!(page["terminal"], true);
        assert_eq!(page["next_cursor"], after);
        assert!(
            took < AT_ONCE,
            "a terminal task made the poll wait {took:?}"
        );
    }

    // A page with events does not wait either.
    let sent = Instant::now();
    let page = srv
        .agent(&t.agent_token)
        .get_json(&events_path(t.task_id, 0, 30))
        .await;
    assert!(!page_events(&page).is_empty());
    assert!(sent.elapsed() < AT_ONCE);
}

async fn wait_outside_0_to_30_is_a_bad_request(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Measure the bench").await;
    for wait in ["31", "3600", "-1", "1.5", "soon", ""] {
        for req in [
            srv.agent(&t.agent_token).get(&format!(
                "/api/v1/tasks/{}/events?after=0&wait={wait}",
                t.task_id
            )),
            srv.worker(&t.worker_token).get(&format!(
                "/api/v1/worker/tasks/{}/events?after=0&wait={wait}",
                t.task_id
            )),
        ] {
            let problem = req.expect_problem(StatusCode::BAD_REQUEST).await;
            if wait == "31" {
                let detail = problem["detail"].as_str().unwrap_or_default();
                assert!(detail.contains("wait"), "{problem}");
            }
        }
    }
    // 0 is today's behaviour: an empty page at once.
    let after = cursor(&srv, t.task_id, &t.agent_token).await;
    let sent = Instant::now();
    let page = srv
        .agent(&t.agent_token)
        .get_json(&events_path(t.task_id, after, 0))
        .await;
    assert!(page_events(&page).is_empty());
    assert!(sent.elapsed() < AT_ONCE);
}

async fn another_tasks_events_do_not_end_a_wait(db: Db) {
    let srv = TestServer::start(db).await;
    let a = srv.active_task("Task A").await;
    let b = srv.active_task("Task B").await;
    let after = cursor(&srv, a.task_id, &a.agent_token).await;

    // Long enough that five appends fit in it on a busy machine; the test
    // checks below that they did.
    const WAIT_SECONDS: u32 = 10;
    let sent = Instant::now();
    let waiter = poll(
        srv.agent(&a.agent_token)
            .get(&events_path(a.task_id, after, WAIT_SECONDS)),
    );
    // B's events must arrive while A waits, or they prove nothing.
    srv.until_waiting(1).await;
    let mut last_append = sent;
    for i in 0..5 {
        (_, last_append) =
            append_message(&srv, b.task_id, &b.worker_token, &format!("B says {i}")).await;
    }
    assert!(
        !waiter.is_finished() && srv.feed.waiting() == 1,
        "A's wait was over before B's appends had landed ({:?} after it began): they proved nothing",
        last_append.duration_since(sent)
    );
    let (page, answered) = waiter.await.expect("waiter");
    assert!(answered > last_append);

    assert!(
        page_events(&page).is_empty(),
        "task B's events reached A: {page}"
    );
    assert_eq!(page["task_id"], a.task_id.to_string());
    assert_eq!(page["next_cursor"], after);
    let took = answered.duration_since(sent);
    assert!(
        took >= Duration::from_millis(u64::from(WAIT_SECONDS) * 1000 - 50),
        "the wait on A ended after {took:?}, before its {WAIT_SECONDS} s"
    );
    // B's feed has them.
    let b_after = cursor(&srv, b.task_id, &b.agent_token).await;
    assert!(b_after > 0);
}

async fn concurrent_waiters_all_see_the_event(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Photograph the town square").await;
    let after = cursor(&srv, t.task_id, &t.agent_token).await;

    let mut waiters = Vec::new();
    for i in 0..12 {
        let req = if i % 3 == 0 {
            srv.worker(&t.worker_token)
                .get(&worker_events_path(t.task_id, after, LONG))
        } else {
            srv.agent(&t.agent_token)
                .get(&events_path(t.task_id, after, LONG))
        };
        waiters.push(poll(req));
    }
    srv.until_waiting(12).await;
    let (event_id, _) = append_message(&srv, t.task_id, &t.worker_token, "Here").await;

    // Each answered with the event, so each was woken by it.
    for waiter in waiters {
        let (page, _) = waiter.await.expect("waiter");
        assert_eq!(types(page_events(&page)), ["worker.message"], "{page}");
        assert_eq!(page["next_cursor"], event_id);
    }
}

/// A client that multiplexes (HTTP/2 with prior knowledge, on the same
/// port as HTTP/1.1) holds many long polls on one connection; each is
/// answered with the event, as over HTTP/1.1.
async fn http2_waiters_multiplexed_on_a_client_all_see_the_event(db: Db) {
    const WAITERS: usize = 40;
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Count the benches in the park").await;
    let after = cursor(&srv, t.task_id, &t.agent_token).await;
    let http2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .pool_max_idle_per_host(1)
        .build()
        .expect("an HTTP/2 client");
    let url = format!("{}{}", srv.base_url, events_path(t.task_id, after, LONG));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let request = http2.get(&url).bearer_auth(&t.agent_token);
            tokio::spawn(async move {
                let response = request.send().await.expect("an HTTP/2 answer");
                assert_eq!(response.version(), reqwest::Version::HTTP_2);
                assert_eq!(response.status(), OK);
                response.json::<Value>().await.expect("a JSON page")
            })
        })
        .collect();
    srv.until_waiting(WAITERS).await;
    let (event_id, _) = append_message(&srv, t.task_id, &t.worker_token, "Twelve").await;
    for waiter in waiters {
        let page = waiter.await.expect("waiter");
        assert_eq!(types(page_events(&page)), ["worker.message"], "{page}");
        assert_eq!(page["next_cursor"], event_id);
    }
}

async fn shutdown_answers_waiting_polls_at_once(db: Db) {
    let srv = TestServer::start(db).await;
    let (id, token) = srv.create_open_task("Wait for me").await;
    let after = cursor(&srv, id, &token).await;

    let sent = Instant::now();
    let waiter = poll(srv.agent(&token).get(&events_path(id, after, 30)));
    srv.until_waiting(1).await;
    // Far less than the poll's 30 s: the shutdown did not wait it out.
    tokio::time::timeout(AT_ONCE, srv.stop())
        .await
        .expect("the server did not shut down while a poll was waiting");

    let (page, answered) = waiter.await.expect("waiter");
    assert!(page_events(&page).is_empty(), "{page}");
    assert_eq!(page["next_cursor"], after);
    assert_eq!(page["task_state"], "open");
    assert!(
        answered.duration_since(sent) < AT_ONCE,
        "the waiting poll answered only after {:?}",
        answered.duration_since(sent)
    );
}
