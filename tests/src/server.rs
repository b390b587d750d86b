//! The real API server for the HTTP suites.
//!
//! [`TestServer::start`] opens a fresh database of the chosen backend, builds
//! the application the way the binary does (`meatspace_api::router` served by
//! `meatspace_api::serve` on `127.0.0.1:0`) and gives the test an HTTP client
//! and a few helpers that talk to it like an agent or a worker would. Nothing
//! is mocked: requests cross a real socket into the real router and store.
//!
//! [`api_tests!`](crate::api_tests) turns `async fn name(db: Db)` tests into
//! one test per backend.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use meatspace_api::agent_integrations::Integrations;
use meatspace_api::auth::DevKey;
use meatspace_api::feed::Feed;
use meatspace_api::http::rate_limit::RateLimitSettings;
use meatspace_api::photo::PhotoLimits;
use meatspace_api::{AppState, ServeOptions, router, serve};
use meatspace_domain::Policy;
use meatspace_domain::clock::Clock;
use meatspace_store::ConnectOptions;
use meatspace_store::Store;
use meatspace_store::secret::ServerKey;
use meatspace_store_connect::connect;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use sqlx::Connection;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::{Db, TestDb};

/// Media type of every error the API returns.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// Prefix of the `type` of every problem document.
pub const PROBLEM_TYPE_BASE: &str = "https://meatspace.dev/problems/";
/// Header carrying the development key.
pub const DEV_KEY_HEADER: &str = "x-meatspace-dev-key";

/// Runs each listed `async fn name(db: Db)` once per backend, as
/// `postgres::name` and `sqlite::name`, on a multi-threaded runtime so that
/// concurrent requests really run in parallel: the one naming scheme of
/// every per-backend test. `api_tests!(group: a, b)` names a second group
/// of a file `group::postgres::a`; `api_tests!(threads = 2; a, b)` sets
/// the runtime's worker threads (4 unless said).
#[macro_export]
macro_rules! api_tests {
    ($group:ident: $($name:ident),+ $(,)?) => {
        mod $group {
            use super::*;
            $crate::api_tests!($($name),+);
        }
    };
    (threads = $threads:literal; $($name:ident),+ $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $name() {
                    super::$name($crate::Db::Postgres).await;
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $name() {
                    super::$name($crate::Db::Sqlite).await;
                }
            )+
        }
    };
    ($($name:ident),+ $(,)?) => {
        $crate::api_tests!(threads = 4; $($name),+);
    };
}

/// What a test may change about the server it starts.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub policy: Policy,
    pub photo_limits: PhotoLimits,
    pub connect: ConnectOptions,
    /// Off unless a test is about limiting: the suites send bursts.
    pub rate_limit: RateLimitSettings,
    pub serve: ServeOptions,
    /// Server key, heartbeat, idempotency window, webhook allow-list.
    pub integrations: Integrations,
    /// `Host` headers `/mcp` accepts (the binary's default: loopback).
    pub mcp_allowed_hosts: meatspace_mcp::AllowedHosts,
    /// `MEATSPACE_PUBLIC_URL` (default: none, as on loopback).
    pub public_origin: meatspace_api::public_url::PublicOrigin,
    /// `MEATSPACE_DEV_KEY_ENABLED` (the binary's default: on).
    pub dev_key_enabled: bool,
    /// The server's clock: adjustable, so that a test passes a deadline by
    /// moving it ([`TestServer::advance_clock`]) instead of waiting. Give
    /// the same clock to a controller that should see the same time.
    pub clock: Clock,
}

impl Default for ServerOptions {
    /// The binary's defaults.
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            photo_limits: PhotoLimits::new(10 * 1024 * 1024, 8192),
            connect: ConnectOptions::default(),
            rate_limit: RateLimitSettings::OFF,
            serve: ServeOptions::default(),
            integrations: Integrations::new(ServerKey::generate().0),
            mcp_allowed_hosts: Default::default(),
            public_origin: meatspace_api::public_url::PublicOrigin::FromRequest,
            dev_key_enabled: true,
            clock: Clock::adjustable(),
        }
    }
}

/// The state the binary builds, on `db` with `options`, and the
/// development key it accepts: for tests that serve a router of their own
/// around the real middleware.
pub async fn app_state(db: &TestDb, options: &ServerOptions) -> (AppState, String) {
    let store = connect(&db.url, options.policy, &options.connect)
        .await
        .expect("open the store");
    let dev_key = DevKey::generate();
    let state = AppState::build(
        store,
        meatspace_api::Settings {
            clock: options.clock.clone(),
            dev_key: DevKey::new(&dev_key).with_enabled(options.dev_key_enabled),
            policy: options.policy,
            photo_limits: options.photo_limits.clone(),
            rate_limit: options.rate_limit,
            integrations: options.integrations.clone(),
            mcp_allowed_hosts: options.mcp_allowed_hosts.clone(),
            public_origin: options.public_origin.clone(),
        },
    );
    (state, dev_key)
}

