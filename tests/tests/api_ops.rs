//! What an operator sees: probes, Prometheus metrics labelled by route
//! template, a 503 (not a 500, not a hang) while the database is
//! unavailable, and database contents that reveal no credential.

use std::time::{Duration, Instant};

use meatspace_store::ConnectOptions;
use meatspace_tests::server::{Expect, PROBLEM_JSON, TestServer, header_str};
use meatspace_tests::{Db, POSTGRES_ENV, TestDb};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::Connection;
use uuid::Uuid;

meatspace_tests::api_tests!(
    probes_answer_and_metrics_name_route_templates,
    methods_a_client_invents_do_not_grow_the_metrics,
    an_unavailable_database_gets_503_not_500,
    the_database_holds_no_credential,
);

/// The route-template labels are read from a server process of this test's
/// own: the in-process test servers share one metrics registry, so there
/// the other backend's variant (or any other test) could supply the counts
/// this test looks for.
async fn probes_answer_and_metrics_name_route_templates(db: Db) {
    use meatspace_tests::process::{Binary, DevApi, ServerProcess};
    const KEY: &str = "msd_ops-metrics-test-key-0123456789";
    let test_db = TestDb::new(db).await;
    let mut api = ServerProcess::start(
        Binary::ApiServer,
        &[
            ("DATABASE_URL", &test_db.url),
            ("MEATSPACE_DEV_KEY", KEY),
            (
                "MEATSPACE_SECRET_KEY",
                "ops-metrics-test-server-key-of-at-least-32-characters",
            ),
        ],
    );
    api.ready().await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for probe in ["/livez", "/readyz"] {
        let res = http.get(api.url(probe)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{probe}");
    }
    // A task created, published, claimed and started, then read.
    let dev = DevApi::new(&api.base_url(), KEY);
    let (task, token, _) = dev.active_task("Measure the shed", "Ada").await;
    let ok = |req: reqwest::RequestBuilder| async move {
        let res = req.send().await.unwrap();
        let status = res.status();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        assert!(status.is_success(), "{status}: {body}");
        body
    };
    for path in [
        format!("/api/v1/tasks/{task}"),
        format!("/api/v1/tasks/{task}/events?after=0"),
    ] {
        ok(http.get(api.url(&path)).bearer_auth(&token)).await;
    }
    let stray = format!("/api/v1/tasks/{}/nonsense", Uuid::new_v4());
    let res = http.get(api.url(&stray)).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    let res = meatspace_tests::process_metrics(&http, &api).await;
    assert!(
        header_str(&res, CONTENT_TYPE).is_some_and(|c| c.starts_with("text/plain")),
        "Prometheus text format"
    );
    let text = res.text().await.unwrap();
    let requests: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("meatspace_http_requests_total{"))
        .collect();
    for route in [
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/events",
        "/api/v1/worker/tasks/{task_id}/start",
        "/api/v1/tasks",
    ] {
        assert!(
            requests
                .iter()
                .any(|l| l.contains(&format!("route=\"{route}\""))),
            "no request count for {route}:\n{}",
            requests.join("\n")
        );
    }
    assert!(
        requests.iter().any(|l| l.contains("status=\"200\"")),
        "{requests:?}"
    );
    for line in text.lines().filter(|l| l.starts_with("meatspace_http")) {
        assert!(
            !has_uuid(line),
            "a metric is labelled with a raw id: {line}"
        );
    }
    assert!(
        !text.contains("nonsense"),
        "unmatched paths must not become labels"
    );
    assert!(api.terminate().await, "the server did not stop cleanly");
}

/// Any token is a valid method: before the fix each one sent became a new
/// label value, so anonymous clients grew `/metrics` without bound.
async fn methods_a_client_invents_do_not_grow_the_metrics(db: Db) {
    let srv = TestServer::start(db).await;
    let invented: Vec<String> = (0..30)
        .map(|_| format!("M{}", Uuid::new_v4().simple()).to_uppercase())
        .collect();
    for method in &invented {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let res = srv.request(method, "/api/v1/tasks").send().await.unwrap();
        assert!(res.status().is_client_error(), "{}", res.status());
    }
    let text = srv.metrics().send().await.unwrap().text().await.unwrap();
    for method in &invented {
        assert!(!text.contains(method.as_str()), "{method} became a label");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("meatspace_http_requests_total{")
                && l.contains("method=\"other\"")),
        "no series for the invented methods:\n{text}"
    );
    srv.stop().await;
}

/// Whether `s` contains a UUID, hyphenated or not.
fn has_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    let hyphenated = b.windows(36).any(|w| {
        w.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
    });
    let simple = b.windows(32).any(|w| w.iter().all(u8::is_ascii_hexdigit));
    hyphenated || simple
}

