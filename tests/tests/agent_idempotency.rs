//! `Idempotency-Key` on the state-changing POSTs: one task for many
//! identical concurrent creates, every answer carrying the same task and a
//! working token; replays across a real server restart; 422 for a reused
//! key, 409 while the first request is in flight; keys scoped to the
//! principal (and, for the shared development key, to the client's id);
//! nothing buffered or recorded for requests that do not authenticate or
//! are not the API's; each route's body limit; answers too large to record
//! given whole; no token readable from the database.

use std::str::FromStr;

use axum::http::{HeaderMap, HeaderValue, Method as HttpMethod, Uri};
use chrono::TimeDelta;
use meatspace_api::auth::Principal;
use meatspace_api::http::idempotency::{CLIENT_ID, MAX_RECORDED_BYTES, fingerprint, scope_of};
use meatspace_domain::clock;
use meatspace_store::{idempotency::IdempotencyBegin, idempotency::IdempotencyClaim};
use meatspace_tests::Db;
use meatspace_tests::process::{Binary, ServerProcess};
use meatspace_tests::server::{
    DEV_KEY_HEADER, Expect, TestServer, header_str, row_counts, str_at, task_and_token, uuid_at,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::Connection;

meatspace_tests::api_tests!(
    concurrent_identical_creates_make_one_task_and_hand_back_a_working_token,
    a_replay_survives_a_server_restart,
    a_reused_key_with_another_request_is_refused,
    a_key_in_flight_elsewhere_is_a_conflict_until_released_or_abandoned,
    keys_are_scoped_to_the_credential,
    agents_sharing_the_dev_key_never_get_each_others_answers,
    requests_that_do_not_authenticate_or_are_not_the_apis_record_nothing,
    each_route_keeps_its_own_body_limit_under_a_key,
    an_answer_too_large_to_record_is_given_whole_and_not_recorded,
    worker_and_agent_actions_replay_without_acting_twice,
    the_database_holds_no_readable_token,
);

const KEY: &str = "idempotency-key";
const REPLAYED: &str = "idempotency-replayed";

/// A create request with `key`.
fn create(server: &TestServer, key: &str, description: &str) -> reqwest::RequestBuilder {
    server
        .dev(Method::POST, "/api/v1/tasks")
        .header(KEY, key)
        .json(&json!({ "description": description }))
}

/// Sends until the answer is not 409 (the first request still in flight).
async fn until_settled(req: impl Fn() -> reqwest::RequestBuilder) -> reqwest::Response {
    meatspace_tests::eventually(
        std::time::Duration::from_secs(30),
        "the first request settles",
        || async {
            let res = req().send().await.expect("send");
            (res.status() != StatusCode::CONFLICT).then_some(res)
        },
    )
    .await
}

async fn token_works(server: &TestServer, id: uuid::Uuid, token: &str) {
    server
        .agent(token)
        .get_json(&format!("/api/v1/tasks/{id}"))
        .await;
}

async fn concurrent_identical_creates_make_one_task_and_hand_back_a_working_token(db: Db) {
    let server = TestServer::start(db).await;
    let answers = futures::future::join_all((0..16).map(|_| async {
        let res = create(&server, "create-once", "Deliver the parcel")
            .send()
            .await
            .expect("send");
        let status = res.status();
        let replayed = header_str(&res, REPLAYED);
        let body: Value = res.json().await.expect("JSON");
        (status, replayed, body)
    }))
    .await;
    let mut created = Vec::new();
    for (status, replayed, body) in &answers {
        match *status {
            StatusCode::CREATED => created.push((replayed.clone(), body.clone())),
            // Still in flight when this one arrived.
            StatusCode::CONFLICT => {
                assert_eq!(
                    body["type"],
                    "https://meatspace.dev/problems/idempotency-key-in-flight"
                );
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(!created.is_empty());
    // Retry the refused ones: each now gets the recorded answer.
    for _ in created.len()..16 {
        let res = until_settled(|| create(&server, "create-once", "Deliver the parcel")).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let replayed = header_str(&res, REPLAYED);
        created.push((replayed, res.json().await.unwrap()));
    }
    let first = &created
        .iter()
        .find(|(r, _)| r.is_none())
        .expect("one original answer")
        .1;
    assert_eq!(
        created.iter().filter(|(r, _)| r.is_none()).count(),
        1,
        "exactly one request ran"
    );
    for (replayed, body) in &created {
        assert_eq!(body, first, "every answer is the first one");
        if replayed.is_some() {
            assert_eq!(replayed.as_deref(), Some("true"));
        }
    }
    let id = uuid_at(first, "/task/id");
    token_works(&server, id, &str_at(first, "/agent_token")).await;
    assert_eq!(server.counts().await.tasks, 1, "exactly one task");
}

/// The first request reaches one server process; the retry reaches a new
/// process on the same database (and, for SQLite, the key file it
/// generated in its data directory).
async fn a_replay_survives_a_server_restart(db: Db) {
    let dev_key = "msd_restart-test-development-key-0123456789";
    let test_db = meatspace_tests::TestDb::new(db).await;
    let data_dir = tempfile::tempdir().unwrap();
    let data_dir_str = data_dir.path().display().to_string();
    let mut env = vec![
        ("MEATSPACE_DEV_KEY", dev_key),
        ("MEATSPACE_EMBEDDED_CONTROLLER", "never"),
    ];
    match db {
        // The embedded default: no DATABASE_URL, no key configured; both
        // live in the data directory.
        Db::Sqlite => env.push(("MEATSPACE_DATA_DIR", &data_dir_str)),
        Db::Postgres => {
            env.push(("DATABASE_URL", &test_db.url));
            env.push((
                "MEATSPACE_SECRET_KEY",
                "a-test-secret-key-of-at-least-32-characters",
            ));
        }
    }
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let send = |base: String| {
        client
            .post(format!("{base}/api/v1/tasks"))
            .header(DEV_KEY_HEADER, dev_key)
            .header(KEY, "survives-restart")
            .json(&json!({ "description": "Read the gas meter" }))
            .send()
    };

    let mut first = ServerProcess::start(Binary::ApiServer, &env);
    first.ready().await;
    let res = send(first.base_url()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let original: Value = res.json().await.unwrap();
    assert!(first.terminate().await, "{}", first.logs());

    let mut second = ServerProcess::start(Binary::ApiServer, &env);
    second.ready().await;
    let res = send(second.base_url()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(header_str(&res, REPLAYED).as_deref(), Some("true"));
    let replayed: Value = res.json().await.unwrap();
    assert_eq!(replayed, original);
    let id = uuid_at(&original, "/task/id");
    let token = str_at(&original, "/agent_token");
    let res = client
        .get(format!("{}/api/v1/tasks/{id}", second.base_url()))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the replayed token works");
    // Still one task, in the database both processes used.
    let url = match db {
        Db::Sqlite => format!("sqlite://{data_dir_str}/meatspace.db"),
        Db::Postgres => test_db.url.clone(),
    };
    assert_eq!(
        row_counts(db, &url).await.tasks,
        1,
        "the replay after the restart created a task"
    );
    drop(second);
}

async fn a_reused_key_with_another_request_is_refused(db: Db) {
    let server = TestServer::start(db).await;
    create(&server, "k1", "Walk the dog")
        .expect_json(StatusCode::CREATED)
        .await;
    let problem = create(&server, "k1", "Walk the other dog")
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert_eq!(
        problem["type"],
        "https://meatspace.dev/problems/idempotency-key-reused"
    );
    // Another path with the same key and credential is another request too.
    server
        .dev(Method::POST, "/api/v1/workers")
        .header(KEY, "k1")
        .json(&json!({ "name": "Ada" }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert_eq!(server.counts().await.tasks, 1);
    assert_eq!(server.counts().await.workers, 0);
    // Malformed keys are refused before anything runs.
    for bad in ["", &"x".repeat(256)] {
        create(&server, bad, "Walk the dog")
            .expect_problem(StatusCode::BAD_REQUEST)
            .await;
    }
    assert_eq!(server.counts().await.tasks, 1);
}

/// Another replica holds the key (its request is running): this one is
/// told 409 and changes nothing. Once that claim is released, or its lease
/// has run out because its process died, the request runs.
async fn a_key_in_flight_elsewhere_is_a_conflict_until_released_or_abandoned(db: Db) {
    let server = TestServer::start(db).await;
    let body = serde_json::to_vec(&json!({ "description": "Paint the gate" })).unwrap();
    let claim_for = |key: &str, lease: TimeDelta| {
        let mut h = HeaderMap::new();
        h.insert(
            DEV_KEY_HEADER,
            HeaderValue::from_str(&server.dev_key).unwrap(),
        );
        h.insert("content-type", HeaderValue::from_static("application/json"));
        IdempotencyClaim {
            scope: scope_of(Principal::DevKey, &h),
            key: key.to_owned(),
            fingerprint: fingerprint(
                &HttpMethod::POST,
                &Uri::from_str("/api/v1/tasks").unwrap(),
                &h,
                &body,
            ),
            now: clock::now(),
            lease,
            ttl: TimeDelta::hours(24),
        }
    };
    let send = |key: &str| {
        server
            .dev(Method::POST, "/api/v1/tasks")
            .header(KEY, key)
            .header("content-type", "application/json")
            .body(body.clone())
    };

    let held = claim_for("held", TimeDelta::seconds(60));
    assert_eq!(
        server.store.idempotency_begin(&held).await.unwrap(),
        IdempotencyBegin::Started
    );
    let problem = send("held").expect_problem(StatusCode::CONFLICT).await;
    assert_eq!(
        problem["type"],
        "https://meatspace.dev/problems/idempotency-key-in-flight"
    );
    assert_eq!(server.counts().await.tasks, 0);
    server
        .store
        .idempotency_release(&held.scope, &held.key)
        .await
        .unwrap();
    send("held").expect_json(StatusCode::CREATED).await;

    // A claim whose lease ran out (its process died) is taken over.
    let abandoned = claim_for("abandoned", TimeDelta::milliseconds(-1));
    server.store.idempotency_begin(&abandoned).await.unwrap();
    send("abandoned").expect_json(StatusCode::CREATED).await;
    assert_eq!(server.counts().await.tasks, 2);
}

async fn keys_are_scoped_to_the_credential(db: Db) {
    let server = TestServer::start(db).await;
    // The same key under the dev key, then under two agent tokens.
    let a = create(&server, "shared", "Task A")
        .expect_json(StatusCode::CREATED)
        .await;
    let (id_a, token_a) = task_and_token(&a);
    let (id_b, token_b) = server.create_task("Task B").await;
    for (id, token) in [(id_a, &token_a), (id_b, &token_b)] {
        let change = server
            .agent(token)
            .post(&format!("/api/v1/tasks/{id}/publish"))
            .header(KEY, "shared")
            .expect_json(StatusCode::OK)
            .await;
        assert_eq!(
            uuid_at(&change, "/task/id"),
            id,
            "not another credential's answer"
        );
    }
    // Two workers claim two tasks with one key.
    let (_, w1) = server.register_worker("Ada").await;
    let (_, w2) = server.register_worker("Grace").await;
    for (id, token) in [(id_a, &w1), (id_b, &w2)] {
        server
            .worker(token)
            .post(&format!("/api/v1/worker/tasks/{id}/claim"))
            .header(KEY, "shared")
            .expect_json(StatusCode::OK)
            .await;
    }
}

/// Every agent shares the development key: agent B sending agent A's key
/// and body used to get A's task and A's working agent token back. With
/// their own client ids, each gets its own answer; A's retry still replays.
async fn agents_sharing_the_dev_key_never_get_each_others_answers(db: Db) {
    let server = TestServer::start(db).await;
    let as_client = |client: Option<&str>| {
        let req = create(&server, "retry-1", "Fetch the milk");
        match client {
            Some(id) => req.header(CLIENT_ID, id),
            None => req,
        }
    };
    let a = as_client(Some("agent-a"))
        .expect_json(StatusCode::CREATED)
        .await;
    let mut seen = vec![uuid_at(&a, "/task/id")];
    for other in [Some("agent-b"), None] {
        let res = as_client(other).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::CREATED, "{other:?}");
        assert_eq!(header_str(&res, REPLAYED), None, "{other:?} got a replay");
        let body: Value = res.json().await.unwrap();
        assert_ne!(str_at(&body, "/agent_token"), str_at(&a, "/agent_token"));
        seen.push(uuid_at(&body, "/task/id"));
    }
    seen.dedup();
    assert_eq!(seen.len(), 3, "three agents, three tasks: {seen:?}");
    let retry = as_client(Some("agent-a")).send().await.unwrap();
    assert_eq!(header_str(&retry, REPLAYED).as_deref(), Some("true"));
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry, a, "A's retry is A's answer");
}

/// Evaluates `$query`, which reads through `&mut $conn`, on a connection
/// to the server's own database, of either backend (SQLite read-only).
macro_rules! on_server_db {
    ($server:expr, |$conn:ident| $query:expr) => {
        match $server.backend {
            Db::Postgres => {
                let mut $conn = sqlx::PgConnection::connect(&$server.db.url).await.unwrap();
                $query
            }
            Db::Sqlite => {
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(&$server.db.url)
                    .unwrap()
                    .read_only(true);
                let mut $conn = sqlx::SqliteConnection::connect_with(&options)
                    .await
                    .unwrap();
                $query
            }
        }
    };
}

/// Rows of the idempotency table.
async fn recorded_keys(server: &TestServer) -> i64 {
    let sql = "SELECT COUNT(*) FROM idempotency_keys";
    on_server_db!(server, |conn| sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .unwrap())
}

/// The middleware used to run before authentication, on every route: any
/// `Authorization` value with a key made it buffer the body and record
/// the answer (50 anonymous requests wrote 50 rows). Now only the API's
/// POSTs from a verified principal are recorded, and only answers that
/// say something lasting about the request.
async fn requests_that_do_not_authenticate_or_are_not_the_apis_record_nothing(db: Db) {
    let server = TestServer::start(db).await;
    let t = server.active_task("Walk the dog").await;
    let body = json!({ "description": "x" }).to_string();
    let forged = format!("mst_{}_forged", t.task_id);
    let mut requests = vec![
        // Not authenticated: a bogus token, a real task's id with a forged
        // secret, a wrong dev key.
        (
            "POST",
            "/api/v1/tasks".to_owned(),
            Some(("authorization", "Bearer nonsense".to_owned())),
        ),
        (
            "POST",
            format!("/api/v1/tasks/{}/cancel", t.task_id),
            Some(("authorization", format!("Bearer {forged}"))),
        ),
        (
            "POST",
            "/api/v1/tasks".to_owned(),
            Some((DEV_KEY_HEADER, "msd_wrong".to_owned())),
        ),
    ];
    // Not the API's state-changing routes.
    requests.extend(
        ["/nope", "/app/login", "/mcp", "/api/v1/capabilities"].map(|path| {
            (
                "POST",
                path.to_owned(),
                Some((DEV_KEY_HEADER, server.dev_key.clone())),
            )
        }),
    );
    for (i, (method, path, credential)) in requests.iter().enumerate() {
        let mut req = server
            .request(Method::from_bytes(method.as_bytes()).unwrap(), path)
            .header(KEY, format!("k-{i}"))
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some((name, value)) = credential {
            req = req.header(*name, value);
        }
        let res = req.send().await.unwrap();
        assert!(
            res.status().is_client_error(),
            "{method} {path}: {}",
            res.status()
        );
    }
    assert_eq!(
        recorded_keys(&server).await,
        0,
        "a request outside the API's POSTs was recorded"
    );
    // An answer that says nothing lasting (415: the type was wrong) is not
    // recorded either; the API's own answers are.
    let photo = format!("/api/v1/worker/tasks/{}/photos", t.task_id);
    server
        .worker(&t.worker_token)
        .post(&photo)
        .header(KEY, "photo-1")
        .header("content-type", "text/plain")
        .body("not an image")
        .expect_problem(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        .await;
    assert_eq!(recorded_keys(&server).await, 0, "a 415 was recorded");
    server
        .agent(&t.agent_token)
        .post(&format!("/api/v1/tasks/{}/cancel", t.task_id))
        .header(KEY, "cancel-1")
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(recorded_keys(&server).await, 1);
}

/// The middleware buffered every keyed body up to the photo limit; now each
/// route keeps its own: a photo larger than a JSON body is accepted on the
/// photo route, and a JSON route refuses more than 64 KiB.
async fn each_route_keeps_its_own_body_limit_under_a_key(db: Db) {
    let server = TestServer::start(db).await;
    let t = server.active_task("Photograph the roof").await;
    let photo = meatspace_tests::server::images::noisy_png(200, 200);
    assert!(
        photo.len() > meatspace_api::MAX_JSON_BYTES,
        "{}",
        photo.len()
    );
    server
        .worker(&t.worker_token)
        .post(&format!("/api/v1/worker/tasks/{}/photos", t.task_id))
        .header(KEY, "big-photo")
        .header("content-type", "image/png")
        .body(photo)
        .expect_json(StatusCode::OK)
        .await;
    let long = "x".repeat(meatspace_api::MAX_JSON_BYTES + 1);
    server
        .worker(&t.worker_token)
        .post(&format!("/api/v1/worker/tasks/{}/messages", t.task_id))
        .header(KEY, "big-message")
        .json(&json!({ "text": long }))
        .expect_problem(StatusCode::PAYLOAD_TOO_LARGE)
        .await;
}

/// A recorded answer larger than 1 MiB came back as 500. The API's own
/// answers are far smaller, so a route of the test's own, behind the real
/// middleware and store, gives one.
async fn an_answer_too_large_to_record_is_given_whole_and_not_recorded(db: Db) {
    use axum::routing::post;
    let options = meatspace_tests::server::ServerOptions::default();
    let test_db = meatspace_tests::TestDb::new(db).await;
    let (state, dev_key) = meatspace_tests::server::app_state(&test_db, &options).await;
    let store = std::sync::Arc::clone(&state.store);
    let big = "x".repeat(MAX_RECORDED_BYTES + 1);
    let app = axum::Router::new()
        .route("/api/v1/big", post(move || async move { big }))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            meatspace_api::http::idempotency::middleware,
        ))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(meatspace_api::serve(
        listener,
        app,
        meatspace_api::ServeOptions::default(),
        std::future::pending::<()>(),
    ));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for _ in 0..2 {
        let res = client
            .post(format!("http://{addr}/api/v1/big"))
            .header(DEV_KEY_HEADER, &dev_key)
            .header(KEY, "big-1")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            header_str(&res, REPLAYED),
            None,
            "not recorded, so not replayed"
        );
        assert_eq!(res.text().await.unwrap().len(), MAX_RECORDED_BYTES + 1);
    }
    // The claim was released: the key is free, nothing is kept.
    let claim = IdempotencyClaim {
        scope: scope_of(Principal::DevKey, &HeaderMap::new()),
        key: "big-1".to_owned(),
        fingerprint: [0; 32],
        now: clock::now(),
        lease: TimeDelta::seconds(60),
        ttl: TimeDelta::hours(24),
    };
    assert_eq!(
        store.idempotency_begin(&claim).await.unwrap(),
        IdempotencyBegin::Started
    );
}

async fn worker_and_agent_actions_replay_without_acting_twice(db: Db) {
    let server = TestServer::start(db).await;
    let t = server.active_task("Clean the windows").await;
    let worker = server.worker(&t.worker_token);
    let path = format!("/api/v1/worker/tasks/{}/messages", t.task_id);
    let send = || {
        worker
            .post(&path)
            .header(KEY, "msg-1")
            .json(&json!({ "text": "on my way" }))
    };
    let first = send().send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    let again = send().send().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(header_str(&again, REPLAYED).as_deref(), Some("true"));
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    let feed = server.feed(t.task_id, &t.agent_token).await;
    let messages = feed
        .iter()
        .filter(|e| e["type"] == "worker.message")
        .count();
    assert_eq!(messages, 1, "the message was sent once");

    // An error answer is replayed as well: the task is terminal after the
    // cancel, and the replay of the cancel says what the cancel said.
    let agent = server.agent(&t.agent_token);
    let cancel = || {
        agent
            .post(&format!("/api/v1/tasks/{}/cancel", t.task_id))
            .header(KEY, "cancel-1")
    };
    let first = cancel().expect_json(StatusCode::OK).await;
    let replay = cancel().send().await.unwrap();
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.json::<Value>().await.unwrap(), first);
    // Without the key the second cancel is refused as usual.
    agent
        .post(&format!("/api/v1/tasks/{}/cancel", t.task_id))
        .expect_problem(StatusCode::CONFLICT)
        .await;
}

/// The recorded answer of a create holds the agent token sealed: the
/// response column never contains it in plaintext.
async fn the_database_holds_no_readable_token(db: Db) {
    let server = TestServer::start(db).await;
    let created = create(&server, "dump-me", "Count the chairs")
        .expect_json(StatusCode::CREATED)
        .await;
    let token = str_at(&created, "/agent_token");
    // `mst_<task id>_<secret>`; the secret itself may contain `_`.
    let secret_part = token.splitn(3, '_').nth(2).unwrap().to_owned();
    assert!(secret_part.len() >= 40, "{token}");
    let sql = "SELECT response FROM idempotency_keys";
    let rows: Vec<Vec<u8>> = on_server_db!(server, |conn| sqlx::query_scalar(sql)
        .fetch_all(&mut conn)
        .await
        .unwrap());
    assert_eq!(rows.len(), 1);
    let raw = String::from_utf8_lossy(&rows[0]);
    assert!(
        !raw.contains(&secret_part),
        "the token is stored in plaintext"
    );
    assert!(
        !raw.contains("Count the chairs"),
        "the answer is stored in plaintext"
    );
    // And yet the replay hands it back.
    let replay = create(&server, "dump-me", "Count the chairs")
        .expect_json(StatusCode::CREATED)
        .await;
    assert_eq!(str_at(&replay, "/agent_token"), token);
}