/// A running API server on its own fresh database.
#[derive(Debug)]
pub struct TestServer {
    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub base_url: String,
    /// The metrics listener's `http://127.0.0.1:<port>` (the binary serves
    /// `/metrics` on an address of its own, as this does).
    pub metrics_url: String,
    /// The development key the server accepts (random per server).
    pub dev_key: String,
    pub client: reqwest::Client,
    /// The server's own store, for checking what was (not) written.
    pub store: Arc<dyn Store>,
    pub backend: Db,
    /// Keeps the database (and the SQLite directory) alive.
    pub db: TestDb,
    /// The server's long-poll hub: [`Feed::waiting`] tells a test when its
    /// long polls are really waiting, so it need not sleep to let them settle.
    pub feed: Feed,
    pub options: ServerOptions,
    shutdown: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Moves the server's clock (and every controller given it) `by`
    /// ahead: a deadline passes at once.
    pub fn advance_clock(&self, by: chrono::TimeDelta) {
        self.options.clock.advance(by);
    }

    /// Moves the server's clock just past `t`, unless it is past already.
    pub fn advance_clock_past(&self, t: chrono::DateTime<chrono::Utc>) {
        let now = self.now();
        if now <= t {
            self.advance_clock(t - now + chrono::TimeDelta::milliseconds(1));
        }
    }