#[test]
fn off_loopback_the_server_needs_a_public_url() {
    // Listening beyond loopback without MEATSPACE_PUBLIC_URL, links and
    // cookies would trust the client's Host and X-Forwarded-Proto: the
    // binary refuses to start, before it opens any database; a malformed
    // public URL is refused the same way.
    let api = meatspace_tests::process::Binary::ApiServer.path();
    let dir = tempfile::tempdir().unwrap();
    // A database the server could open (its directory exists), so that the
    // refusal is the public URL's and the file shows it was never opened.
    let database = dir.path().join("never-opened.db");
    let database_url = format!("sqlite://{}", database.display());
    for (listen, public, expect) in [
        ("0.0.0.0:0", None, "MEATSPACE_PUBLIC_URL is not set"),
        (
            "127.0.0.1:0",
            Some("https://m.example/app"),
            "must be an origin",
        ),
        (
            "0.0.0.0:0",
            Some("ftp://m.example"),
            "must use http or https",
        ),
    ] {
        let mut cmd = std::process::Command::new(&api);
        cmd.env_clear()
            .current_dir(dir.path())
            .env("MEATSPACE_LISTEN_ADDR", listen)
            .env("DATABASE_URL", &database_url);
        if let Some(url) = public {
            cmd.env("MEATSPACE_PUBLIC_URL", url);
        }
        let out = cmd.output().expect("run the API server");
        assert!(!out.status.success(), "started with {listen} {public:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{listen} {public:?}: {err}");
        assert!(
            !database.exists(),
            "{listen} {public:?}: the database was opened"
        );
    }
}

#[test]
fn uuid_detection_works() {
    assert!(has_uuid(&format!("route=\"/a/{}\"", Uuid::new_v4())));
    assert!(has_uuid(&Uuid::new_v4().simple().to_string()));
    assert!(!has_uuid("route=\"/api/v1/tasks/{task_id}\" 12345678"));
}

/// Expects a 503 problem for the request, within `bound`.
async fn expect_unavailable(request: reqwest::RequestBuilder, bound: Duration, what: &str) {
    let started = Instant::now();
    let res = request.send().await.unwrap();
    let took = started.elapsed();
    let status = res.status();
    let retry_after = header_str(&res, RETRY_AFTER);
    let content_type = header_str(&res, CONTENT_TYPE);
    let body = res.text().await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{what}: {body}");
    assert_eq!(content_type.as_deref(), Some(PROBLEM_JSON), "{what}");
    assert!(body.contains("/database-unavailable"), "{what}: {body}");
    assert!(retry_after.is_some(), "{what}: a 503 says when to retry");
    assert!(took < bound, "{what} took {took:?}");
}

/// Polls until `path` answers `status`; panics after `bound`.
async fn wait_for(srv: &TestServer, path: &str, status: StatusCode, bound: Duration) {
    let what = format!("{path} answers {status}");
    meatspace_tests::eventually(bound, &what, || async {
        let res = srv.get(path).send().await.unwrap();
        (res.status() == status).then_some(())
    })
    .await;
}

