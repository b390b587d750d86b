//! Promises at the edges of the API, each of which was once broken:
//!
//! - answering an issue with `cancel` works past the deadline, as
//!   `POST /cancel` does;
//! - a worker whose assignment lapsed takes its issues with it: they close,
//!   the agent's late answer is refused, and the next worker's feed starts
//!   at the reopening (it never sees the previous worker's messages);
//! - `clarify` without text on a terminal task is a 409 (the task is
//!   terminal), not a 422;
//! - claiming a task that is not open and not the caller's is a 404 that
//!   reveals nothing about the task;
//! - a client over its rate limit gets 429 with `Retry-After`, other
//!   credentials carry on, and the capabilities document states the limit;
//! - slow and idle connections are closed after the header-read timeout,
//!   and a connection cap holds further clients back until one closes;
//! - an HTTP/2 connection is closed once it carries no request for as long
//!   (a waiting long poll keeps it open);
//! - a task's feed holds at most the configured number of events: past it
//!   messages (API and web app), issues, answers and extensions get 409
//!   `task-event-limit`, while completing still works.

use std::num::NonZeroU32;
use std::time::Duration;

use chrono::{DateTime, Utc};
use meatspace_api::ServeOptions;
use meatspace_api::rate_limit::RateLimitSettings;
use meatspace_core::{Policy, clock};
use meatspace_tests::Db;
use meatspace_tests::server::{Expect, ServerOptions, TestServer, header_str, str_at, types};
use reqwest::StatusCode;
use reqwest::header::RETRY_AFTER;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

meatspace_tests::api_tests!(
    cancel_as_an_answer_works_past_the_deadline,
    a_lapsed_assignment_takes_its_issues_and_feed_with_it,
    clarify_without_text_on_a_terminal_task_is_a_conflict,
    claiming_a_task_that_is_not_yours_is_not_found,
    a_client_over_its_limit_gets_429_and_others_do_not,
    slow_and_idle_connections_are_closed,
    the_connection_cap_holds_clients_back_until_one_closes,
    an_idle_http2_connection_is_closed_but_not_while_a_request_waits,
    a_full_feed_refuses_additions_but_not_endings,
);

fn worker_path(id: Uuid, rest: &str) -> String {
    format!("/api/v1/worker/tasks/{id}{rest}")
}

fn time_at(v: &Value, pointer: &str) -> DateTime<Utc> {
    str_at(v, pointer).parse().expect("an RFC 3339 time")
}

/// Waits until the server's clock has passed `deadline`: a condition on
/// time itself, checked against the clock the server uses.
async fn wait_until_past(deadline: DateTime<Utc>) {
    while clock::now() <= deadline {
        let left = (deadline - clock::now()).to_std().unwrap_or_default();
        tokio::time::sleep(left + Duration::from_millis(5)).await;
    }
}

/// Raises an issue as the worker; returns its event id.
async fn raise(srv: &TestServer, task: Uuid, worker_token: &str, text: &str) -> i64 {
    let body = srv
        .worker(worker_token)
        .post(&worker_path(task, "/issues"))
        .json(&json!({ "kind": "access_blocked", "text": text }))
        .expect_json(StatusCode::OK)
        .await;
    body["events"][0]["id"].as_i64().expect("event id")
}

async fn cancel_as_an_answer_works_past_the_deadline(db: Db) {
    // No controller runs here, so a passed deadline stays unapplied.
    let policy = Policy {
        active_time_limit: chrono::TimeDelta::seconds(1),
        ..Policy::default()
    };
    let srv = TestServer::start_with_policy(db, policy).await;
    let t = srv.active_task("Check the gate").await;
    let issue = raise(&srv, t.task_id, &t.worker_token, "locked").await;
    let task = srv.task(t.task_id, &t.agent_token).await;
    wait_until_past(time_at(&task, "/active_until")).await;

    let respond = |action: &str, text: Option<&str>| {
        srv.agent(&t.agent_token)
            .post(&format!(
                "/api/v1/tasks/{}/issues/{issue}/respond",
                t.task_id
            ))
            .json(&json!({ "action": action, "text": text }))
    };
    // Other answers wait for the controller to apply the deadline ...
    let refused = respond("clarify", Some("use the side gate"))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert!(str_at(&refused, "/type").ends_with("/deadline-passed"));
    // ... but cancel is a cancel, like POST /cancel.
    let done = respond("cancel", Some("never mind"))
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(done["task"]["state"], "cancelled");
    let feed = srv.feed(t.task_id, &t.agent_token).await;
    assert_eq!(
        types(&feed)[feed.len() - 2..],
        ["agent.issue_response", "task.cancelled"]
    );
}