    /// The time on the server's clock.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.options.clock.now()
    }

    /// A server with the binary's default settings.
    pub async fn start(db: Db) -> TestServer {
        TestServer::start_with(db, ServerOptions::default()).await
    }

    /// A server with its own deadlines (e.g. short timeouts).
    pub async fn start_with_policy(db: Db, policy: Policy) -> TestServer {
        TestServer::start_configured(db, |o| o.policy = policy).await
    }

    /// A server with the development key turned off, as in production.
    pub async fn start_without_dev_key(db: Db) -> TestServer {
        TestServer::start_configured(db, |o| o.dev_key_enabled = false).await
    }

    /// A server with the default options but what `configure` changes.
    pub async fn start_configured(
        db: Db,
        configure: impl FnOnce(&mut ServerOptions),
    ) -> TestServer {
        let mut options = ServerOptions::default();
        configure(&mut options);
        TestServer::start_with(db, options).await
    }

    pub async fn start_with(backend: Db, options: ServerOptions) -> TestServer {
        let db = TestDb::new(backend).await;
        TestServer::start_on(backend, db, options).await
    }

    /// A server on a database the test made itself (e.g. on a PostgreSQL
    /// server it restarts, [`crate::pg::PgServer`]).
    pub async fn start_on(backend: Db, db: TestDb, options: ServerOptions) -> TestServer {
        let (state, dev_key) = app_state(&db, &options).await;
        let (store, feed) = (Arc::clone(&state.store), state.feed.clone());
        let hub = feed.clone();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        let (tx, rx) = oneshot::channel::<()>();
        let serving = tokio::spawn(serve(listener, router(state), options.serve, async move {
            let _ = rx.await;
            feed.close();
        }));
        let metrics_listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0 for metrics");
        let metrics_addr = metrics_listener.local_addr().expect("metrics address");
        // Ends with the test's runtime: it holds nothing but the listener.
        tokio::spawn(serve(
            metrics_listener,
            meatspace_api::http::metrics::router(meatspace_api::http::metrics::handle()),
            ServeOptions::default(),
            std::future::pending::<()>(),
        ));
        let client = reqwest::Client::builder()
            // A proxy from the environment must not see test traffic.
            .no_proxy()
            // A hang is a failure, not a stuck test run.
            .timeout(Duration::from_secs(60))
            .build()
            .expect("HTTP client");
        TestServer {
            base_url: format!("http://{addr}"),
            metrics_url: format!("http://{metrics_addr}"),
            dev_key,
            client,
            store,
            backend,
            db,
            feed: hub,
            options,
            shutdown: Some(tx),
            serving: Some(serving),
        }
    }

    /// Stops accepting connections, lets requests in flight finish, and
    /// fails the test if the server ended with an error.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(serving) = self.serving.take() {
            serving
                .await
                .expect("the server task panicked")
                .expect("the server failed");
        }
    }

    /// Waits until `n` long polls of this server wait for a change (they
    /// subscribed, read an empty page and sleep), so that what the test
    /// does next exercises the wake-up. Fails after 30 s.
    pub async fn until_waiting(&self, n: usize) {
        let what = format!("{n} long polls waiting");
        crate::eventually_every(
            Duration::from_millis(5),
            Duration::from_secs(30),
            &what,
            || std::future::ready((self.feed.waiting() >= n).then_some(())),
        )
        .await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Fails the test unless the server still answers `GET /livez` with
    /// success.
    pub async fn assert_live(&self) {
        self.get("/livez")
            .send()
            .await
            .expect("send GET /livez")
            .error_for_status()
            .expect("GET /livez answers with success");
    }

    /// `GET /metrics` of the metrics listener.
    pub fn metrics(&self) -> RequestBuilder {
        self.client.get(format!("{}/metrics", self.metrics_url))
    }

    /// A request without credentials.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, self.url(path))
    }

    pub fn get(&self, path: &str) -> RequestBuilder {
        self.request(Method::GET, path)
    }

    /// `GET path` without credentials; asserts 200 and returns the JSON
    /// answer.
    pub async fn get_json(&self, path: &str) -> Value {
        self.get(path).expect_json(StatusCode::OK).await
    }

    pub fn post(&self, path: &str) -> RequestBuilder {
        self.request(Method::POST, path)
    }

    /// A request carrying the development key.
    pub fn dev(&self, method: Method, path: &str) -> RequestBuilder {
        self.request(method, path)
            .header(DEV_KEY_HEADER, &self.dev_key)
    }

    /// Requests carrying a bearer token.
    pub fn bearer<'a>(&'a self, token: &'a str) -> Bearer<'a> {
        Bearer {
            server: self,
            token,
        }
    }

    /// `GET path` with the development key; asserts 200 and returns the
    /// JSON answer.
    pub async fn dev_get_json(&self, path: &str) -> Value {
        self.dev(Method::GET, path)
            .expect_json(StatusCode::OK)
            .await
    }

    /// Requests as the holder of an agent token.
    pub fn agent<'a>(&'a self, token: &'a str) -> Bearer<'a> {
        self.bearer(token)
    }

    /// Requests as the holder of a worker token.
    pub fn worker<'a>(&'a self, token: &'a str) -> Bearer<'a> {
        self.bearer(token)
    }

    /// Creates a draft task; returns its id and agent token.
    pub async fn create_task(&self, description: &str) -> (Uuid, String) {
        let body = self
            .create_task_with(json!({ "description": description }))
            .await;
        task_and_token(&body)
    }

    /// Creates a draft task from the request body `body` with the dev key;
    /// asserts 201 and returns the answer.
    pub async fn create_task_with(&self, body: Value) -> Value {
        self.dev(Method::POST, "/api/v1/tasks")
            .json(&body)
            .expect_json(StatusCode::CREATED)
            .await
    }

    /// Publishes a draft (draft → open).
    pub async fn publish(&self, task_id: Uuid, agent_token: &str) {
        self.agent_post(task_id, agent_token, "publish").await;
    }

    /// `POST /api/v1/tasks/{task_id}/{action}` without a body as the agent
    /// (`publish`, `cancel`, ...); asserts 200 and returns the answer.
    pub async fn agent_post(&self, task_id: Uuid, agent_token: &str, action: &str) -> Value {
        self.agent(agent_token)
            .post(&task_path(task_id, &format!("/{action}")))
            .expect_json(StatusCode::OK)
            .await
    }

    /// `POST /api/v1/worker/tasks/{task_id}/{action}` without a body as the
    /// worker (`claim`, `start`, ...); asserts 200 and returns the answer.
    pub async fn worker_post(&self, task_id: Uuid, worker_token: &str, action: &str) -> Value {
        self.worker(worker_token)
            .post(&worker_path(task_id, &format!("/{action}")))
            .expect_json(StatusCode::OK)
            .await
    }

    /// Creates and publishes a task; returns its id and agent token.
    pub async fn create_open_task(&self, description: &str) -> (Uuid, String) {
        let (id, token) = self.create_task(description).await;
        self.publish(id, &token).await;
        (id, token)
    }

    /// Registers a worker; returns its id and token.
    pub async fn register_worker(&self, name: &str) -> (Uuid, String) {
        let body = self
            .dev(Method::POST, "/api/v1/workers")
            .json(&json!({ "name": name }))
            .expect_json(StatusCode::CREATED)
            .await;
        (uuid_at(&body, "/worker/id"), str_at(&body, "/worker_token"))
    }

    /// A task a new worker has claimed and started.
    pub async fn active_task(&self, description: &str) -> ActiveTask {
        let (task_id, agent_token) = self.create_open_task(description).await;
        self.started(task_id, agent_token).await
    }

    /// A task created from the request body `body`, published, and claimed
    /// and started by a new worker.
    pub async fn active_task_with(&self, body: Value) -> ActiveTask {
        let created = self.create_task_with(body).await;
        let (task_id, agent_token) = task_and_token(&created);
        self.publish(task_id, &agent_token).await;
        self.started(task_id, agent_token).await
    }

    async fn started(&self, task_id: Uuid, agent_token: String) -> ActiveTask {
        let (worker_id, worker_token) = self.claim_and_start(task_id).await;
        ActiveTask {
            task_id,
            agent_token,
            worker_id,
            worker_token,
        }
    }

    /// A claimed task's assignment lapses: the clock passes the `start_by`
    /// of the claim's answer `claimed`, and applying the due deadlines (as
    /// the controller does) reopens exactly that task.
    pub async fn lapse_assignment(&self, claimed: &Value) {
        let start_by: chrono::DateTime<chrono::Utc> = str_at(claimed, "/task/start_by")
            .parse()
            .expect("start_by is an RFC 3339 time");
        self.advance_clock_past(start_by);
        let reopened = self
            .store
            .reconcile_due(self.now(), 10)
            .await
            .expect("apply the due deadlines");
        assert_eq!(reopened.len(), 1, "reopened: {reopened:?}");
    }

    /// The worker raises an issue of `kind` with `text` on the task;
    /// asserts 200 and returns the issue's event id.
    pub async fn raise_issue(
        &self,
        task_id: Uuid,
        worker_token: &str,
        kind: &str,
        text: &str,
    ) -> i64 {
        let change = self
            .worker(worker_token)
            .post(&worker_path(task_id, "/issues"))
            .json(&json!({ "kind": kind, "text": text }))
            .expect_json(StatusCode::OK)
            .await;
        change["events"][0]["id"]
            .as_i64()
            .expect("the issue's event id")
    }

    /// The agent's answer `body` (`{"action": ..., "text": ...}`) to the
    /// issue (event) `issue_id` of the task, ready to send.
    pub fn respond_to_issue(
        &self,
        task_id: Uuid,
        agent_token: &str,
        issue_id: i64,
        body: Value,
    ) -> RequestBuilder {
        self.agent(agent_token)
            .post(&task_path(task_id, &format!("/issues/{issue_id}/respond")))
            .json(&body)
    }

    /// The page of the task's events after `after`, at most `limit` of
    /// them, as the agent reads it; asserts 200.
    pub async fn events_page(
        &self,
        task_id: Uuid,
        agent_token: &str,
        after: i64,
        limit: usize,
    ) -> Value {
        self.agent(agent_token)
            .get(&task_path(
                task_id,
                &format!("/events?after={after}&limit={limit}"),
            ))
            .expect_json(StatusCode::OK)
            .await
    }

    /// The agent's clarification `text` in answer to the issue `issue_id`,
    /// ready to send.
    pub fn clarify(
        &self,
        task_id: Uuid,
        agent_token: &str,
        issue_id: i64,
        text: &str,
    ) -> RequestBuilder {
        self.respond_to_issue(
            task_id,
            agent_token,
            issue_id,
            json!({ "action": "clarify", "text": text }),
        )
    }

    /// Asserts that the worker token `token` is `accepted` (a worker's task
    /// list answers 200) or else refused (a 401 problem).
    pub async fn assert_worker_token(&self, token: &str, accepted: bool) {
        Self::assert_accepted(self.worker(token).get("/api/v1/worker/tasks"), accepted).await;
    }

    /// Asserts that the agent's key or task token `key` is `accepted` (the
    /// task list answers 200) or else refused (a 401 problem).
    pub async fn assert_agent_key(&self, key: &str, accepted: bool) {
        Self::assert_accepted(self.agent(key).get("/api/v1/tasks"), accepted).await;
    }

    async fn assert_accepted(request: RequestBuilder, accepted: bool) {
        if accepted {
            request.expect_json(StatusCode::OK).await;
        } else {
            request.expect_problem(StatusCode::UNAUTHORIZED).await;
        }
    }

    /// The worker sends the message `text` on the task; asserts 200 and
    /// returns the answer.
    pub async fn message(&self, task_id: Uuid, worker_token: &str, text: &str) -> Value {
        self.worker(worker_token)
            .post(&worker_path(task_id, "/messages"))
            .json(&json!({ "text": text }))
            .expect_json(StatusCode::OK)
            .await
    }

    /// A new worker ("Ada") claims and starts the open task `task_id`;
    /// returns the worker's id and token.
    pub async fn claim_and_start(&self, task_id: Uuid) -> (Uuid, String) {
        let (worker_id, worker_token) = self.register_worker("Ada").await;
        for action in ["claim", "start"] {
            self.worker_post(task_id, &worker_token, action).await;
        }
        (worker_id, worker_token)
    }

    /// `GET /api/v1/capabilities`, which must answer 200.
    pub async fn capabilities(&self) -> Value {
        self.get("/api/v1/capabilities")
            .expect_json(StatusCode::OK)
            .await
    }

    /// The task as the agent sees it.
    pub async fn task(&self, task_id: Uuid, agent_token: &str) -> Value {
        self.agent(agent_token)
            .get(&format!("/api/v1/tasks/{task_id}"))
            .expect_json(StatusCode::OK)
            .await
    }

    /// The whole event feed of a task, read over HTTP as the agent.
    pub async fn feed(&self, task_id: Uuid, agent_token: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let page = self.events_page(task_id, agent_token, after, 1000).await;
            events.extend(page["events"].as_array().expect("events array").clone());
            after = page["next_cursor"].as_i64().expect("next_cursor");
            if !page["has_more"].as_bool().expect("has_more") {
                return events;
            }
        }
    }

    /// How many rows each table holds, read straight from the database.
    pub async fn counts(&self) -> RowCounts {
        row_counts(self.backend, &self.db.url).await
    }
}