async fn an_unavailable_database_gets_503_not_500(db: Db) {
    let srv = TestServer::start_configured(db, |o| {
        o.connect = ConnectOptions {
            max_connections: 4,
            acquire_timeout: Duration::from_secs(1),
        }
    })
    .await;
    let (id, token) = srv.create_task("Before the outage").await;
    wait_for(&srv, "/readyz", StatusCode::OK, Duration::from_secs(5)).await;
    let bound = Duration::from_secs(5);
    let create = || {
        srv.dev(Method::POST, "/api/v1/tasks")
            .json(&json!({ "description": "during the outage" }))
    };
    match db {
        Db::Postgres => {
            // The database refuses connections and drops the ones it has.
            let name = srv.db.url.rsplit('/').next().unwrap().to_owned();
            let admin_url = std::env::var(POSTGRES_ENV).unwrap();
            let mut admin = sqlx::PgConnection::connect(&admin_url).await.unwrap();
            sqlx::query(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
                .execute(&mut admin)
                .await
                .unwrap();
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            )
            .bind(&name)
            .execute(&mut admin)
            .await
            .unwrap();

            wait_for(&srv, "/readyz", StatusCode::SERVICE_UNAVAILABLE, bound).await;
            expect_unavailable(srv.get("/readyz"), bound, "readyz").await;
            expect_unavailable(
                srv.agent(&token).get(&format!("/api/v1/tasks/{id}")),
                bound,
                "get task",
            )
            .await;
            expect_unavailable(create(), bound, "create task").await;
            expect_unavailable(
                srv.dev(Method::POST, "/api/v1/workers")
                    .json(&json!({ "name": "n" })),
                bound,
                "register worker",
            )
            .await;
            // The process itself is fine.
            let livez = srv.get("/livez").send().await.unwrap();
            assert_eq!(livez.status(), StatusCode::OK);

            sqlx::query(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
                .execute(&mut admin)
                .await
                .unwrap();
            wait_for(&srv, "/readyz", StatusCode::OK, Duration::from_secs(10)).await;
        }
        Db::Sqlite => {
            // Another process holds the write lock longer than the server
            // waits for it. Reads go on; writes are refused with 503.
            let options: sqlx::sqlite::SqliteConnectOptions = srv.db.url.parse().unwrap();
            let mut locker = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            sqlx::query("BEGIN EXCLUSIVE")
                .execute(&mut locker)
                .await
                .unwrap();

            expect_unavailable(create(), bound, "create task").await;
            expect_unavailable(
                srv.agent(&token)
                    .post(&format!("/api/v1/tasks/{id}/publish")),
                bound,
                "publish",
            )
            .await;
            srv.get("/readyz")
                .send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap();
            assert_eq!(srv.task(id, &token).await["state"], "draft");

            sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
            locker.close().await.unwrap();
        }
    }
    // Back to normal, with nothing lost or half-written.
    assert_eq!(srv.task(id, &token).await["state"], "draft");
    assert_eq!(srv.counts().await.tasks, 1);
    srv.publish(id, &token).await;
    create().expect_json(StatusCode::CREATED).await;
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

async fn the_database_holds_no_credential(db: Db) {
    let srv = TestServer::start(db).await;
    let marker = format!("dump-marker-{}", Uuid::new_v4().simple());
    let t = srv.active_task(&marker).await;
    srv.message(
        t.task_id,
        &t.worker_token,
        &format!("{marker} from the worker"),
    )
    .await;
    let bytes = meatspace_tests::stored_bytes(srv.backend, &srv.db.url).await;
    assert!(
        meatspace_tests::contains(&bytes, marker.as_bytes()),
        "the dump does not hold the test's data; it proves nothing"
    );
    for (what, secret) in [
        ("agent token", t.agent_token.as_str()),
        ("worker token", t.worker_token.as_str()),
        ("development key", srv.dev_key.as_str()),
    ] {
        // The random part alone (after the `mst_<id>_` prefix) must not be
        // there either, nor a hex encoding of the whole.
        let random_part = &secret[secret.len() - 43..];
        for form in [secret.to_owned(), random_part.to_owned(), hex(secret)] {
            assert!(
                !meatspace_tests::contains(&bytes, form.as_bytes()),
                "the database holds the {what}"
            );
        }
    }
}

/// The binary at `RUST_LOG=debug` logged each request's URI, so invite
/// codes (`msi_…`, a credential) reached the logs; and it served
/// `/metrics` on its public port. Now the request span carries the path
/// with credentials redacted, and `/metrics` answers only on the metrics
/// listener.
#[tokio::test]
async fn the_binary_logs_no_invite_code_and_serves_metrics_apart() {
    use meatspace_tests::process::{Binary, ServerProcess};
    let dev_key = "msd_logs-test-key-0123456789abcdef";
    let mut api = ServerProcess::start(
        Binary::ApiServer,
        &[("RUST_LOG", "debug"), ("MEATSPACE_DEV_KEY", dev_key)],
    );
    api.ready().await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let created: serde_json::Value = client
        .post(api.url("/api/v1/workers/invites"))
        .header("x-meatspace-dev-key", dev_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = created["invite_url"]
        .as_str()
        .expect("invite_url")
        .to_owned();
    let code = url.rsplit('/').next().unwrap().to_owned();
    assert!(code.starts_with("msi_"), "{url}");
    let path = format!("/app/invite/{code}");
    let page = client.get(api.url(&path)).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    // The span of that request is logged (at debug) before the answer is
    // sent, so the log holds it now.
    let logs = api.logs();
    assert!(!logs.contains(&code), "the invite code is logged:\n{logs}");
    assert!(
        logs.contains("/app/invite/<redacted>"),
        "the request span is not logged:\n{logs}"
    );
    // `msi_<id>_<secret>`; the secret itself may hold `_`.
    let secret = code.splitn(3, '_').nth(2).unwrap();
    assert!(!logs.contains(secret), "the invite secret is logged");
    assert!(!logs.contains(dev_key), "the dev key is logged");

    let metrics = meatspace_tests::process_metrics(&client, &api).await;
    assert!(
        metrics
            .text()
            .await
            .unwrap()
            .contains("meatspace_http_requests_total"),
        "no request counts on the metrics listener"
    );
    let public = client.get(api.url("/metrics")).send().await.unwrap();
    assert_eq!(
        public.status(),
        StatusCode::NOT_FOUND,
        "/metrics on the public port"
    );
    assert!(api.terminate().await, "the server did not stop cleanly");
}
