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
//!   credentials that do not verify are charged to the client's address
//!   (random tokens no longer mint budgets), on every route including the
//!   web app's sign-in, and failed authentications have a budget per
//!   address;
//! - event streams and long polls are capped per credential and address;
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
use meatspace_api::http::rate_limit::RateLimitSettings;
use meatspace_domain::Policy;
use meatspace_tests::Db;
use meatspace_tests::server::{
    Expect, LapsingClaim, ServerOptions, TestServer, header_str, images, str_at, types, web,
    worker_path,
};
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
    random_credentials_share_their_address_budget,
    failed_authentications_are_limited_per_address,
    streams_and_long_polls_are_capped_per_credential_and_address,
    slow_and_idle_connections_are_closed,
    the_connection_cap_holds_clients_back_until_one_closes,
    an_idle_http2_connection_is_closed_but_not_while_a_request_waits,
    a_full_feed_refuses_additions_but_not_endings,
);

fn time_at(v: &Value, pointer: &str) -> DateTime<Utc> {
    str_at(v, pointer).parse().expect("an RFC 3339 time")
}

/// Raises an access issue as the worker; returns its event id.
async fn raise(srv: &TestServer, task: Uuid, worker_token: &str, text: &str) -> i64 {
    srv.raise_issue(task, worker_token, "access_blocked", text)
        .await
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
    srv.advance_clock_past(time_at(&task, "/active_until"));

    let respond = |action: &str, text: Option<&str>| {
        srv.respond_to_issue(
            t.task_id,
            &t.agent_token,
            issue,
            json!({ "action": action, "text": text }),
        )
    };
    // Other answers wait for the controller to apply the deadline ...
    respond("clarify", Some("use the side gate"))
        .expect_problem_type(StatusCode::CONFLICT, "deadline-passed")
        .await;
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
    let LapsingClaim {
        server: srv,
        task_id: id,
        agent_token,
        second_worker: second,
        claimed,
        issue,
        ..
    } = LapsingClaim::start(
        db,
        "Count the bikes",
        "first worker's private note",
        "which rack?",
    )
    .await;

    // The first worker never starts; the controller reopens the task.
    srv.lapse_assignment(&claimed).await;
    let task = srv.task(id, &agent_token).await;
    assert_eq!(
        (task["state"].clone(), task["open_issues"].clone()),
        (json!("open"), json!(0))
    );

    // The agent's late answer is refused: the issue closed with the assignment.
    srv.clarify(id, &agent_token, issue, "the blue one")
        .expect_problem_type(StatusCode::CONFLICT, "issue-not-open")
        .await;

    // The next worker's feed starts at the reopening.
    srv.worker_post(id, &second, "claim").await;
    let page = srv
        .worker(&second)
        .get_json(&worker_path(id, "/events?after=0"))
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
    let respond = |body: Value| srv.respond_to_issue(t.task_id, &t.agent_token, issue, body);
    // On a live task a missing text is invalid input ...
    respond(json!({ "action": "clarify" }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    srv.worker_post(t.task_id, &t.worker_token, "stop").await;
    // ... on a terminal task the answer is that it is terminal.
    let body = respond(json!({ "action": "clarify" }))
        .expect_problem_type(StatusCode::CONFLICT, "task-terminal")
        .await;
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

/// A server limiting each principal and address to a burst of `burst`
/// and one request a second after it, with `failures` failed
/// authentications per address (a burst, then one a minute).
async fn limited_server(db: Db, burst: u32, failures: Option<u32>) -> TestServer {
    TestServer::start_configured(db, |o| {
        o.rate_limit = RateLimitSettings {
            per_second: NonZeroU32::new(1),
            burst: NonZeroU32::new(burst).unwrap(),
            auth_failures_per_minute: failures.map(|_| NonZeroU32::MIN),
            auth_failures_burst: NonZeroU32::new(failures.unwrap_or(1)).unwrap(),
            ..RateLimitSettings::OFF
        }
    })
    .await
}

/// Sends `request()` up to `most` times, stopping at the first 429: how
/// many were answered with something else, and the 429 (if one came).
/// The budget refills at one request a second, so a run that takes `s`
/// seconds passes at most `burst + s + 1` requests: the bound holds on a
/// slow machine, where a fixed count of requests within a second would not.
async fn until_limited(
    mut request: impl FnMut() -> reqwest::RequestBuilder,
    most: usize,
) -> (usize, Vec<StatusCode>, Option<reqwest::Response>, Duration) {
    let started = std::time::Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..most {
        let res = request().send().await.unwrap();
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            return (statuses.len(), statuses, Some(res), started.elapsed());
        }
        statuses.push(res.status());
    }
    (statuses.len(), statuses, None, started.elapsed())
}

/// At most how many requests a budget of `burst` lets through in `took`.
fn allowed(burst: u32, took: Duration) -> usize {
    burst as usize + took.as_secs() as usize + 1
}

/// Asserts that every answer before the limit was `status`, and that no
/// more of them (`what`) passed than a budget of `burst` allows in `took`.
fn assert_within_budget(
    statuses: &[StatusCode],
    status: StatusCode,
    burst: u32,
    took: Duration,
    what: &str,
) {
    assert!(
        statuses.iter().all(|s| *s == status),
        "{what}: {statuses:?}"
    );
    let passed = statuses.len();
    assert!(
        passed <= allowed(burst, took),
        "{passed} {what} got past a budget of {burst} in {took:?}"
    );
}

async fn a_client_over_its_limit_gets_429_and_others_do_not(db: Db) {
    let srv = limited_server(db, 3, None).await;
    let caps = srv.capabilities().await;
    assert_eq!(caps["limits"]["rate_limit"]["requests_per_second"], 1);
    assert_eq!(caps["limits"]["rate_limit"]["burst"], 3);

    let (id, token) = srv.create_task("Paint the fence").await;
    let path = format!("/api/v1/tasks/{id}");
    // The create was the dev key's; the token has its own budget, which
    // forged tokens from the same client do not spend: each is charged to
    // the client's address until it verifies, and it never does.
    let forged = format!("{token}x");
    let (_, statuses, limited, took) = until_limited(|| srv.agent(&forged).get(&path), 50).await;
    assert_within_budget(
        &statuses,
        StatusCode::UNAUTHORIZED,
        3,
        took,
        "forged requests",
    );
    assert!(limited.is_some(), "50 forged tokens were never limited");
    // The holder still has its whole burst: three in a row, however long
    // the forged requests took.
    let (passed, statuses, limited, took) =
        until_limited(|| srv.agent(&token).get(&path), 50).await;
    assert!(
        passed >= 3,
        "the holder got only {passed} requests: {statuses:?}"
    );
    assert_within_budget(&statuses, StatusCode::OK, 3, took, "requests");
    let res = limited.expect("the holder is limited after its burst");
    let seconds: u64 = header_str(&res, RETRY_AFTER)
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!(seconds >= 1, "{seconds}");
    let body: Value = res.json().await.unwrap();
    assert!(str_at(&body, "/type").ends_with("/rate-limited"), "{body}");
    // Other credentials carry on.
    srv.create_task("Another fence").await;
}

/// Each random bearer value used to get a fresh budget of its own (20
/// random tokens: 20 × 401, never 429), and each cost a database read.
/// Unverified credentials are now the address's: once it is spent, the
/// answer is 429 before anything reads the store.
async fn random_credentials_share_their_address_budget(db: Db) {
    let srv = limited_server(db, 3, None).await;
    let (_, statuses, limited, took) = until_limited(
        || {
            let token = format!("mst_{}_x", Uuid::new_v4());
            srv.agent(&token)
                .get(&format!("/api/v1/tasks/{}", Uuid::new_v4()))
        },
        20,
    )
    .await;
    assert!(limited.is_some(), "20 random tokens, no 429: {statuses:?}");
    // Each answer other than 429 is at most one digest read.
    assert_within_budget(
        &statuses,
        StatusCode::UNAUTHORIZED,
        3,
        took,
        "random tokens",
    );
    // The web app's sign-in, `/mcp`, the probes and unknown routes are
    // limited too (30 sign-ins used to pass, none limited).
    for path in ["/app/login", "/mcp", "/nope"] {
        let (_, _, limited, _) = until_limited(|| srv.post(path).body("token=x"), 30).await;
        assert!(limited.is_some(), "POST {path} is not limited");
    }
    let (_, _, limited, _) = until_limited(|| srv.get("/livez"), 30).await;
    assert!(limited.is_some(), "GET /livez is not limited");
    // A verified credential is its own budget, whatever its address spent.
    srv.create_task("Still served").await;
}

/// Failed authentications have a budget per address: past it, requests
/// from that address without a verified credential get 429 (no store
/// read), while a credential that verifies goes on.
async fn failed_authentications_are_limited_per_address(db: Db) {
    // A request budget large enough that only the failure budget binds.
    let srv = limited_server(db, 1000, Some(4)).await;
    let (id, token) = srv.create_task("Water the plants").await;
    let path = format!("/api/v1/tasks/{id}");
    let (passed, statuses, limited, _) =
        until_limited(|| srv.agent(&format!("mst_{id}_wrong")).get(&path), 20).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::UNAUTHORIZED),
        "{statuses:?}"
    );
    // One failure a minute refills: four, perhaps five on a slow run.
    assert!(
        (4..=5).contains(&passed),
        "{passed} failures before the limit"
    );
    let body: Value = limited.expect("limited").json().await.unwrap();
    assert!(
        str_at(&body, "/detail").contains("failed authentications"),
        "{body}"
    );
    // Anonymous requests from the address are held back too ...
    srv.get("/api/v1/capabilities")
        .expect_problem(StatusCode::TOO_MANY_REQUESTS)
        .await;
    // ... but the holder of a real token, and the dev key, are not.
    srv.agent(&token).get_json(&path).await;
    srv.create_task("And the lawn").await;
}