/// How many rows each table of the database at `url` holds (a server
/// process's database, say), read straight from it.
pub async fn row_counts(backend: Db, url: &str) -> RowCounts {
    const TABLES: [&str; 5] = ["tasks", "events", "issues", "photos", "workers"];
    // The same counts on either backend's connection type.
    macro_rules! count_tables {
        ($conn:expr) => {{
            let mut conn = $conn;
            let mut n = [0i64; 5];
            for (i, table) in TABLES.iter().enumerate() {
                n[i] = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
                    .fetch_one(&mut conn)
                    .await
                    .expect("count rows");
            }
            conn.close().await.ok();
            n
        }};
    }
    let n = match backend {
        Db::Postgres => count_tables!(
            sqlx::PgConnection::connect(url)
                .await
                .expect("connect to the test database")
        ),
        Db::Sqlite => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
                .expect("SQLite URL")
                .read_only(true);
            count_tables!(
                sqlx::SqliteConnection::connect_with(&options)
                    .await
                    .expect("open the test database")
            )
        }
    };
    RowCounts {
        tasks: n[0],
        events: n[1],
        issues: n[2],
        photos: n[3],
        workers: n[4],
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Builds requests that carry one bearer token.
#[derive(Debug, Clone, Copy)]
pub struct Bearer<'a> {
    server: &'a TestServer,
    token: &'a str,
}

