//! The real binaries as child processes, for the tests that kill them.
//!
//! [`Binary`] names a binary that `cargo build --workspace --bins` put next
//! to the test executable (`scripts/test` builds them before the tests);
//! [`ServerProcess`] runs one listening on a free port of 127.0.0.1 with
//! its log in a file, and is killed if the test ends without stopping it;
//! [`ServerProcess::start_in`] runs it the way a user does instead, in a
//! directory and on an address of the test's choosing (so a restart comes
//! back where clients look for it, over the same `.meatspace/` data).
//! The API server's tests and the controller's (`controller_support`) use
//! this one helper.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

/// A binary of this workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    ApiServer,
    Controller,
}

impl Binary {
    fn name(self) -> &'static str {
        match self {
            Binary::ApiServer => "meatspace-api-server",
            Binary::Controller => "meatspace-controller",
        }
    }

    /// The variable naming the address it listens on.
    fn listen_env(self) -> &'static str {
        match self {
            Binary::ApiServer => "MEATSPACE_LISTEN_ADDR",
            Binary::Controller => "MEATSPACE_CONTROLLER_LISTEN_ADDR",
        }
    }

    /// The variable that may name another build of it.
    fn path_env(self) -> &'static str {
        match self {
            Binary::ApiServer => "MEATSPACE_API_SERVER_BIN",
            Binary::Controller => "MEATSPACE_CONTROLLER_BIN",
        }
    }

    /// How long it may take to answer `/readyz` after starting.
    fn ready_within(self) -> Duration {
        match self {
            Binary::ApiServer => Duration::from_secs(60),
            Binary::Controller => Duration::from_secs(30),
        }
    }

    /// How long a graceful stop (SIGTERM) may take: the controller only
    /// finishes the batch it is writing, the API server drains requests.
    fn stop_within(self) -> Duration {
        match self {
            Binary::ApiServer => Duration::from_secs(30),
            Binary::Controller => Duration::from_secs(15),
        }
    }

    /// Its path: the variable [`Self::path_env`] if set, else
    /// target/<profile>/<name>, next to the test binary's deps/.
    pub fn path(self) -> PathBuf {
        built(self.name(), self.path_env())
    }
}

/// Path of the `meatspace` CLI: `MEATSPACE_CLI_BIN` if set, else the one
/// cargo built next to the test binary.
pub fn cli_bin() -> PathBuf {
    built("meatspace", "MEATSPACE_CLI_BIN")
}

/// The binary `name`: the variable `env` if set, else target/<profile>/<name>,
/// next to the test binary's deps/. Panics, saying how to build it, when it
/// is not there.
fn built(name: &str, env: &str) -> PathBuf {
    let path = match std::env::var_os(env) {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("test binary path");
            exe.parent()
                .and_then(|deps| deps.parent())
                .expect("target directory")
                .join(name)
        }
    };
    assert!(
        path.is_file(),
        "{} does not exist: build the binaries first (`cargo build --workspace --bins`, \
         which scripts/test runs), or set {env}",
        path.display()
    );
    path
}

/// A free TCP port on 127.0.0.1 (free when this returns), never one this
/// process handed out before: the kernel may offer a port it just offered
/// again before whoever got it binds it, so two servers of one test (an API
/// server and its metrics listener, say) could otherwise be given the same.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A running binary.
#[derive(Debug)]
pub struct ServerProcess {
    binary: Binary,
    child: tokio::process::Child,
    /// `host:port` it listens on.
    pub addr: String,
    /// `host:port` of the API server's metrics listener (`None` for the
    /// controller, which serves `/metrics` on `addr`).
    pub metrics_addr: Option<String>,
    /// Its stdout (the API server prints the dev key there).
    stdout: PathBuf,
    /// Its stderr: logs and start-up errors.
    log: PathBuf,
    /// The working directory [`Self::start`] made, removed with it.
    _dir: Option<tempfile::TempDir>,
}

impl ServerProcess {
    /// Starts `binary` in a fresh directory on a free port, with only
    /// `env` (and its listen address) set.
    pub fn start(binary: Binary, env: &[(&str, &str)]) -> ServerProcess {
        let dir = tempfile::tempdir().expect("temporary directory");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut process = ServerProcess::start_in(binary, dir.path(), "process", &addr, env);
        process._dir = Some(dir);
        process
    }