/// Sends `req`, an event stream or a long poll whose headers arrive at once
/// and whose body follows later, and asserts that it took a place (200).
async fn admitted(req: reqwest::RequestBuilder) -> reqwest::Response {
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "not admitted");
    res
}

/// Event streams and long polls are capped per credential and per address:
/// HTTP/2 allows a thousand requests per connection, and every change
/// wakes each open stream of its task.
async fn streams_and_long_polls_are_capped_per_credential_and_address(db: Db) {
    let mut options = ServerOptions {
        rate_limit: RateLimitSettings {
            max_streams_per_credential: NonZeroU32::new(2),
            max_streams_per_address: NonZeroU32::new(3),
            ..RateLimitSettings::OFF
        },
        ..ServerOptions::default()
    };
    // A closed stream is noticed at its next write, the next heartbeat.
    options.integrations.sse_heartbeat = Duration::from_millis(200);
    let srv = TestServer::start_with(db, options).await;
    let caps = srv.capabilities().await;
    assert_eq!(caps["limits"]["rate_limit"]["streams"]["per_credential"], 2);
    assert_eq!(caps["limits"]["rate_limit"]["streams"]["per_address"], 3);
    let t = srv.active_task("Guard the gate").await;
    let stream_path = format!("/api/v1/tasks/{}/events/stream", t.task_id);
    let poll_path = format!("/api/v1/tasks/{}/events?after=1000000&wait=30", t.task_id);
    // One event stream (its headers arrive at once) and one waiting long
    // poll: the agent token's two places.
    let stream = admitted(srv.agent(&t.agent_token).get(&stream_path)).await;
    // A waiting long poll is answered 200 at once; its page follows later.
    let poll = admitted(srv.agent(&t.agent_token).get(&poll_path)).await;
    for path in [&stream_path, &poll_path] {
        srv.agent(&t.agent_token)
            .get(path)
            .expect_problem_type(StatusCode::TOO_MANY_REQUESTS, "too-many-streams")
            .await;
    }
    // A page answered at once takes no place.
    srv.agent(&t.agent_token)
        .get_json(&format!("/api/v1/tasks/{}/events", t.task_id))
        .await;
    // A forged token cannot take the holder's places, nor is it counted.
    srv.agent(&format!("{}x", t.agent_token))
        .get(&stream_path)
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    // The worker has places of its own, but the address holds three.
    let worker_stream = format!("/api/v1/worker/tasks/{}/events/stream", t.task_id);
    let third = admitted(srv.worker(&t.worker_token).get(&worker_stream)).await;
    let body = srv
        .worker(&t.worker_token)
        .get(&worker_stream)
        .expect_problem(StatusCode::TOO_MANY_REQUESTS)
        .await;
    assert!(str_at(&body, "/detail").contains("address"), "{body}");
    // Closing a stream gives its place back.
    drop(stream);
    meatspace_tests::eventually(
        Duration::from_secs(30),
        "the closed stream's place comes back",
        || async {
            let res = srv
                .agent(&t.agent_token)
                .get(&stream_path)
                .send()
                .await
                .unwrap();
            if res.status() != StatusCode::OK {
                assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            }
            (res.status() == StatusCode::OK).then_some(())
        },
    )
    .await;
    drop((poll, third));
}