impl Bearer<'_> {
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.server
            .request(method, path)
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
    }

    pub fn get(&self, path: &str) -> RequestBuilder {
        self.request(Method::GET, path)
    }

    pub fn post(&self, path: &str) -> RequestBuilder {
        self.request(Method::POST, path)
    }

    /// `GET path`; asserts 200 and returns the JSON answer.
    pub async fn get_json(&self, path: &str) -> Value {
        self.get(path).expect_json(StatusCode::OK).await
    }

    /// `POST path` with the JSON `body`; asserts 200 and returns the JSON
    /// answer.
    pub async fn post_json(&self, path: &str, body: &Value) -> Value {
        self.post(path).json(body).expect_json(StatusCode::OK).await
    }

    /// The worker's upload of `png` (see [`images`]) as a photo of the task
    /// `task_id`, to send and check.
    pub fn send_png(&self, task_id: Uuid, png: Vec<u8>) -> RequestBuilder {
        self.post(&worker_path(task_id, "/photos"))
            .header(CONTENT_TYPE, "image/png")
            .body(png)
    }
}

/// A worker's claim on its way to lapse: on a server whose claims must be
/// started within a second, the first of two registered workers claimed an
/// open task, sent a message and raised an `access_blocked` issue, and will
/// never start. What the second worker must not inherit.
#[derive(Debug)]
pub struct LapsingClaim {
    pub server: TestServer,
    pub task_id: Uuid,
    pub agent_token: String,
    pub first_worker: String,
    pub second_worker: String,
    /// The first claim's answer, for [`TestServer::lapse_assignment`].
    pub claimed: Value,
    /// The issue's event id.
    pub issue: i64,
}

impl LapsingClaim {
    /// Sets the scene: the task `description`, the first worker's message
    /// `note` and issue `issue_text`.
    pub async fn start(db: Db, description: &str, note: &str, issue_text: &str) -> LapsingClaim {
        let policy = Policy {
            start_timeout: chrono::TimeDelta::seconds(1),
            ..Policy::default()
        };
        let server = TestServer::start_with_policy(db, policy).await;
        let (task_id, agent_token) = server.create_open_task(description).await;
        let (_, first_worker) = server.register_worker("First").await;
        let (_, second_worker) = server.register_worker("Second").await;
        let claimed = server.worker_post(task_id, &first_worker, "claim").await;
        server.message(task_id, &first_worker, note).await;
        let issue = server
            .raise_issue(task_id, &first_worker, "access_blocked", issue_text)
            .await;
        LapsingClaim {
            server,
            task_id,
            agent_token,
            first_worker,
            second_worker,
            claimed,
            issue,
        }
    }
}

