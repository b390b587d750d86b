//! What the API does with requests it must refuse: credentials that do not
//! fit, bad bodies, bad photos, unknown routes and plain garbage. Every
//! refusal is a problem document with the right status, nothing is written,
//! and no input gets a 5xx.

use std::time::Duration;

use meatspace_api::photo::PhotoLimits;
use meatspace_tests::Db;
use meatspace_tests::server::{
    DEV_KEY_HEADER, Expect, PROBLEM_JSON, TestServer, header_str, ids, images, task_path,
    worker_path,
};
use reqwest::header::{ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

meatspace_tests::api_tests!(
    tokens_open_only_their_own_task,
    workers_reach_only_open_tasks_and_their_own,
    bad_task_input_is_refused_and_writes_nothing,
    bad_worker_input_is_refused_and_writes_nothing,
    bad_photos_are_refused_and_write_nothing,
    issue_responses_name_an_open_issue_of_the_task,
    unknown_routes_methods_and_ids_are_problems,
    no_input_gets_a_server_error,
);

const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
const UNAUTHORIZED: StatusCode = StatusCode::UNAUTHORIZED;
const UNPROCESSABLE: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;

/// A 401 must tell the client how to authenticate.
async fn expect_unauthorized(request: RequestBuilder) {
    let res = request.send().await.unwrap();
    let challenge = header_str(&res, WWW_AUTHENTICATE);
    let status = res.status();
    let content_type = header_str(&res, CONTENT_TYPE);
    let body = res.text().await.unwrap();
    assert_eq!(status, UNAUTHORIZED, "{body}");
    assert_eq!(challenge.as_deref(), Some("Bearer"), "{body}");
    assert_eq!(content_type.as_deref(), Some(PROBLEM_JSON), "{body}");
}

/// The same token with its last character changed.
fn tampered(token: &str) -> String {
    let mut t = token.to_owned();
    let last = t.pop().unwrap();
    t.push(if last == 'A' { 'B' } else { 'A' });
    t
}

async fn tokens_open_only_their_own_task(db: Db) {
    let srv = TestServer::start(db).await;
    let (a, token_a) = srv.create_task("Task A").await;
    let (b, token_b) = srv.create_task("Task B").await;
    let (_, worker_token) = srv.register_worker("W").await;
    let with_a = srv.agent(&token_a);

    // A's genuine token on B: B does not exist for it.
    for request in [
        with_a.get(&task_path(b, "")),
        with_a.get(&task_path(b, "/events?after=0")),
        with_a.post(&task_path(b, "/publish")),
        with_a.post(&task_path(b, "/cancel")),
        with_a
            .post(&task_path(b, "/issues/1/respond"))
            .json(&json!({ "action": "cancel" })),
        with_a.get(&task_path(b, &format!("/photos/{}", Uuid::new_v4()))),
        with_a.get(&task_path(Uuid::new_v4(), "")),
    ] {
        request.expect_problem(NOT_FOUND).await;
    }
    assert_eq!(srv.task(b, &token_b).await["state"], "draft");
    assert_eq!(srv.feed(b, &token_b).await, Vec::<Value>::new());

    // Wrong, malformed, foreign or missing credentials: 401 with a challenge.
    let a_simple = a.simple();
    for header in [
        format!("Bearer {}", tampered(&token_a)),
        format!("Bearer {worker_token}"),
        "Bearer garbage".to_owned(),
        "Bearer mst_".to_owned(),
        format!("Bearer mst_{a_simple}_"),
        format!("Bearer mst_{a_simple}"),
        "Bearer ".to_owned(),
        format!("Basic {token_a}"),
        token_a.clone(),
    ] {
        for request in [
            srv.get(&task_path(a, "")),
            srv.post(&task_path(a, "/publish")),
            srv.get(&task_path(a, "/events")),
        ] {
            expect_unauthorized(request.header(AUTHORIZATION, header.as_str())).await;
        }
    }
    expect_unauthorized(srv.get(&task_path(a, ""))).await;
    expect_unauthorized(srv.post(&task_path(a, "/cancel"))).await;
    // The token is checked before the body: no hints for the unauthenticated.
    expect_unauthorized(
        srv.post(&task_path(a, "/issues/1/respond"))
            .header(CONTENT_TYPE, "application/json")
            .body("{not json"),
    )
    .await;
    assert_eq!(srv.task(a, &token_a).await["state"], "draft", "A unchanged");

    // An agent token is no worker credential, and the reverse.
    expect_unauthorized(srv.agent(&token_a).get("/api/v1/worker/tasks")).await;
    expect_unauthorized(
        srv.worker(&tampered(&worker_token))
            .get("/api/v1/worker/tasks"),
    )
    .await;
    expect_unauthorized(srv.get("/api/v1/worker/tasks")).await;

    // The development key: missing or wrong is 401, and checked before the body.
    for key in [None, Some(tampered(&srv.dev_key)), Some(String::new())] {
        for path in ["/api/v1/tasks", "/api/v1/workers"] {
            let mut request = srv
                .post(path)
                .json(&json!({ "description": "x", "name": "x" }));
            if let Some(key) = &key {
                request = request.header(DEV_KEY_HEADER, key);
            }
            let problem = request.expect_problem(UNAUTHORIZED).await;
            assert!(
                problem["detail"]
                    .as_str()
                    .unwrap()
                    .contains("development key"),
                "{problem}"
            );
        }
    }
    srv.post("/api/v1/tasks")
        .header(CONTENT_TYPE, "application/json")
        .body("{")
        .expect_problem(UNAUTHORIZED)
        .await;
    assert_eq!(srv.counts().await.tasks, 2);

    // A photo belongs to its task: another task's token and id do not reach it.
    let t = srv.active_task("With a photo").await;
    let path = srv
        .worker(&t.worker_token)
        .send_png(t.task_id, images::png(4, 4))
        .expect_json(StatusCode::OK)
        .await["events"][0]["data"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let photo_id = path.rsplit('/').next().unwrap();
    srv.agent(&t.agent_token)
        .get(&path)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    srv.agent(&token_b)
        .get(&task_path(b, &format!("/photos/{photo_id}")))
        .expect_problem(NOT_FOUND)
        .await;
    srv.agent(&token_b)
        .get(&path)
        .expect_problem(NOT_FOUND)
        .await;
}

async fn workers_reach_only_open_tasks_and_their_own(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Walk the dog").await;
    let (_, other_token) = srv.register_worker("Other").await;
    let other = srv.worker(&other_token);
    let events_before = srv.counts().await.events;

    for request in [
        other.get(&worker_path(t.task_id, "")),
        other.get(&worker_path(t.task_id, "/events")),
        other.post(&worker_path(t.task_id, "/start")),
        other
            .post(&worker_path(t.task_id, "/messages"))
            .json(&json!({ "text": "hi" })),
        other.send_png(t.task_id, images::png(4, 4)),
        other
            .post(&worker_path(t.task_id, "/issues"))
            .json(&json!({ "kind": "other", "text": "hi" })),
        other.post(&worker_path(t.task_id, "/complete")),
        other.post(&worker_path(t.task_id, "/stop")),
        other.get(&worker_path(Uuid::new_v4(), "")),
        other.post(&worker_path(Uuid::new_v4(), "/claim")),
    ] {
        request.expect_problem(NOT_FOUND).await;
    }
    // Claiming someone else's task: like every task that is not theirs, it
    // does not exist for this worker, and nothing about it is revealed.
    let problem = other
        .post(&worker_path(t.task_id, "/claim"))
        .expect_problem(NOT_FOUND)
        .await;
    assert!(problem.get("task_state").is_none(), "{problem}");

    // Drafts do not exist for workers.
    let (draft, _) = srv.create_task("Not yet").await;
    for request in [
        other.get(&worker_path(draft, "")),
        other.post(&worker_path(draft, "/claim")),
        other.get(&worker_path(draft, "/events")),
        other
            .post(&worker_path(draft, "/messages"))
            .json(&json!({ "text": "hi" })),
    ] {
        request.expect_problem(NOT_FOUND).await;
    }
    let listed = other.get_json("/api/v1/worker/tasks").await;
    assert_eq!(listed["tasks"], json!([]));
    assert_eq!(
        srv.counts().await.events,
        events_before,
        "nothing was written"
    );
    assert_eq!(srv.task(t.task_id, &t.agent_token).await["state"], "active");
}

/// Sends each request, expects the problem status, and checks that no row
/// was written anywhere.
async fn refused_without_writes(srv: &TestServer, cases: Vec<(&str, RequestBuilder, StatusCode)>) {
    let before = srv.counts().await;
    for (what, request, status) in cases {
        let res = request.send().await.unwrap();
        let got = res.status();
        let content_type = header_str(&res, CONTENT_TYPE);
        let body = res.text().await.unwrap();
        assert_eq!(got, status, "{what}: {body}");
        assert_eq!(
            content_type.as_deref(),
            Some(PROBLEM_JSON),
            "{what}: {body}"
        );
        let problem: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["status"], status.as_u16(), "{what}");
        assert_eq!(srv.counts().await, before, "{what} wrote something");
    }
}

async fn bad_task_input_is_refused_and_writes_nothing(db: Db) {
    let srv = TestServer::start(db).await;
    let create = || srv.dev(Method::POST, "/api/v1/tasks");
    let with = |body: Value| create().json(&body);
    let max_lifetime = 30 * 24 * 3600;
    refused_without_writes(
        &srv,
        vec![
            (
                "malformed JSON",
                create()
                    .header(CONTENT_TYPE, "application/json")
                    .body(r#"{"description": "x""#),
                StatusCode::BAD_REQUEST,
            ),
            (
                "text/plain",
                create()
                    .header(CONTENT_TYPE, "text/plain")
                    .body(r#"{"description": "x"}"#),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "no content type",
                create().body(r#"{"description": "x"}"#),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "unknown field",
                with(json!({ "description": "x", "priority": 1 })),
                UNPROCESSABLE,
            ),
            ("no description", with(json!({})), UNPROCESSABLE),
            ("array body", with(json!(["x"])), UNPROCESSABLE),
            (
                "number description",
                with(json!({ "description": 7 })),
                UNPROCESSABLE,
            ),
            (
                "empty description",
                with(json!({ "description": "" })),
                UNPROCESSABLE,
            ),
            (
                "blank description",
                with(json!({ "description": " \n\t " })),
                UNPROCESSABLE,
            ),
            (
                "4001 characters",
                with(json!({ "description": "a".repeat(4001) })),
                UNPROCESSABLE,
            ),
            (
                "4001 multi-byte characters",
                with(json!({ "description": "é".repeat(4001) })),
                UNPROCESSABLE,
            ),
            (
                "NUL",
                with(json!({ "description": "a\u{0}b" })),
                UNPROCESSABLE,
            ),
            (
                "lifetime 0",
                with(json!({ "description": "x", "expires_in_seconds": 0 })),
                UNPROCESSABLE,
            ),
            (
                "negative lifetime",
                with(json!({ "description": "x", "expires_in_seconds": -60 })),
                UNPROCESSABLE,
            ),
            (
                "lifetime over the maximum",
                with(json!({ "description": "x", "expires_in_seconds": max_lifetime + 1 })),
                UNPROCESSABLE,
            ),
            (
                "lifetime beyond i64",
                create()
                    .header(CONTENT_TYPE, "application/json")
                    .body(r#"{"description": "x", "expires_in_seconds": 1e30}"#),
                UNPROCESSABLE,
            ),
            (
                "fractional lifetime",
                with(json!({ "description": "x", "expires_in_seconds": 1.5 })),
                UNPROCESSABLE,
            ),
            (
                "body over 64 KiB",
                with(json!({ "description": "a".repeat(70 * 1024) })),
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
        ],
    )
    .await;

    // The limit counts characters, not bytes, and text round-trips exactly.
    for description in [
        "é".repeat(4000),
        "😀".repeat(4000),
        format!("{}\u{301}", "e".repeat(3999)),
        "a".repeat(4000),
    ] {
        let created = srv
            .create_task_with(
                json!({ "description": description, "expires_in_seconds": max_lifetime }),
            )
            .await;
        assert_eq!(created["task"]["description"], description.as_str());
        let token = created["agent_token"].as_str().unwrap();
        let id = created["task"]["id"].as_str().unwrap();
        assert_eq!(
            srv.task(id.parse().unwrap(), token).await["description"],
            description.as_str()
        );
    }
    // A charset parameter is still JSON.
    srv.dev(Method::POST, "/api/v1/tasks")
        .header(CONTENT_TYPE, "application/json; charset=utf-8")
        .body(r#"{"description": "with a charset"}"#)
        .expect_json(StatusCode::CREATED)
        .await;
    assert_eq!(srv.counts().await.tasks, 5);
}

async fn bad_worker_input_is_refused_and_writes_nothing(db: Db) {
    let srv = TestServer::start(db).await;
    let register = |body: Value| srv.dev(Method::POST, "/api/v1/workers").json(&body);
    refused_without_writes(
        &srv,
        vec![
            ("empty name", register(json!({ "name": "" })), UNPROCESSABLE),
            (
                "long name",
                register(json!({ "name": "n".repeat(201) })),
                UNPROCESSABLE,
            ),
            (
                "unknown field",
                register(json!({ "name": "n", "admin": true })),
                UNPROCESSABLE,
            ),
            (
                "NUL name",
                register(json!({ "name": "a\u{0}" })),
                UNPROCESSABLE,
            ),
        ],
    )
    .await;

    let t = srv.active_task("Sort the mail").await;
    let worker = srv.worker(&t.worker_token);
    let post = |rest: &str| worker.post(&worker_path(t.task_id, rest));
    let json_to = |rest: &str, body: Value| post(rest).json(&body);
    let raw_to = |rest: &str, content_type: &str, body: &'static str| {
        post(rest).header(CONTENT_TYPE, content_type).body(body)
    };
    refused_without_writes(
        &srv,
        vec![
            (
                "message: no text",
                json_to("/messages", json!({})),
                UNPROCESSABLE,
            ),
            (
                "message: empty",
                json_to("/messages", json!({ "text": "" })),
                UNPROCESSABLE,
            ),
            (
                "message: 4001 chars",
                json_to("/messages", json!({ "text": "x".repeat(4001) })),
                UNPROCESSABLE,
            ),
            (
                "message: NUL",
                json_to("/messages", json!({ "text": "\u{0}" })),
                UNPROCESSABLE,
            ),
            (
                "message: unknown field",
                json_to("/messages", json!({ "text": "x", "urgent": true })),
                UNPROCESSABLE,
            ),
            (
                "message: malformed",
                raw_to("/messages", "application/json", "{\"text\":"),
                StatusCode::BAD_REQUEST,
            ),
            (
                "message: form body",
                raw_to("/messages", "application/x-www-form-urlencoded", "text=hi"),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "message: over 64 KiB",
                json_to("/messages", json!({ "text": "x".repeat(70 * 1024) })),
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (
                "issue: unknown kind",
                json_to("/issues", json!({ "kind": "fire", "text": "x" })),
                UNPROCESSABLE,
            ),
            (
                "issue: no kind",
                json_to("/issues", json!({ "text": "x" })),
                UNPROCESSABLE,
            ),
            (
                "issue: empty text",
                json_to("/issues", json!({ "kind": "other", "text": "" })),
                UNPROCESSABLE,
            ),
            (
                "complete: malformed",
                raw_to("/complete", "application/json", "{"),
                StatusCode::BAD_REQUEST,
            ),
            (
                "complete: not JSON",
                raw_to("/complete", "text/plain", "done"),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "complete: unknown field",
                json_to("/complete", json!({ "rating": 5 })),
                UNPROCESSABLE,
            ),
            (
                "complete: empty note",
                json_to("/complete", json!({ "text": "" })),
                UNPROCESSABLE,
            ),
            (
                "complete: over 64 KiB",
                json_to("/complete", json!({ "text": "x".repeat(70 * 1024) })),
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (
                "stop: 4001 chars",
                json_to("/stop", json!({ "text": "x".repeat(4001) })),
                UNPROCESSABLE,
            ),
            (
                "stop: malformed",
                raw_to("/stop", "application/json", "]"),
                StatusCode::BAD_REQUEST,
            ),
        ],
    )
    .await;
    // Refused completes and stops did not end the task.
    assert_eq!(srv.task(t.task_id, &t.agent_token).await["state"], "active");
}

async fn bad_photos_are_refused_and_write_nothing(db: Db) {
    let limits = PhotoLimits::new(256 * 1024, 1024);
    let srv = TestServer::start_configured(db, |o| o.photo_limits = limits.clone()).await;
    let t = srv.active_task("Photograph the bridge").await;
    let worker = srv.worker(&t.worker_token);
    let photo = |content_type: Option<&str>, body: Vec<u8>| {
        let request = worker.post(&worker_path(t.task_id, "/photos")).body(body);
        match content_type {
            Some(ct) => request.header(CONTENT_TYPE, ct),
            None => request,
        }
    };
    let oversized = images::noisy_png(400, 400);
    assert!(oversized.len() > limits.max_bytes, "{}", oversized.len());
    let mut truncated = images::png(100, 100);
    truncated.truncate(truncated.len() / 2);
    refused_without_writes(
        &srv,
        vec![
            (
                "over the limit",
                photo(Some("image/png"), oversized),
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (
                "text as JPEG",
                photo(Some("image/jpeg"), b"hello, world".to_vec()),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "GIF",
                photo(
                    Some("image/png"),
                    b"GIF89a\x01\x00\x01\x00\x00\x00\x00;".to_vec(),
                ),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "PNG as text/plain",
                photo(Some("text/plain"), images::png(4, 4)),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "no content type",
                photo(None, images::png(4, 4)),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                "empty body",
                photo(Some("image/png"), Vec::new()),
                UNPROCESSABLE,
            ),
            (
                "truncated PNG",
                photo(Some("image/png"), truncated),
                UNPROCESSABLE,
            ),
            (
                "JPEG claiming 60000x60000 pixels",
                photo(Some("image/jpeg"), images::jpeg_claiming(60_000)),
                UNPROCESSABLE,
            ),
            (
                "wider than the configured limit",
                photo(Some("image/png"), images::png(1025, 1)),
                UNPROCESSABLE,
            ),
        ],
    )
    .await;

    // A photo above the JSON body limit but within the photo limit is fine.
    let big = images::noisy_png(200, 150);
    assert!(big.len() > 64 * 1024 && big.len() < limits.max_bytes);
    let change = photo(Some("image/png"), big)
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(change["events"][0]["data"]["width"], 200);
    let counts = srv.counts().await;
    assert_eq!(counts.photos, 1);
}

async fn issue_responses_name_an_open_issue_of_the_task(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Buy bread").await;
    let other = srv.active_task("Buy milk").await;
    let raise = |task: &meatspace_tests::server::ActiveTask| {
        srv.worker(&task.worker_token)
            .post(&worker_path(task.task_id, "/issues"))
            .json(&json!({ "kind": "item_unavailable", "text": "Sold out." }))
            .expect_json(StatusCode::OK)
    };
    let issue = raise(&t).await["events"][0]["id"].as_i64().unwrap();
    let foreign_issue = raise(&other).await["events"][0]["id"].as_i64().unwrap();
    let published = ids(&srv.feed(t.task_id, &t.agent_token).await)[0];
    let agent = srv.agent(&t.agent_token);
    let respond = |event: &str, body: Value| {
        agent
            .post(&task_path(t.task_id, &format!("/issues/{event}/respond")))
            .json(&body)
    };
    let clarify = json!({ "action": "clarify", "text": "Any bread will do." });
    refused_without_writes(
        &srv,
        vec![
            (
                "a non-issue event",
                respond(&published.to_string(), clarify.clone()),
                NOT_FOUND,
            ),
            (
                "another task's issue",
                respond(&foreign_issue.to_string(), clarify.clone()),
                NOT_FOUND,
            ),
            (
                "no such event",
                respond("999999999", clarify.clone()),
                NOT_FOUND,
            ),
            ("negative id", respond("-1", clarify.clone()), NOT_FOUND),
            ("malformed id", respond("first", clarify.clone()), NOT_FOUND),
            (
                "clarify without text",
                respond(&issue.to_string(), json!({ "action": "clarify" })),
                UNPROCESSABLE,
            ),
            (
                "acknowledge without text",
                respond(&issue.to_string(), json!({ "action": "acknowledge" })),
                UNPROCESSABLE,
            ),
            (
                "clarify with empty text",
                respond(
                    &issue.to_string(),
                    json!({ "action": "clarify", "text": "" }),
                ),
                UNPROCESSABLE,
            ),
            (
                "unknown action",
                respond(&issue.to_string(), json!({ "action": "ignore" })),
                UNPROCESSABLE,
            ),
        ],
    )
    .await;
    respond(&issue.to_string(), clarify.clone())
        .expect_json(StatusCode::OK)
        .await;
    let events = srv.counts().await.events;
    let problem = respond(&issue.to_string(), clarify)
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/issue-not-open"),
        "{problem}"
    );
    assert_eq!(srv.counts().await.events, events);
    // The other task's issue is still open: a response is scoped to its task.
    assert_eq!(
        srv.task(other.task_id, &other.agent_token).await["open_issues"],
        1
    );
}

async fn unknown_routes_methods_and_ids_are_problems(db: Db) {
    let srv = TestServer::start(db).await;
    let (id, token) = srv.create_task("x").await;
    let agent = srv.agent(&token);
    // `/` itself answers (a pointer to the app and the capabilities,
    // server_startup checks it).
    for path in [
        "/nope",
        "/api",
        "/api/v1",
        "/api/v2/tasks",
        "/api/v1/tasks/",
        "/api/v1/nope",
    ] {
        let problem = srv.get(path).expect_problem(NOT_FOUND).await;
        assert_eq!(problem["detail"], "no such route", "{path}");
    }
    for (method, path, allowed) in [
        (Method::DELETE, "/api/v1/tasks".to_owned(), "POST"),
        (Method::PUT, "/api/v1/tasks".to_owned(), "GET"),
        (Method::DELETE, "/api/v1/workers".to_owned(), "POST"),
        (Method::PATCH, "/api/v1/keys".to_owned(), "GET"),
        (Method::PUT, task_path(id, ""), "GET"),
        (Method::GET, task_path(id, "/publish"), "POST"),
        (Method::POST, "/api/v1/capabilities".to_owned(), "GET"),
    ] {
        let res = agent.request(method.clone(), &path).send().await.unwrap();
        let allow = header_str(&res, ALLOW).unwrap_or_default();
        assert_eq!(
            res.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(
            header_str(&res, CONTENT_TYPE).as_deref(),
            Some(PROBLEM_JSON)
        );
        assert!(allow.contains(allowed), "{method} {path}: Allow: {allow:?}");
    }
    // A malformed id names nothing, even with a valid token.
    let (_, worker_token) = srv.register_worker("W").await;
    let worker = srv.worker(&worker_token);
    for request in [
        agent.get(&task_path("not-a-uuid", "")),
        agent.get(&task_path("123", "/events")),
        agent.post(&task_path(format!("{id}x"), "/publish")),
        agent.get(&task_path(id, "/photos/not-a-uuid")),
        agent.get(&task_path("%FF%FE", "")),
        worker.post(&worker_path("not-a-uuid", "/claim")),
        worker.get(&worker_path("%C3%28", "/events")),
    ] {
        request.expect_problem(NOT_FOUND).await;
    }
    assert_eq!(srv.task(id, &token).await["state"], "draft");
}

/// A small deterministic generator, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }
}

async fn no_input_gets_a_server_error(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Target of garbage").await;
    let issue = srv
        .worker(&t.worker_token)
        .post_json(
            &worker_path(t.task_id, "/issues"),
            &json!({ "kind": "other", "text": "?" }),
        )
        .await["events"][0]["id"]
        .to_string();
    let api = srv.get_json("/api/v1/openapi.json").await;
    let mut routes: Vec<(Method, String)> = Vec::new();
    for (path, item) in api["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "patch", "delete"] {
            if !item[method].is_null() {
                routes.push((method.to_uppercase().parse().unwrap(), path.clone()));
            }
        }
    }
    for path in ["/livez", "/readyz", "/metrics", "/nope"] {
        routes.push((Method::GET, path.to_owned()));
    }
    let long = "x".repeat(2000);
    // Real ids and credentials come up often, so requests get past
    // authentication and into validation and the store.
    let task_ids = [
        t.task_id.to_string(),
        t.task_id.to_string(),
        t.task_id.to_string(),
        Uuid::new_v4().to_string(),
        "not-a-uuid".to_owned(),
        "%00".to_owned(),
        "%FF%FE".to_owned(),
        "..".to_owned(),
        long.clone(),
    ];
    let event_ids = [
        issue,
        "0".into(),
        "-1".into(),
        "99999999999999999999".into(),
        "1e3".into(),
    ];
    let photo_ids = [Uuid::new_v4().to_string(), "zz".to_owned()];
    let queries = [
        String::new(),
        "?after=abc".into(),
        format!("?after={}", "9".repeat(5000)),
        "?limit=-1&after=-1".into(),
        "?after=1&after=2".into(),
        format!("?{}", "a=b&".repeat(5000)),
        format!("?cursor={}", "%FF".repeat(300)),
        "?%ZZ=%".into(),
        "?limit=1000&after=0".into(),
    ];
    let auths = [
        None,
        Some(format!("Bearer {}", t.agent_token)),
        Some(format!("Bearer {}", t.agent_token)),
        Some(format!("Bearer {}", t.worker_token)),
        Some(format!("Bearer {}", t.worker_token)),
        Some("Bearer mst_00000000000000000000000000000000_x".into()),
        Some(format!("Bearer msw_{}_", t.worker_id.simple())),
        Some("Basic Zm9vOmJhcg==".into()),
        Some(format!("Bearer {}", "A".repeat(8000))),
    ];
    let dev_keys = [None, Some(srv.dev_key.clone()), Some("msd_wrong".into())];
    let content_types = [
        None,
        Some("application/json"),
        Some("image/png"),
        Some("image/jpeg"),
        Some("image/webp"),
        Some("text/plain"),
        Some("application/json; charset=utf-16"),
        Some("multipart/form-data; boundary=x"),
        Some(";;;"),
    ];
    let json_bodies: [&[u8]; 8] = [
        b"{",
        b"null",
        b"[]",
        b"{\"description\": 1}",
        b"{\"text\": \"\\ud800\"}",
        b"{\"action\": \"cancel\", \"text\": null}",
        b"{\"kind\": \"other\", \"text\": \"x\", \"kind\": \"fire\"}",
        b"\xEF\xBB\xBF{\"name\": \"bom\"}",
    ];

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..600 {
        let (method, template) = rng.pick(&routes).clone();
        let path = template
            .replace("{task_id}", rng.pick(&task_ids).as_str())
            .replace("{event_id}", rng.pick(&event_ids).as_str())
            .replace("{photo_id}", rng.pick(&photo_ids).as_str());
        let url = format!("{path}{}", rng.pick(&queries));
        let mut request = srv.request(method.clone(), &url);
        if let Some(auth) = rng.pick(&auths) {
            request = request.header(AUTHORIZATION, auth);
        }
        if let Some(key) = rng.pick(&dev_keys) {
            request = request.header(DEV_KEY_HEADER, key);
        }
        if let Some(ct) = rng.pick(&content_types) {
            request = request.header(CONTENT_TYPE, *ct);
        }
        let body = match rng.below(4) {
            0 => rng.bytes(4096),
            1 => rng.pick(&json_bodies).to_vec(),
            2 => {
                let mut png = images::png(16, 16);
                let at = rng.below(png.len());
                png[at] ^= 0xFF;
                png
            }
            _ => Vec::new(),
        };
        if rng.below(3) == 0 {
            // Odd but legal header bytes.
            request = request.header(
                "x-odd",
                reqwest::header::HeaderValue::from_bytes(b"\xFF\xFE\t x").unwrap(),
            );
        }
        let res = request
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("round {round}: {method} {url}: no answer: {e}"));
        let status = res.status();
        let content_type = header_str(&res, CONTENT_TYPE);
        assert!(
            !status.is_server_error(),
            "round {round}: {method} {url} got {status}: {}",
            res.text().await.unwrap_or_default()
        );
        if status.is_client_error() {
            assert_eq!(
                content_type.as_deref(),
                Some(PROBLEM_JSON),
                "round {round}: {method} {url} got a {status} that is not a problem"
            );
        }
    }

    // Malformed HTTP straight onto the socket.
    let addr = srv.base_url.trim_start_matches("http://").to_owned();
    let key = &srv.dev_key;
    let big_chunk = format!("{:x}\r\n{}\r\n0\r\n\r\n", 70 * 1024, "a".repeat(70 * 1024));
    // (what, request, close our side after sending, expected status)
    let raw: Vec<(&str, String, bool, Option<&str>)> = vec![
        ("garbage", "GARBAGE\r\n\r\n".into(), false, None),
        (
            "bad length",
            "GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".into(),
            false,
            None,
        ),
        (
            "truncated body",
            format!(
                "POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\n{DEV_KEY_HEADER}: {key}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"descr"
            ),
            true,
            Some("400"),
        ),
        (
            "bad chunk",
            format!(
                "POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\n{DEV_KEY_HEADER}: {key}\r\n\
                 Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n"
            ),
            true,
            Some("400"),
        ),
        (
            "chunked body over 64 KiB",
            format!(
                "POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\n{DEV_KEY_HEADER}: {key}\r\n\
                 Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\
                 Connection: close\r\n\r\n{big_chunk}"
            ),
            false,
            Some("413"),
        ),
        (
            "NUL in a header",
            "GET /livez HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n".into(),
            false,
            None,
        ),
        ("HTTP/0.9", "GET /livez\r\n\r\n".into(), false, None),
    ];
    let tasks_before = srv.counts().await.tasks;
    for (what, request, half_close, expected) in raw {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        if half_close {
            stream.shutdown().await.unwrap();
        }
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        answer.extend_from_slice(&buf[..n]);
                        if answer.windows(4).any(|w| w == b"\r\n\r\n") && !half_close {
                            break;
                        }
                    }
                }
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "{what}: the server neither answered nor closed"
        );
        let head = String::from_utf8_lossy(&answer);
        let status = head.strip_prefix("HTTP/1.1 ").map(|s| &s[..3]);
        if let Some(status) = status {
            assert!(!status.starts_with('5'), "{what}: {head}");
        }
        if let Some(expected) = expected {
            assert_eq!(status, Some(expected), "{what}: {head}");
        }
    }
    assert_eq!(
        srv.counts().await.tasks,
        tasks_before,
        "malformed requests created tasks"
    );

    // Still serving, and the task is intact.
    srv.assert_live().await;
    srv.task(t.task_id, &t.agent_token).await;
}