/// A server with these connection limits, and its address for raw
/// connections.
async fn server_with(db: Db, serve: ServeOptions) -> (TestServer, String) {
    let srv = TestServer::start_configured(db, |o| o.serve = serve).await;
    let addr = srv.base_url.trim_start_matches("http://").to_owned();
    (srv, addr)
}

/// A server that waits at most a second for a request's headers.
async fn header_timeout_server(db: Db) -> (TestServer, String) {
    server_with(
        db,
        ServeOptions {
            header_read_timeout: Duration::from_secs(1),
            ..ServeOptions::default()
        },
    )
    .await
}

/// A raw HTTP/1.1 connection to `addr` that has been served one
/// `GET /livez` (so the server accepted it) and is kept alive.
async fn served_connection(addr: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut status = [0u8; 12];
    c.read_exact(&mut status).await.unwrap();
    assert_eq!(&status, b"HTTP/1.1 200");
    c
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
    let (srv, addr) = header_timeout_server(db).await;

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
    let mut idle = served_connection(&addr).await;
    assert!(
        closed_within(&mut idle, Duration::from_secs(30)).await,
        "an idle keep-alive connection stayed open"
    );

    // The server still answers.
    srv.assert_live().await;
}

async fn the_connection_cap_holds_clients_back_until_one_closes(db: Db) {
    let (srv, addr) = server_with(
        db,
        ServeOptions {
            max_connections: 2,
            ..ServeOptions::default()
        },
    )
    .await;
    // Two connections, each proven accepted by a served request.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(served_connection(&addr).await);
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

    let (srv, addr) = header_timeout_server(db).await;
    let (id, token) = srv.create_task("Count the benches in the park").await;
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
    let srv = TestServer::start_with_policy(
        db,
        Policy {
            max_task_events: LIMIT,
            ..Policy::default()
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
    let refused = message(6)
        .expect_problem_type(StatusCode::CONFLICT, "task-event-limit")
        .await;
    assert!(
        str_at(&refused, "/detail").contains("10 events"),
        "{refused}"
    );
    // A photo is refused the same way (it once went around the check).
    let photo = srv
        .worker(&t.worker_token)
        .send_png(t.task_id, images::png(8, 8))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert_eq!(
        (str_at(&photo, "/type"), str_at(&photo, "/detail")),
        (str_at(&refused, "/type"), str_at(&refused, "/detail")),
        "a photo on a full feed is refused as a message is"
    );
    assert_eq!(
        srv.feed(t.task_id, &t.agent_token).await.len() as u64,
        LIMIT,
        "nothing was added"
    );
    // Issues, answers and extensions are additions too.
    srv.worker(&t.worker_token)
        .post(&worker_path(t.task_id, "/issues"))
        .json(&json!({ "kind": "access_blocked", "text": "again" }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    srv.clarify(t.task_id, &t.agent_token, issue, "green")
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
    let http = web::client();
    let session = web::sign_in(&srv, &http, &t.worker_token, &[]).await;
    let page = web::get_with(
        &http,
        &srv.url(&format!("/app/tasks/{}", t.task_id)),
        &session,
    )
    .await;
    let csrf = web::csrf_of(&page.text().await.unwrap());
    let res = web::post_form(
        &http,
        &srv.url(&format!("/app/tasks/{}/messages", t.task_id)),
        &session,
        &[],
        &[("csrf", csrf.as_str()), ("text", "from the phone")],
    )
    .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res.text().await.unwrap().contains("limit of 10 events"));
    assert_eq!(
        srv.feed(t.task_id, &t.agent_token).await.len() as u64,
        LIMIT
    );

    // Ending the task is never refused.
    srv.worker(&t.worker_token)
        .post_json(&worker_path(t.task_id, "/complete"), &json!({}))
        .await;
    let caps = srv.capabilities().await;
    assert_eq!(caps["limits"]["events_per_task"], LIMIT);
}