/// A task in the active state and everyone's credentials for it.
#[derive(Debug, Clone)]
pub struct ActiveTask {
    pub task_id: Uuid,
    pub agent_token: String,
    pub worker_id: Uuid,
    pub worker_token: String,
}

/// Row counts per table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowCounts {
    pub tasks: i64,
    pub events: i64,
    pub issues: i64,
    pub photos: i64,
    pub workers: i64,
}

/// The event types of a task that went the whole way with one of each
/// conversation: published, assigned, started, a message, a photo, an issue
/// and its answer, completed.
pub const FULL_STORY: [&str; 8] = [
    "task.published",
    "task.assigned",
    "task.started",
    "worker.message",
    "worker.photo",
    "worker.issue",
    "agent.issue_response",
    "task.completed",
];

/// Sends a request and checks the answer.
#[allow(async_fn_in_trait)] // used only by these tests, on one runtime
pub trait Expect {
    /// Asserts the status and returns the JSON body.
    async fn expect_json(self, status: StatusCode) -> Value;
    /// Asserts an RFC 9457 problem document with this status and returns it.
    async fn expect_problem(self, status: StatusCode) -> Value;
    /// [`Expect::expect_problem`], asserting too that the problem's type is
    /// `…/{kind}`.
    async fn expect_problem_type(self, status: StatusCode, kind: &str) -> Value
    where
        Self: Sized,
    {
        let body = self.expect_problem(status).await;
        assert!(
            str_at(&body, "/type").ends_with(&format!("/{kind}")),
            "a problem of type {kind} was expected: {body}"
        );
        body
    }
}

impl Expect for RequestBuilder {
    async fn expect_json(self, status: StatusCode) -> Value {
        let res = self.send().await.expect("send the request");
        let got = res.status();
        let text = res.text().await.expect("read the body");
        assert_eq!(got, status, "unexpected status; body: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text}"))
    }

    async fn expect_problem(self, status: StatusCode) -> Value {
        let res = self.send().await.expect("send the request");
        let got = res.status();
        let content_type = header_str(&res, CONTENT_TYPE);
        let text = res.text().await.expect("read the body");
        assert_eq!(got, status, "unexpected status; body: {text}");
        assert_eq!(
            content_type.as_deref(),
            Some(PROBLEM_JSON),
            "an error must be a problem document; body: {text}"
        );
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("problem is not JSON ({e}): {text}"));
        assert_problem_shape(&body, status);
        body
    }
}

/// Checks the members RFC 9457 and the API promise.
pub fn assert_problem_shape(body: &Value, status: StatusCode) {
    assert_eq!(
        body["status"].as_u64(),
        Some(u64::from(status.as_u16())),
        "{body}"
    );
    let kind = body["type"].as_str().unwrap_or_default();
    assert!(
        kind.starts_with(PROBLEM_TYPE_BASE) && kind.len() > PROBLEM_TYPE_BASE.len(),
        "problem type must be a stable URI: {body}"
    );
    assert!(body["title"].is_string(), "{body}");
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "problem needs a detail: {body}"
    );
}

/// A header's value as text.
pub fn header_str(
    res: &reqwest::Response,
    name: impl reqwest::header::AsHeaderName,
) -> Option<String> {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `/api/v1/tasks/{id}{rest}`: the agent's path of a task (`rest` is
/// empty or starts with `/` or `?`).
pub fn task_path(id: impl std::fmt::Display, rest: &str) -> String {
    format!("/api/v1/tasks/{id}{rest}")
}

/// `/api/v1/worker/tasks/{id}{rest}`: the worker's path of a task.
pub fn worker_path(id: impl std::fmt::Display, rest: &str) -> String {
    format!("/api/v1/worker/tasks/{id}{rest}")
}

/// The string at a JSON pointer; panics if absent.
pub fn str_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v}"))
        .to_owned()
}

/// The array at a JSON pointer; panics if absent.
pub fn array_at<'a>(v: &'a Value, pointer: &str) -> &'a Vec<Value> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no array at {pointer} in {v}"))
}

/// The task's id and agent token in the answer to a task's creation.
pub fn task_and_token(created: &Value) -> (Uuid, String) {
    (
        uuid_at(created, "/task/id"),
        str_at(created, "/agent_token"),
    )
}

/// The UUID at a JSON pointer; panics if absent or malformed.
pub fn uuid_at(v: &Value, pointer: &str) -> Uuid {
    Uuid::parse_str(&str_at(v, pointer)).unwrap_or_else(|e| panic!("{pointer} in {v}: {e}"))
}

/// Types of a list of events.
pub fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().expect("event type"))
        .collect()
}

/// Ids of a list of events.
pub fn ids(events: &[Value]) -> Vec<i64> {
    events
        .iter()
        .map(|e| e["id"].as_i64().expect("event id"))
        .collect()
}