async fn a_lapsed_assignment_takes_its_issues_and_feed_with_it(db: Db) {
    let policy = Policy {
        start_timeout: chrono::TimeDelta::seconds(1),
        ..Policy::default()
    };
    let srv = TestServer::start_with_policy(db, policy).await;
    let (id, agent_token) = srv.create_open_task("Count the bikes").await;
    let (_, first) = srv.register_worker("First").await;
    let (_, second) = srv.register_worker("Second").await;
    let claimed = srv
        .worker(&first)
        .post(&worker_path(id, "/claim"))
        .expect_json(StatusCode::OK)
        .await;
    srv.worker(&first)
        .post(&worker_path(id, "/messages"))
        .json(&json!({ "text": "first worker's private note" }))
        .expect_json(StatusCode::OK)
        .await;
    let issue = raise(&srv, id, &first, "which rack?").await;

    // The first worker never starts; the controller reopens the task.
    wait_until_past(time_at(&claimed, "/task/start_by")).await;
    let reopened = srv
        .store
        .reconcile_due(clock::now(), 10)
        .await
        .expect("reconcile");
    assert_eq!(reopened.len(), 1);
    let task = srv.task(id, &agent_token).await;
    assert_eq!(
        (task["state"].clone(), task["open_issues"].clone()),
        (json!("open"), json!(0))
    );

    // The agent's late answer is refused: the issue closed with the assignment.
    let late = srv
        .agent(&agent_token)
        .post(&format!("/api/v1/tasks/{id}/issues/{issue}/respond"))
        .json(&json!({ "action": "clarify", "text": "the blue one" }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert!(
        str_at(&late, "/type").ends_with("/issue-not-open"),
        "{late}"
    );

    // The next worker's feed starts at the reopening.
    srv.worker(&second)
        .post(&worker_path(id, "/claim"))
        .expect_json(StatusCode::OK)
        .await;
    let page = srv
        .worker(&second)
        .get(&worker_path(id, "/events?after=0"))
        .expect_json(StatusCode::OK)
        .await;
    let seen = page["events"].as_array().expect("events").clone();
    assert_eq!(types(&seen), ["task.assigned"], "{page}");
    assert!(!page.to_string().contains("private note"));
    // The agent still sees everything.
    let all = srv.feed(id, &agent_token).await;
    assert_eq!(
        types(&all),
        [
            "task.published",
            "task.assigned",
            "worker.message",
            "worker.issue",
            "task.unassigned",
            "task.assigned"
        ]
    );
}

async fn clarify_without_text_on_a_terminal_task_is_a_conflict(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Ring the bell").await;
    let issue = raise(&srv, t.task_id, &t.worker_token, "no bell").await;
    let respond = |body: Value| {
        srv.agent(&t.agent_token)
            .post(&format!(
                "/api/v1/tasks/{}/issues/{issue}/respond",
                t.task_id
            ))
            .json(&body)
    };
    // On a live task a missing text is invalid input ...
    respond(json!({ "action": "clarify" }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    srv.worker(&t.worker_token)
        .post(&worker_path(t.task_id, "/stop"))
        .expect_json(StatusCode::OK)
        .await;
    // ... on a terminal task the answer is that it is terminal.
    let body = respond(json!({ "action": "clarify" }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert!(str_at(&body, "/type").ends_with("/task-terminal"), "{body}");
    assert_eq!(body["task_state"], "stopped");
}

async fn claiming_a_task_that_is_not_yours_is_not_found(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Fetch the parcel").await;
    let (_, other) = srv.register_worker("Other").await;
    let body = srv
        .worker(&other)
        .post(&worker_path(t.task_id, "/claim"))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    assert!(body.get("task_state").is_none(), "leaks the state: {body}");
    // The same as a task that does not exist, and as reading it.
    srv.worker(&other)
        .get(&worker_path(t.task_id, ""))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    // The holder claiming again is told the state: the task is theirs.
    let again = srv
        .worker(&t.worker_token)
        .post(&worker_path(t.task_id, "/claim"))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert_eq!(again["task_state"], "active");
}

async fn a_client_over_its_limit_gets_429_and_others_do_not(db: Db) {
    let srv = TestServer::start_with(
        db,
        ServerOptions {
            // One request a minute after a burst of 3: the fourth is over.
            rate_limit: RateLimitSettings {
                per_second: NonZeroU32::new(1),
                burst: NonZeroU32::new(3).unwrap(),
            },
            ..ServerOptions::default()
        },
    )
    .await;
    let caps = srv
        .get("/api/v1/capabilities")
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(caps["limits"]["rate_limit"]["requests_per_second"], 1);
    assert_eq!(caps["limits"]["rate_limit"]["burst"], 3);

    let (id, token) = srv.create_task("Paint the fence").await;
    let get = || srv.agent(&token).get(&format!("/api/v1/tasks/{id}"));
    // The create was the dev key's; the token has its own budget.
    for _ in 0..3 {
        get().expect_json(StatusCode::OK).await;
    }
    let res = get().send().await.unwrap();
    let retry_after = header_str(&res, RETRY_AFTER);
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let seconds: u64 = retry_after.expect("Retry-After").parse().expect("seconds");
    assert!(seconds >= 1, "{seconds}");
    let body: Value = res.json().await.unwrap();
    assert!(str_at(&body, "/type").ends_with("/rate-limited"), "{body}");
    // A forged token does not spend the real holder's budget, nor does it
    // escape its own.
    let forged = format!("{token}x");
    srv.agent(&forged)
        .get(&format!("/api/v1/tasks/{id}"))
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    // Other credentials carry on.
    srv.create_task("Another fence").await;
}

/// A server with these connection limits.
async fn server_with(db: Db, serve: ServeOptions) -> TestServer {
    TestServer::start_with(
        db,
        ServerOptions {
            serve,
            ..ServerOptions::default()
        },
    )
    .await
}

/// Reads until the server closes the connection; true if it did within `bound`.
async fn closed_within(stream: &mut TcpStream, bound: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let reading = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(bound, reading).await.is_ok()
}

async fn slow_and_idle_connections_are_closed(db: Db) {
    let srv = server_with(
        db,
        ServeOptions {
            header_read_timeout: Duration::from_secs(1),
            ..ServeOptions::default()
        },
    )
    .await;
    let addr = srv.base_url.trim_start_matches("http://").to_owned();

    // Slowloris: one header byte every 200 ms would take 8 s for this
    // request; the server hangs up long before.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    let request = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: abcdefghij\r\n\r\n";
    let mut hung_up = false;
    for byte in request {
        if slow.write_all(&[*byte]).await.is_err() {
            hung_up = true;
            break;
        }
        if closed_within(&mut slow, Duration::from_millis(200)).await {
            hung_up = true;
            break;
        }
    }
    assert!(hung_up, "a client trickling headers kept its connection");

    // Idle keep-alive: after a complete exchange, silence closes it.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(
        closed_within(&mut idle, Duration::from_secs(30)).await,
        "an idle keep-alive connection stayed open"
    );

    // The server still answers.
    srv.get("/livez")
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

async fn the_connection_cap_holds_clients_back_until_one_closes(db: Db) {
    let srv = server_with(
        db,
        ServeOptions {
            max_connections: 2,
            ..ServeOptions::default()
        },
    )
    .await;
    let addr = srv.base_url.trim_start_matches("http://").to_owned();
    // Two connections, each proven accepted by a served request.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(&addr).await.unwrap();
        c.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut status = [0u8; 12];
        c.read_exact(&mut status).await.unwrap();
        assert_eq!(&status, b"HTTP/1.1 200");
        held.push(c);
    }
    // A third client is not served while both are held ...
    let third = tokio::spawn({
        let url = srv.url("/livez");
        let client = srv.client.clone();
        async move { client.get(url).send().await.map(|r| r.status()) }
    });
    // A negative check: over the cap the third client must not be served;
    // an absence can only be shown by waiting a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served over the cap"
    );
    // ... and is as soon as one goes.
    drop(held.pop());
    let status = tokio::time::timeout(Duration::from_secs(30), third)
        .await
        .expect("served once a connection closed")
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

async fn an_idle_http2_connection_is_closed_but_not_while_a_request_waits(db: Db) {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let srv = server_with(
        db,
        ServeOptions {
            header_read_timeout: Duration::from_secs(1),
            ..ServeOptions::default()
        },
    )
    .await;
    let (id, token) = srv.create_task("Count the benches in the park").await;
    let addr = srv.base_url.trim_start_matches("http://").to_owned();
    let tcp = TcpStream::connect(&addr).await.unwrap();
    let (mut send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let get = |path: &str| {
        hyper::Request::get(srv.url(path))
            .header("authorization", format!("Bearer {token}"))
            .body(Empty::<Bytes>::new())
            .unwrap()
    };

    // A long poll three times the idle timeout keeps the connection open ...
    let poll = send
        .send_request(get(&format!("/api/v1/tasks/{id}/events?after=0&wait=3")))
        .await
        .unwrap();
    assert_eq!(poll.status(), StatusCode::OK);
    let page: Value =
        serde_json::from_slice(&poll.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(page["events"], json!([]), "{page}");
    // ... so it carries the next request,
    send.ready()
        .await
        .expect("the connection was closed under a long poll");
    let task = send
        .send_request(get(&format!("/api/v1/tasks/{id}")))
        .await
        .expect("the connection was closed under a long poll");
    assert_eq!(task.status(), StatusCode::OK);
    task.into_body().collect().await.unwrap();
    // ... and silence then closes it (GOAWAY, then the end of the connection).
    tokio::time::timeout(Duration::from_secs(30), connection)
        .await
        .expect("an idle HTTP/2 connection stayed open")
        .unwrap()
        .unwrap();
}

async fn a_full_feed_refuses_additions_but_not_endings(db: Db) {
    // The review sent 100 messages a second without end; now a task's feed
    // is bounded. published, assigned, started: 3 events; 7 more fit.
    const LIMIT: u64 = 10;
    let srv = TestServer::start_with(
        db,
        ServerOptions {
            max_task_events: LIMIT,
            ..ServerOptions::default()
        },
    )
    .await;
    let t = srv.active_task("Paint the gate").await;
    let issue = raise(&srv, t.task_id, &t.worker_token, "which colour?").await;
    let message = |n: u64| {
        srv.worker(&t.worker_token)
            .post(&worker_path(t.task_id, "/messages"))
            .json(&json!({ "text": format!("coat {n}") }))
    };
    for n in 0..6 {
        message(n).expect_json(StatusCode::OK).await;
    }
    assert_eq!(
        srv.feed(t.task_id, &t.agent_token).await.len() as u64,
        LIMIT
    );
    let refused = message(6).expect_problem(StatusCode::CONFLICT).await;
    assert!(
        str_at(&refused, "/type").ends_with("/task-event-limit"),
        "{refused}"
    );
    assert!(
        str_at(&refused, "/detail").contains("10 events"),
        "{refused}"
    );
    // Issues, answers and extensions are additions too.
    srv.worker(&t.worker_token)
        .post(&worker_path(t.task_id, "/issues"))
        .json(&json!({ "kind": "access_blocked", "text": "again" }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    srv.agent(&t.agent_token)
        .post(&format!(
            "/api/v1/tasks/{}/issues/{issue}/respond",
            t.task_id
        ))
        .json(&json!({ "action": "clarify", "text": "green" }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    srv.agent(&t.agent_token)
        .post(&format!("/api/v1/tasks/{}/extend", t.task_id))
        .json(&json!({ "add_seconds": 60 }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    // Another worker still gets 404: the limit reveals nothing.
    let (_, other) = srv.register_worker("Other").await;
    srv.worker(&other)
        .post(&worker_path(t.task_id, "/messages"))
        .json(&json!({ "text": "hello?" }))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;

    // The web app's message form is refused the same way, as a page.
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = http.get(srv.url("/app/login")).send().await.unwrap();
    let pre = cookie(&login, "ms_presession");
    let csrf = csrf_in(&login.text().await.unwrap());
    let signed_in = http
        .post(srv.url("/app/login"))
        .header("cookie", &pre)
        .form(&[("csrf", csrf.as_str()), ("token", t.worker_token.as_str())])
        .send()
        .await
        .unwrap();
    let session = cookie(&signed_in, "ms_session");
    let page = http
        .get(srv.url(&format!("/app/tasks/{}", t.task_id)))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    let csrf = csrf_in(&page.text().await.unwrap());
    let res = http
        .post(srv.url(&format!("/app/tasks/{}/messages", t.task_id)))
        .header("cookie", &session)
        .form(&[("csrf", csrf.as_str()), ("text", "from the phone")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res.text().await.unwrap().contains("limit of 10 events"));
    assert_eq!(
        srv.feed(t.task_id, &t.agent_token).await.len() as u64,
        LIMIT
    );

    // Ending the task is never refused.
    srv.worker(&t.worker_token)
        .post(&worker_path(t.task_id, "/complete"))
        .json(&json!({}))
        .expect_json(StatusCode::OK)
        .await;
    let caps = srv
        .get("/api/v1/capabilities")
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(caps["limits"]["events_per_task"], LIMIT);
}

/// `name=value` of the Set-Cookie header `name`.
fn cookie(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .and_then(|v| v.split(';').next())
        .expect("the cookie")
        .to_owned()
}

/// The hidden `csrf` field of a page.
fn csrf_in(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    html[at..].split('"').next().unwrap().to_owned()
}