    /// Starts `binary` in `dir` listening on `addr`, with only `env` set
    /// (plus RUST_LOG and PATH); `name` tells the output files
    /// (`name.stdout`, `name.stderr`) of several runs in `dir` apart.
    pub fn start_in(
        binary: Binary,
        dir: &Path,
        name: &str,
        addr: &str,
        env: &[(&str, &str)],
    ) -> ServerProcess {
        let stdout = dir.join(format!("{name}.stdout"));
        let log = dir.join(format!("{name}.stderr"));
        let mut command = tokio::process::Command::new(binary.path());
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        // The metrics listener's default port would be shared by every
        // API server of the suite.
        let metrics_addr = (binary == Binary::ApiServer).then(|| {
            env.iter()
                .find(|(k, _)| *k == "MEATSPACE_METRICS_LISTEN_ADDR")
                .map(|(_, v)| (*v).to_owned())
                .unwrap_or_else(|| {
                    let metrics_addr = format!("127.0.0.1:{}", free_port());
                    command.env("MEATSPACE_METRICS_LISTEN_ADDR", &metrics_addr);
                    metrics_addr
                })
        });
        let child = command
            .env(binary.listen_env(), addr)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true)
            .spawn()
            .expect("start the binary");
        ServerProcess {
            binary,
            child,
            addr: addr.to_owned(),
            metrics_addr,
            stdout,
            log,
            _dir: None,
        }
    }

    /// What it has printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// What it has logged (stderr) so far; the same as [`Self::logs`].
    pub fn stderr(&self) -> String {
        self.logs()
    }

    /// The dev key the API server printed on stdout.
    pub fn printed_dev_key(&self) -> Option<String> {
        self.stdout()
            .lines()
            .find(|l| l.starts_with("meatspace dev key"))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    }

    /// Waits for a binary that must refuse to start to exit (within the
    /// time it has to become ready).
    pub async fn exit(&mut self) -> ExitStatus {
        let within = self.binary.ready_within();
        tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} still running after {within:?}:\n{}",
                    self.binary.name(),
                    self.logs()
                )
            })
            .expect("wait for the binary")
    }

    /// `http://host:port`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What it has logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path`: the status and the body.
    pub async fn get(&self, path: &str) -> Result<(u16, String), reqwest::Error> {
        let r = reqwest::get(self.url(path)).await?;
        let status = r.status().as_u16();
        Ok((status, r.text().await?))
    }

    /// The value of a counter (summed over its label sets) from the
    /// controller's `/metrics`.
    pub async fn counter(&self, name: &str) -> f64 {
        let (status, body) = self.get("/metrics").await.expect("scrape /metrics");
        assert_eq!(status, 200);
        body.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until `/readyz` answers 200 (a minute for the API server,
    /// 30 s for the controller).
    pub async fn ready(&mut self) {
        let client = reqwest::Client::new();
        let within = self.binary.ready_within();
        let give_up = tokio::time::Instant::now() + within;
        loop {
            if let Ok(r) = client.get(self.url("/readyz")).send().await
                && r.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited with {status}:\n{}\n{}",
                    self.binary.name(),
                    self.stdout(),
                    self.logs()
                );
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "{} not ready after {within:?}:\n{}",
                self.binary.name(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, and waits for it to be gone.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill -9");
    }

    /// SIGTERM, then waits for the exit; returns whether it exited 0 in
    /// time (30 s for the API server, 15 s for the controller).
    pub async fn terminate(&mut self) -> bool {
        let pid = self.child.id().expect("still running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success());
        match tokio::time::timeout(self.binary.stop_within(), self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => false,
        }
    }
}

/// Polls `{base}/readyz` until it answers 2xx, for a server started some
/// other way than [`ServerProcess`]; panics after `within`.
pub async fn until_ready(base: &str, within: Duration) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("HTTP client");
    let url = format!("{base}/readyz");
    crate::eventually(
        within,
        &format!("the server at {base} to be ready"),
        || async {
            let answer = client.get(&url).send().await;
            answer.is_ok_and(|r| r.status().is_success()).then_some(())
        },
    )
    .await;
}

/// The HTTP API of a server process as a client reaches it: the dev key
/// creates tasks and workers, the tokens they hand out do the rest.
#[derive(Debug, Clone)]
pub struct DevApi {
    pub base: String,
    dev_key: String,
    http: reqwest::Client,
}

impl DevApi {
    pub fn new(base: &str, dev_key: &str) -> DevApi {
        DevApi {
            base: base.to_owned(),
            dev_key: dev_key.to_owned(),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("HTTP client"),
        }
    }

    /// Sends `request` (`what` says which in a failure): the status and
    /// the body.
    async fn send(request: reqwest::RequestBuilder, what: &str) -> (reqwest::StatusCode, String) {
        let res = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = res.status();
        (status, res.text().await.unwrap_or_default())
    }

    /// POSTs `body` to `path` with the dev key, which must succeed: the
    /// JSON it answers.
    async fn dev_post(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("x-meatspace-dev-key", &self.dev_key)
            .json(&body);
        let (status, text) = Self::send(request, path).await;
        assert!(status.is_success(), "POST {path}: {status}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"))
    }

    /// POSTs `body` (none when `None`) to `path` as `token`, which must
    /// answer 200.
    async fn post_200(&self, path: &str, token: &str, body: Option<serde_json::Value>) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let (status, text) = Self::send(request, path).await;
        assert_eq!(status, reqwest::StatusCode::OK, "POST {path}: {text}");
    }

    /// Creates a draft task: its id and agent token.
    pub async fn create_task(&self, description: &str) -> (uuid::Uuid, String) {
        let created = self
            .dev_post(
                "/api/v1/tasks",
                serde_json::json!({ "description": description }),
            )
            .await;
        let id = created["task"]["id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("a task id in {created}"));
        let token = created["agent_token"]
            .as_str()
            .unwrap_or_else(|| panic!("an agent token in {created}"));
        (id, token.to_owned())
    }

    /// POSTs to the agent route `action` (`publish`, `cancel`, …) of task
    /// `id`, which must answer 200.
    pub async fn agent_post(&self, agent_token: &str, id: uuid::Uuid, action: &str) {
        self.post_200(&format!("/api/v1/tasks/{id}/{action}"), agent_token, None)
            .await;
    }

    /// The events of task `id` its agent reads with `query` (`after=0`, …):
    /// the page's `events`.
    pub async fn events(
        &self,
        agent_token: &str,
        id: uuid::Uuid,
        query: &str,
    ) -> Vec<serde_json::Value> {
        let path = format!("/api/v1/tasks/{id}/events?{query}");
        let request = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(agent_token);
        let (status, text) = Self::send(request, &path).await;
        assert_eq!(status, reqwest::StatusCode::OK, "GET {path}: {text}");
        let mut page: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"));
        match page["events"].take() {
            serde_json::Value::Array(events) => events,
            other => panic!("GET {path}: no events: {other}"),
        }
    }

    /// Registers a worker named `name`: its token.
    pub async fn register_worker(&self, name: &str) -> String {
        let worker = self
            .dev_post("/api/v1/workers", serde_json::json!({ "name": name }))
            .await;
        worker["worker_token"]
            .as_str()
            .unwrap_or_else(|| panic!("a worker token in {worker}"))
            .to_owned()
    }

    /// POSTs `body` to the worker route `action` (`claim`, `messages`, …)
    /// of task `id`, which must answer 200.
    pub async fn worker_post(
        &self,
        worker_token: &str,
        id: uuid::Uuid,
        action: &str,
        body: serde_json::Value,
    ) {
        let path = format!("/api/v1/worker/tasks/{id}/{action}");
        self.post_200(&path, worker_token, Some(body)).await;
    }

    /// A task published, then claimed and started by a new worker named
    /// `worker`: (task id, agent token, worker token).
    pub async fn active_task(
        &self,
        description: &str,
        worker: &str,
    ) -> (uuid::Uuid, String, String) {
        let (id, token) = self.create_task(description).await;
        self.agent_post(&token, id, "publish").await;
        let wtoken = self.register_worker(worker).await;
        for action in ["claim", "start"] {
            self.worker_post(&wtoken, id, action, serde_json::json!({}))
                .await;
        }
        (id, token, wtoken)
    }
}