/// The worker web app over plain HTTP, as a browser without JavaScript
/// sends its forms: redirects shown, cookies and CSRF tokens carried by
/// hand.
pub mod web {
    use reqwest::header::{COOKIE, SET_COOKIE};
    use reqwest::{Client, Response, StatusCode};

    use super::TestServer;

    /// A client that shows redirects instead of following them.
    pub fn client() -> Client {
        Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client")
    }

    /// `name=value` of the Set-Cookie header named `name`, and the whole
    /// header (its attributes).
    pub fn cookie_pair(res: &Response, name: &str) -> Option<(String, String)> {
        res.headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&format!("{name}=")))
            .map(|v| {
                let pair = v.split(';').next().unwrap_or_default().to_owned();
                (pair, v.to_owned())
            })
    }

    /// The value of the hidden `csrf` field of a page.
    pub fn csrf_of(html: &str) -> String {
        let at = html.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
        html[at..]
            .split('"')
            .next()
            .expect("field value")
            .to_owned()
    }

    /// GETs `url` sending the cookie `cookie`.
    pub async fn get_with(http: &Client, url: &str, cookie: &str) -> Response {
        http.get(url)
            .header(COOKIE, cookie)
            .send()
            .await
            .expect("get the page")
    }

    /// Posts `form` to `url`, sending the cookie `cookie` and `headers`.
    pub async fn post_form(
        http: &Client,
        url: &str,
        cookie: &str,
        headers: &[(&str, &str)],
        form: &[(&str, &str)],
    ) -> Response {
        let mut req = http.post(url).header(COOKIE, cookie);
        for &(name, value) in headers {
            req = req.header(name, value);
        }
        req.form(form).send().await.expect("post the form")
    }

    /// The headers a browser sends with a form of the page's own `origin`.
    pub fn same_origin(origin: &str) -> [(&str, &str); 2] {
        [("origin", origin), ("sec-fetch-site", "same-origin")]
    }

    /// The login page's pre-session cookie (`name=value`) and CSRF token.
    pub async fn login_page(srv: &TestServer, http: &Client) -> (String, String) {
        let login = http
            .get(srv.url("/app/login"))
            .send()
            .await
            .expect("login page");
        let (pre, _) = cookie_pair(&login, "ms_presession").expect("pre-session cookie");
        let csrf = csrf_of(&login.text().await.expect("page"));
        (pre, csrf)
    }

    /// Posts the worker token `token` to the login form of the pre-session
    /// cookie `pre` and its `csrf` token, sending `headers`.
    pub async fn post_login(
        srv: &TestServer,
        http: &Client,
        (pre, csrf): (&str, &str),
        token: &str,
        headers: &[(&str, &str)],
    ) -> Response {
        post_form(
            http,
            &srv.url("/app/login"),
            pre,
            headers,
            &[("csrf", csrf), ("token", token)],
        )
        .await
    }

    /// Signs in on the login form of the pre-session cookie `pre` and its
    /// `csrf` token with the worker token `token`, sending `headers`;
    /// returns the session cookie (`name=value`).
    pub async fn sign_in_with(
        srv: &TestServer,
        http: &Client,
        form: (&str, &str),
        token: &str,
        headers: &[(&str, &str)],
    ) -> String {
        let ok = post_login(srv, http, form, token, headers).await;
        assert_eq!(ok.status(), StatusCode::SEE_OTHER, "signing in");
        let (session, _) = cookie_pair(&ok, "ms_session").expect("session cookie");
        session
    }

    /// Signs in on a fresh login page with the worker token `token`,
    /// sending `headers`; returns the session cookie (`name=value`).
    pub async fn sign_in(
        srv: &TestServer,
        http: &Client,
        token: &str,
        headers: &[(&str, &str)],
    ) -> String {
        let (pre, csrf) = login_page(srv, http).await;
        sign_in_with(srv, http, (&pre, &csrf), token, headers).await
    }
}

/// Real images to upload, built with the `image` crate.
pub mod images {
    use std::io::Cursor;

    use image::{DynamicImage, ImageFormat, RgbImage};

    /// A PNG with a colour gradient.
    pub fn png(width: u32, height: u32) -> Vec<u8> {
        let img = RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x + y) * 3) as u8])
        });
        encode(DynamicImage::ImageRgb8(img), ImageFormat::Png)
    }

    /// A zero-filled PNG of `width` × `height` pixels, RGBA with 16 bits a
    /// channel when `sixteen` (else 8): a few hundred bytes a megapixel,
    /// written row by row so that its pixels are never held whole.
    pub fn zero_png(width: u32, height: u32, sixteen: bool) -> Vec<u8> {
        use std::io::Write;
        let mut out = Vec::new();
        {
            let mut encoder = png::Encoder::new(&mut out, width, height);
            encoder.set_color(png::ColorType::Rgba);
            encoder.set_depth(if sixteen {
                png::BitDepth::Sixteen
            } else {
                png::BitDepth::Eight
            });
            encoder.set_compression(png::Compression::Balanced);
            let mut header = encoder.write_header().expect("PNG header");
            let mut writer = header.stream_writer().expect("PNG stream");
            let row = vec![0u8; width as usize * if sixteen { 8 } else { 4 }];
            for _ in 0..height {
                writer.write_all(&row).expect("PNG row");
            }
            writer.finish().expect("PNG end");
        }
        out
    }

    /// A PNG whose header claims `width` × `height` pixels but whose data
    /// is that of one pixel: a check of the header refuses it as too large,
    /// a decoder as broken.
    pub fn png_header_only(width: u32, height: u32) -> Vec<u8> {
        let mut png = zero_png(1, 1, false);
        // Signature (8), IHDR length and type (8), width, height, and the
        // CRC of type and data at 29..33.
        png[16..20].copy_from_slice(&width.to_be_bytes());
        png[20..24].copy_from_slice(&height.to_be_bytes());
        let crc = crc32(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        png
    }

    /// CRC-32 (IEEE), as PNG chunks carry it.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// A PNG of random pixels: it does not compress, so its size is about
    /// `3 * width * height` bytes.
    pub fn noisy_png(width: u32, height: u32) -> Vec<u8> {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let img = RgbImage::from_fn(width, height, |_, _| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let b = state.to_le_bytes();
            image::Rgb([b[0], b[1], b[2]])
        });
        encode(DynamicImage::ImageRgb8(img), ImageFormat::Png)
    }

    /// A JPEG carrying an EXIF (APP1) segment whose ImageDescription is
    /// `marker`, the way a camera stores metadata.
    pub fn jpeg_with_exif(width: u32, height: u32, marker: &str) -> Vec<u8> {
        let img = RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x * 3) as u8, 128, (y * 3) as u8])
        });
        let jpeg = encode(DynamicImage::ImageRgb8(img), ImageFormat::Jpeg);
        assert_eq!(&jpeg[..2], [0xFF, 0xD8], "a JPEG starts with SOI");
        let mut out = jpeg[..2].to_vec();
        out.extend(app1_exif(marker));
        out.extend(&jpeg[2..]);
        out
    }

    /// A small real JPEG whose frame header claims `claimed` × `claimed`
    /// pixels, like a decompression bomb.
    pub fn jpeg_claiming(claimed: u16) -> Vec<u8> {
        let img = RgbImage::from_pixel(8, 8, image::Rgb([1, 2, 3]));
        let mut jpeg = encode(DynamicImage::ImageRgb8(img), ImageFormat::Jpeg);
        // SOF0: FF C0, length (2), precision (1), height (2), width (2).
        let sof = jpeg
            .windows(2)
            .position(|w| w == [0xFF, 0xC0])
            .expect("baseline JPEG has SOF0");
        let dims = claimed.to_be_bytes();
        jpeg[sof + 5..sof + 7].copy_from_slice(&dims);
        jpeg[sof + 7..sof + 9].copy_from_slice(&dims);
        jpeg
    }

    fn encode(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).expect("encode test image");
        out.into_inner()
    }

    /// An APP1 segment: "Exif\0\0" and a big-endian TIFF with one IFD
    /// holding ImageDescription (`marker`) and Orientation (1, upright).
    fn app1_exif(marker: &str) -> Vec<u8> {
        let mut text = marker.as_bytes().to_vec();
        text.push(0);
        let text_len = u32::try_from(text.len()).expect("short marker");
        // TIFF header (8) + entry count (2) + 2 entries (24) + next IFD (4).
        let text_offset: u32 = 8 + 2 + 2 * 12 + 4;
        let mut tiff = Vec::new();
        tiff.extend(b"MM\x00\x2A");
        tiff.extend(8u32.to_be_bytes());
        tiff.extend(2u16.to_be_bytes());
        // ImageDescription, ASCII.
        tiff.extend(0x010Eu16.to_be_bytes());
        tiff.extend(2u16.to_be_bytes());
        tiff.extend(text_len.to_be_bytes());
        tiff.extend(text_offset.to_be_bytes());
        // Orientation, SHORT, 1 = upright.
        tiff.extend(0x0112u16.to_be_bytes());
        tiff.extend(3u16.to_be_bytes());
        tiff.extend(1u32.to_be_bytes());
        tiff.extend([0, 1, 0, 0]);
        tiff.extend(0u32.to_be_bytes());
        tiff.extend(text);
        let mut payload = b"Exif\x00\x00".to_vec();
        payload.extend(tiff);
        let len = u16::try_from(payload.len() + 2).expect("APP1 fits a segment");
        let mut seg = vec![0xFF, 0xE1];
        seg.extend(len.to_be_bytes());
        seg.extend(payload);
        seg
    }
}
