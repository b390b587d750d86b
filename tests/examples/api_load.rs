//! Load benchmark of the real `meatspace-api-server` binary. It prints
//! figures; it asserts nothing about speed.
//!
//! ```text
//! scripts/bench.sh [--clients N] [--duration SECS] [--warmup SECS] [--backend sqlite|postgres|both]
//! ```
//!
//! `scripts/bench.sh` builds the server and this example (release, or debug
//! with `MEATSPACE_BENCH_PROFILE=debug`), starts a throwaway PostgreSQL server
//! when `MEATSPACE_TEST_POSTGRES_URL` is unset, runs this program and stops
//! the PostgreSQL server again. Run by hand, the example needs the server
//! binary (`--server PATH`, default: `meatspace-api-server` next to the
//! `examples/` directory holding this program) and, for PostgreSQL,
//! `MEATSPACE_TEST_POSTGRES_URL`.
//!
//! For each backend (SQLite in a temporary directory, then a fresh database
//! on the PostgreSQL server) it starts the binary as a child process on a
//! free 127.0.0.1 port with `RUST_LOG=warn` and its own development key,
//! prints its resident memory at idle after startup, and then drives it with
//! N concurrent clients (one keep-alive connection each), each scenario for a
//! fixed time after a short warm-up:
//!
//! 1. `POST /api/v1/tasks` — create a draft task;
//! 2. `GET /api/v1/tasks/{id}` — read tasks created in scenario 1;
//! 3. `GET /api/v1/tasks/{id}/events?after=N` — poll the feeds of active
//!    tasks holding 20 events, `after` cycling so pages hold 20 down to 0
//!    events (10 on average);
//! 4. `POST /api/v1/worker/tasks/{id}/messages` — a worker message on an
//!    active task (one registered worker and one claimed and started task per
//!    client).
//!
//! Each scenario prints requests per second, latency p50/p90/p99/max (from
//! sending the request to reading the whole body), the number of errors
//! (transport failures and any non-2xx answer; it should be 0) and the CPU
//! used meanwhile by the server, by this load generator and by everything
//! else ("rest": PostgreSQL, kernel network work not charged to a process,
//! any other process on the machine). After each backend it prints the
//! server's peak resident memory (`VmHWM`).
//!
//! The load generator shares the machine with the server (and PostgreSQL),
//! so the figures are those of the whole system on this machine, not of the
//! server alone; the CPU columns show the split. Traffic goes only to
//! 127.0.0.1, and the program stops by itself. It exits non-zero when any
//! request failed.
//!
//! Settings: `--clients` / `MEATSPACE_BENCH_CLIENTS` (default 32),
//! `--duration` / `MEATSPACE_BENCH_DURATION` (seconds per scenario, default
//! 10), `--warmup` / `MEATSPACE_BENCH_WARMUP` (seconds, default 1),
//! `--backend` / `MEATSPACE_BENCH_BACKEND` (default both), `--server` /
//! `MEATSPACE_BENCH_SERVER`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use meatspace_tests::{POSTGRES_ENV, fresh_postgres_database};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Client, RequestBuilder};
use serde_json::Value;
use sqlx::Connection;
use uuid::Uuid;

const DEV_KEY_HEADER: &str = meatspace_api::auth::DEV_KEY_HEADER;
const CREATE_BODY: &str = r#"{"description":"Photograph the notice board at the town hall and send the photo","expires_in_seconds":86400}"#;
const MESSAGE_BODY: &str =
    r#"{"text":"On site now; the notice board is behind the glass door, taking photos next."}"#;
/// Events on each polled task: published, assigned, started and 17 messages.
const FEED_EVENTS: usize = 20;

#[path = "api_load/compare.rs"]
mod compare;
#[path = "api_load/limits.rs"]
mod limits;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The comparison starts this program again as a bare HTTP service.
    if args.first().map(String::as_str) == Some("--bare-http") {
        return limits::serve_bare(&args[1..]);
    }
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> Result<()> {
    let settings = Settings::parse()?;
    if settings.compare {
        return compare::run(&settings).await;
    }
    print_preamble(&settings);
    let mut failed = 0;
    for backend in &settings.backends {
        failed += bench_backend(&settings, *backend)
            .await
            .with_context(|| format!("benchmark on {}", backend.name()))?;
    }
    if failed > 0 {
        bail!("{failed} requests failed; the figures above are not valid");
    }
    Ok(())
}

// ---- settings ----------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        }
    }
}

#[derive(Debug)]
struct Settings {
    clients: usize,
    duration: Duration,
    warmup: Duration,
    backends: Vec<Backend>,
    server: PathBuf,
    /// Comparison mode (see `compare.rs`): wrk against pgbench.
    compare: bool,
    /// Comparison mode on a preloaded store (1M tasks, 10M events).
    large: bool,
}

const USAGE: &str = "usage: api_load [--clients N] [--duration SECS] [--warmup SECS] \
    [--backend sqlite|postgres|both] [--server PATH] [--compare [--large]]";

impl Settings {
    /// Flags first, then `MEATSPACE_BENCH_*` variables, then defaults.
    fn parse() -> Result<Settings> {
        let mut flags: BTreeMap<String, String> = BTreeMap::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            if arg == "--compare" || arg == "--large" {
                flags.insert(arg[2..].to_owned(), "1".to_owned());
                continue;
            }
            let Some(name) = arg.strip_prefix("--") else {
                bail!("unexpected argument {arg:?}\n{USAGE}");
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_owned(), v.to_owned()),
                None => {
                    let v = args
                        .next()
                        .with_context(|| format!("--{name} needs a value"))?;
                    (name.to_owned(), v)
                }
            };
            if !["clients", "duration", "warmup", "backend", "server"].contains(&name.as_str()) {
                bail!("unknown flag --{name}\n{USAGE}");
            }
            flags.insert(name, value);
        }
        let get = |name: &str| {
            flags
                .get(name)
                .cloned()
                .or_else(|| std::env::var(format!("MEATSPACE_BENCH_{}", name.to_uppercase())).ok())
        };
        let seconds = |name: &str, default: f64| -> Result<Duration> {
            let s = get(name)
                .map_or(Ok(default), |v| v.parse::<f64>())
                .with_context(|| format!("{name} must be a number of seconds"))?;
            Duration::try_from_secs_f64(s).with_context(|| format!("{name} out of range"))
        };
        let clients = get("clients")
            .map_or(Ok(32), |v| v.parse::<usize>())
            .context("clients must be a whole number")?;
        if clients == 0 {
            bail!("clients must be at least 1");
        }
        let duration = seconds("duration", 10.0)?;
        if duration.is_zero() {
            bail!("duration must be positive");
        }
        let backends = match get("backend").as_deref() {
            None | Some("both") => vec![Backend::Sqlite, Backend::Postgres],
            Some("sqlite") => vec![Backend::Sqlite],
            Some("postgres") => vec![Backend::Postgres],
            Some(other) => bail!("unknown backend {other:?}: sqlite, postgres or both"),
        };
        let server = match get("server") {
            Some(path) => PathBuf::from(path),
            // target/<profile>/examples/api_load → target/<profile>/meatspace-api-server
            None => std::env::current_exe()?
                .parent()
                .and_then(Path::parent)
                .context("no directory above this program")?
                .join("meatspace-api-server"),
        };
        if !server.is_file() {
            bail!(
                "no server binary at {} (build it, or pass --server PATH)",
                server.display()
            );
        }
        if backends.contains(&Backend::Postgres) && std::env::var_os(POSTGRES_ENV).is_none() {
            bail!(
                "{POSTGRES_ENV} is not set: run scripts/bench.sh (it starts a throwaway \
                 PostgreSQL server) or pass --backend sqlite"
            );
        }
        let on = |name: &str| get(name).is_some_and(|v| !v.is_empty() && v != "0");
        Ok(Settings {
            clients,
            duration,
            warmup: seconds("warmup", 1.0)?,
            backends,
            server,
            compare: on("compare") || on("large"),
            large: on("large"),
        })
    }
}

fn print_preamble(s: &Settings) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("meatspace API load benchmark");
    println!("  server:   {}", s.server.display());
    println!(
        "  load:     {} concurrent clients (one keep-alive connection each), {} s per scenario after {} s of warm-up",
        s.clients,
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64()
    );
    println!(
        "  machine:  {cpus} CPUs, load average {} before the run",
        load.join(" ")
    );
    println!(
        "  note:     the load generator runs on the same {cpus} CPUs as the server (and PostgreSQL), \
         so these are figures of the whole system on one machine; the CPU columns show who used it"
    );
    println!(
        "  latency:  from sending a request to reading its whole body; errors = transport failures + non-2xx"
    );
    println!(
        "  CPU:      average cores busy; rest = PostgreSQL, kernel work not charged to a process, other processes"
    );
}

// ---- the server process --------------------------------------------------------

/// The API server binary running as a child process.
struct Server {
    child: tokio::process::Child,
    pid: u32,
    base_url: String,
    /// `http://127.0.0.1:<port>` of its metrics listener.
    metrics_url: String,
    dev_key: String,
    /// Holds the server's stdout (`server.out`) and stderr (`server.err`).
    dir: PathBuf,
}

impl Server {
    /// Starts the binary on a free port of 127.0.0.1 and waits for `/readyz`.
    async fn start(binary: &Path, database_url: &str, dir: &Path) -> Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dev_key = meatspace_api::auth::DevKey::generate();
        let child = tokio::process::Command::new(binary)
            .current_dir(dir)
            .env("DATABASE_URL", database_url)
            .env("MEATSPACE_DEV_KEY", &dev_key)
            // Required with PostgreSQL (seals Idempotency-Key replays).
            .env(
                "MEATSPACE_SECRET_KEY",
                meatspace_store::secret::ServerKey::generate().1,
            )
            .env("MEATSPACE_LISTEN_ADDR", format!("127.0.0.1:{port}"))
            .env(
                "MEATSPACE_METRICS_LISTEN_ADDR",
                format!("127.0.0.1:{metrics_port}"),
            )
            .env("MEATSPACE_DATA_DIR", dir)
            .env("RUST_LOG", "warn")
            // 32 clients share one dev key: measure the server, not the limiter.
            .env("MEATSPACE_RATE_LIMIT_PER_SECOND", "0")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("server.out"))?)
            .stderr(std::fs::File::create(dir.join("server.err"))?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let pid = child.id().context("the server has no pid")?;
        let mut server = Server {
            child,
            pid,
            base_url: format!("http://127.0.0.1:{port}"),
            metrics_url: format!("http://127.0.0.1:{metrics_port}"),
            dev_key,
            dir: dir.to_owned(),
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let http = http_client()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the server exited ({status}) at startup:\n{}",
                    self.log_tail()
                );
            }
            let ready = http.get(self.url("/readyz")).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the server was not ready within 60 s:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// A field of `/proc/<pid>/status` given in kB (`VmRSS`, `VmHWM`).
    fn memory_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    fn log_tail(&self) -> String {
        log_tail(&self.dir)
    }

    /// SIGTERM (graceful shutdown), then SIGKILL after 10 s.
    async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!("the server exited with {status}:\n{}", self.log_tail());
                }
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("the server did not stop within 10 s of SIGTERM; killed it");
            }
        }
        Ok(())
    }
}

/// The last lines of the server's stdout and stderr in `dir`, indented.
fn log_tail(dir: &Path) -> String {
    let mut text = String::new();
    for file in ["server.out", "server.err"] {
        let content = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        let lines: Vec<&str> = content.lines().collect();
        for line in &lines[lines.len().saturating_sub(20)..] {
            let _ = writeln!(text, "  {line}");
        }
    }
    text
}

// ---- CPU accounting ------------------------------------------------------------

/// Cumulative CPU time of the server, of this process and of the machine.
#[derive(Debug, Clone, Copy)]
struct CpuSnapshot {
    at: Instant,
    server: u64,
    this: u64,
    machine_busy: u64,
}

/// Cores in use on average between two snapshots.
#[derive(Debug, Clone, Copy, Default)]
struct CpuUse {
    server: f64,
    load_generator: f64,
    /// The whole machine minus the two above.
    rest: f64,
}

fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process, in clock ticks.
fn process_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces; the fields after it are plain.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // utime and stime are fields 14 and 15; here counted from field 3.
    field(11).unwrap_or(0) + field(12).unwrap_or(0)
}

/// Busy ticks of all CPUs together (everything but idle and iowait).
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is inside user)
    ticks.iter().take(8).sum::<u64>() - ticks.get(3).unwrap_or(&0) - ticks.get(4).unwrap_or(&0)
}

impl CpuSnapshot {
    fn take(server_pid: u32) -> CpuSnapshot {
        CpuSnapshot {
            at: Instant::now(),
            server: process_ticks(&server_pid.to_string()),
            this: process_ticks("self"),
            machine_busy: machine_busy_ticks(),
        }
    }

    fn since(self, before: CpuSnapshot, ticks_per_second: f64) -> CpuUse {
        let seconds = self.at.duration_since(before.at).as_secs_f64() * ticks_per_second;
        let cores = |ticks: u64| ticks as f64 / seconds;
        let server = cores(self.server.saturating_sub(before.server));
        let load_generator = cores(self.this.saturating_sub(before.this));
        let machine = cores(self.machine_busy.saturating_sub(before.machine_busy));
        CpuUse {
            server,
            load_generator,
            rest: (machine - server - load_generator).max(0.0),
        }
    }
}

// ---- the load driver -----------------------------------------------------------

/// One HTTP client per simulated agent or worker: its own connection.
fn http_client() -> Result<Client> {
    Ok(Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(30))
        .build()?)
}

/// Builds the `n`th request of client `i`.
trait MakeRequest: Fn(&Client, usize, u64) -> RequestBuilder + Send + Sync + 'static {}
impl<F: Fn(&Client, usize, u64) -> RequestBuilder + Send + Sync + 'static> MakeRequest for F {}

/// What one client saw.
#[derive(Debug, Default)]
struct ClientRun {
    /// Microseconds per request.
    latencies: Vec<u32>,
    /// Failed requests by kind (`HTTP 503`, `timeout`, ...).
    errors: BTreeMap<String, u64>,
    first_error: Option<String>,
    /// Bodies of successful responses, when asked for.
    bodies: Vec<Vec<u8>>,
}

/// Every client sends requests back to back until `duration` has passed;
/// requests started before then are finished and counted.
async fn drive(
    clients: &[Client],
    duration: Duration,
    keep_bodies: bool,
    make: Arc<dyn MakeRequest>,
) -> (Vec<ClientRun>, Duration) {
    let start = Instant::now();
    let deadline = start + duration;
    let runs: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, http)| {
            let (http, make) = (http.clone(), Arc::clone(&make));
            tokio::spawn(async move {
                let mut run = ClientRun::default();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let request = make(&http, i, n);
                    n += 1;
                    let sent = Instant::now();
                    let outcome = match request.send().await {
                        Ok(response) => {
                            let status = response.status();
                            match response.bytes().await {
                                Ok(body) if status.is_success() => Ok(body),
                                Ok(body) => Err((
                                    format!("HTTP {}", status.as_u16()),
                                    String::from_utf8_lossy(&body).into_owned(),
                                )),
                                Err(e) => Err((error_kind(&e), e.to_string())),
                            }
                        }
                        Err(e) => Err((error_kind(&e), e.to_string())),
                    };
                    let micros = sent.elapsed().as_micros();
                    run.latencies
                        .push(u32::try_from(micros).unwrap_or(u32::MAX));
                    match outcome {
                        Ok(body) if keep_bodies => run.bodies.push(body.to_vec()),
                        Ok(_) => {}
                        Err((kind, detail)) => {
                            *run.errors.entry(kind).or_default() += 1;
                            run.first_error.get_or_insert(detail);
                        }
                    }
                }
                run
            })
        })
        .collect();
    let mut done = Vec::with_capacity(runs.len());
    for run in runs {
        done.push(run.await.expect("a load client panicked"));
    }
    (done, start.elapsed())
}

fn error_kind(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect".into()
    } else {
        "transport".into()
    }
}

/// The figures of one scenario.
#[derive(Debug)]
struct Measured {
    requests: usize,
    elapsed: Duration,
    /// Sorted, in microseconds.
    latencies: Vec<u32>,
    errors: BTreeMap<String, u64>,
    first_error: Option<String>,
    cpu: CpuUse,
    bodies: Vec<Vec<u8>>,
}

impl Measured {
    fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Nearest-rank percentile, in milliseconds.
    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * self.latencies.len() as f64).ceil() as usize;
        f64::from(self.latencies[rank.clamp(1, self.latencies.len()) - 1]) / 1000.0
    }
}

/// Shared by the scenarios of one backend.
struct Bench<'a> {
    settings: &'a Settings,
    server: &'a Server,
    clients: Vec<Client>,
    ticks_per_second: f64,
}

impl Bench<'_> {
    /// Warms up, then measures one scenario and prints its row.
    async fn scenario(&self, name: &str, keep_bodies: bool, make: impl MakeRequest) -> Measured {
        let make: Arc<dyn MakeRequest> = Arc::new(make);
        if !self.settings.warmup.is_zero() {
            drive(
                &self.clients,
                self.settings.warmup,
                false,
                Arc::clone(&make),
            )
            .await;
        }
        let before = CpuSnapshot::take(self.server.pid);
        let (runs, elapsed) = drive(&self.clients, self.settings.duration, keep_bodies, make).await;
        let cpu = CpuSnapshot::take(self.server.pid).since(before, self.ticks_per_second);
        let mut m = Measured {
            requests: 0,
            elapsed,
            latencies: Vec::new(),
            errors: BTreeMap::new(),
            first_error: None,
            cpu,
            bodies: Vec::new(),
        };
        for run in runs {
            m.latencies.extend(run.latencies);
            for (kind, n) in run.errors {
                *m.errors.entry(kind).or_default() += n;
            }
            m.first_error = m.first_error.or(run.first_error);
            m.bodies.extend(run.bodies);
        }
        m.requests = m.latencies.len();
        m.latencies.sort_unstable();
        print_row(name, &m);
        m
    }

    fn url(&self, path: &str) -> String {
        self.server.url(path)
    }
}

fn print_header() {
    println!(
        "  {:<22} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7}   {:<24}",
        "scenario",
        "requests",
        "req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "errors",
        "CPU cores: server/loadgen/rest"
    );
}

fn print_row(name: &str, m: &Measured) {
    println!(
        "  {:<22} {:>9} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7}   {:.2} / {:.2} / {:.2}",
        name,
        m.requests,
        m.requests as f64 / m.elapsed.as_secs_f64(),
        m.percentile_ms(50.0),
        m.percentile_ms(90.0),
        m.percentile_ms(99.0),
        m.latencies.last().map_or(0.0, |&us| f64::from(us) / 1000.0),
        m.error_count(),
        m.cpu.server,
        m.cpu.load_generator,
        m.cpu.rest,
    );
    if m.error_count() > 0 {
        let kinds: Vec<String> = m.errors.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        println!("  {:<22} errors: {}", "", kinds.join(", "));
        if let Some(detail) = &m.first_error {
            let detail: String = detail.chars().take(300).collect();
            println!("  {:<22} first: {detail}", "");
        }
    }
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("unknown".into(), |k| {
        format!("{:.1} MiB", k as f64 / 1024.0)
    })
}

// ---- setup over the API --------------------------------------------------------

/// Sends a setup request and returns its JSON body; anything but 2xx fails.
async fn call(request: RequestBuilder) -> Result<Value> {
    let response = request.send().await?;
    let status = response.status();
    let body = response.text().await?;
    if !status.is_success() {
        bail!("setup request answered {status}: {body}");
    }
    Ok(serde_json::from_str(&body)?)
}

fn text_at(v: &Value, pointer: &str) -> Result<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("no {pointer} in {v}"))
}

/// A task as its agent knows it.
#[derive(Debug, Clone)]
struct AgentTask {
    id: Uuid,
    bearer: String,
}

impl AgentTask {
    fn from_created(body: &Value) -> Result<AgentTask> {
        Ok(AgentTask {
            id: text_at(body, "/task/id")?.parse()?,
            bearer: format!("Bearer {}", text_at(body, "/agent_token")?),
        })
    }
}

/// An active task, with both credentials and the ids of its events.
#[derive(Debug, Clone)]
struct ActiveTask {
    agent: AgentTask,
    worker_bearer: String,
    event_ids: Vec<i64>,
}

/// Posts a JSON `body` to `path` with the development key; returns the answer.
async fn post_with_dev_key(
    http: &Client,
    server: &Server,
    path: &str,
    body: &'static str,
) -> Result<Value> {
    call(
        http.post(server.url(path))
            .header(DEV_KEY_HEADER, &server.dev_key)
            .header(CONTENT_TYPE, "application/json")
            .body(body),
    )
    .await
}

/// Registers a worker with the development key; returns its `Authorization`
/// value.
async fn register_worker(http: &Client, server: &Server) -> Result<String> {
    let worker = post_with_dev_key(
        http,
        server,
        "/api/v1/workers",
        r#"{"name":"Bench Worker"}"#,
    )
    .await?;
    Ok(format!("Bearer {}", text_at(&worker, "/worker_token")?))
}

/// Creates a task with `key` (an agent's API key) or else the development
/// key; returns the creation's answer.
async fn create_task(http: &Client, server: &Server, key: Option<&str>) -> Result<Value> {
    let Some(key) = key else {
        return post_with_dev_key(http, server, "/api/v1/tasks", CREATE_BODY).await;
    };
    call(
        http.post(server.url("/api/v1/tasks"))
            .header(AUTHORIZATION, format!("Bearer {key}"))
            .header(CONTENT_TYPE, "application/json")
            .body(CREATE_BODY),
    )
    .await
}

/// Publishes task `id` as its agent, then takes the worker's `actions`
/// (`claim`, `start`, …) on it, one after the other.
async fn publish_and_work(
    http: &Client,
    server: &Server,
    id: &str,
    agent_bearer: &str,
    worker_bearer: &str,
    actions: &[&str],
) -> Result<()> {
    call(
        http.post(server.url(&format!("/api/v1/tasks/{id}/publish")))
            .header(AUTHORIZATION, agent_bearer),
    )
    .await?;
    for action in actions {
        call(
            http.post(server.url(&format!("/api/v1/worker/tasks/{id}/{action}")))
                .header(AUTHORIZATION, worker_bearer),
        )
        .await?;
    }
    Ok(())
}

/// Sends MESSAGE_BODY as the worker of task `id`; returns the answer.
async fn send_message(
    http: &Client,
    server: &Server,
    id: &str,
    worker_bearer: &str,
) -> Result<Value> {
    call(
        http.post(server.url(&format!("/api/v1/worker/tasks/{id}/messages")))
            .header(AUTHORIZATION, worker_bearer)
            .header(CONTENT_TYPE, "application/json")
            .body(MESSAGE_BODY),
    )
    .await
}

/// Registers a worker, creates, publishes, claims and starts a task, then
/// sends `messages` messages; returns the task with its event ids.
async fn active_task(bench: &Bench<'_>, http: &Client, messages: usize) -> Result<ActiveTask> {
    let worker_bearer = register_worker(http, bench.server).await?;
    let created = create_task(http, bench.server, None).await?;
    let agent = AgentTask::from_created(&created)?;
    let id = agent.id;
    publish_and_work(
        http,
        bench.server,
        &id.to_string(),
        &agent.bearer,
        &worker_bearer,
        &["claim", "start"],
    )
    .await?;
    for _ in 0..messages {
        send_message(http, bench.server, &id.to_string(), &worker_bearer).await?;
    }
    let page = call(
        http.get(bench.url(&format!("/api/v1/tasks/{id}/events?after=0&limit=1000")))
            .header(AUTHORIZATION, &agent.bearer),
    )
    .await?;
    let event_ids = page["events"]
        .as_array()
        .context("no events in the feed")?
        .iter()
        .filter_map(|e| e["id"].as_i64())
        .collect();
    Ok(ActiveTask {
        agent,
        worker_bearer,
        event_ids,
    })
}

/// One active task per client, set up concurrently.
async fn active_tasks(bench: &Bench<'_>, messages: usize) -> Result<Vec<ActiveTask>> {
    futures::future::try_join_all(
        bench
            .clients
            .iter()
            .map(|http| active_task(bench, http, messages)),
    )
    .await
}

// ---- one backend ---------------------------------------------------------------

/// Runs every scenario on one backend; returns the number of failed requests.
async fn bench_backend(settings: &Settings, backend: Backend) -> Result<u64> {
    let dir = tempfile::tempdir()?;
    let (database_url, shown_url) = match backend {
        Backend::Sqlite => {
            let url = format!("sqlite://{}/b.db", dir.path().display());
            (url.clone(), url)
        }
        Backend::Postgres => {
            let url = fresh_postgres_database().await;
            let shown = meatspace_store::redact_url(&url);
            (url, shown)
        }
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!();
    println!(
        "== {} ({shown_url}); load average {}",
        backend.name(),
        load.join(" ")
    );
    let started = Instant::now();
    let server = Server::start(&settings.server, &database_url, dir.path()).await?;
    let startup = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "  server ready in {:.2} s; RSS at idle 1 s later: {}",
        startup.as_secs_f64(),
        mib(server.memory_kib("VmRSS"))
    );
    if backend == Backend::Postgres {
        println!("  (PostgreSQL runs on this machine too; its CPU is in the \"rest\" column)");
    }

    let bench = Bench {
        settings,
        server: &server,
        clients: (0..settings.clients)
            .map(|_| http_client())
            .collect::<Result<_>>()?,
        ticks_per_second: clock_ticks_per_second(),
    };
    let failed = run_scenarios(&bench).await?;
    println!(
        "  server peak RSS (VmHWM): {}",
        mib(server.memory_kib("VmHWM"))
    );
    drop(bench);
    server.stop().await?;
    let logged = log_tail(dir.path());
    if !logged.is_empty() {
        println!("  the server logged (last lines):\n{logged}");
    }
    if backend == Backend::Postgres {
        drop_postgres_database(&database_url).await?;
    }
    Ok(failed)
}

async fn run_scenarios(bench: &Bench<'_>) -> Result<u64> {
    let clients = bench.clients.len();
    print_header();

    // 1. Create tasks; their bodies feed scenario 2.
    let base = bench.server.base_url.clone();
    let dev_key = bench.server.dev_key.clone();
    let create_url = format!("{base}/api/v1/tasks");
    let created = bench
        .scenario("1 create task", true, move |http, _, _| {
            http.post(&create_url)
                .header(DEV_KEY_HEADER, &dev_key)
                .header(CONTENT_TYPE, "application/json")
                .body(CREATE_BODY)
        })
        .await;
    let mut failed = created.error_count();
    let tasks: Vec<AgentTask> = created
        .bodies
        .iter()
        .map(|b| AgentTask::from_created(&serde_json::from_slice(b)?))
        .collect::<Result<_>>()?;
    if tasks.is_empty() {
        bail!("scenario 1 created no tasks");
    }

    // 2. Read them back, each client walking its own stride of the tasks.
    let tasks = Arc::new(tasks);
    let b = base.clone();
    let read = bench
        .scenario("2 get task", false, move |http, i, n| {
            let task = &tasks[(i + n as usize * clients) % tasks.len()];
            http.get(format!("{b}/api/v1/tasks/{}", task.id))
                .header(AUTHORIZATION, &task.bearer)
        })
        .await;
    failed += read.error_count();

    // 3. Poll feeds of FEED_EVENTS events; `after` cycles through the feed.
    let feeds = Arc::new(active_tasks(bench, FEED_EVENTS - 3).await?);
    for feed in feeds.iter() {
        if feed.event_ids.len() != FEED_EVENTS {
            bail!(
                "a polled task has {} events, not {FEED_EVENTS}",
                feed.event_ids.len()
            );
        }
    }
    let b = base.clone();
    let poll = bench
        .scenario("3 poll events", false, move |http, i, n| {
            let feed = &feeds[i];
            let skip = (n as usize + i) % (FEED_EVENTS + 1);
            let after = if skip == 0 {
                0
            } else {
                feed.event_ids[skip - 1]
            };
            http.get(format!(
                "{b}/api/v1/tasks/{}/events?after={after}",
                feed.agent.id
            ))
            .header(AUTHORIZATION, &feed.agent.bearer)
        })
        .await;
    failed += poll.error_count();

    // 4. Worker messages, each client on its own active task.
    let active = Arc::new(active_tasks(bench, 0).await?);
    let b = base;
    let message = bench
        .scenario("4 worker message", false, move |http, i, _| {
            let task = &active[i];
            http.post(format!(
                "{b}/api/v1/worker/tasks/{}/messages",
                task.agent.id
            ))
            .header(AUTHORIZATION, &task.worker_bearer)
            .header(CONTENT_TYPE, "application/json")
            .body(MESSAGE_BODY)
        })
        .await;
    failed += message.error_count();
    Ok(failed)
}

/// Drops the benchmark's database from the PostgreSQL server.
async fn drop_postgres_database(url: &str) -> Result<()> {
    let name = url
        .split('?')
        .next()
        .and_then(|u| u.rsplit('/').next())
        .context("no database name in the URL")?;
    let admin = std::env::var(POSTGRES_ENV)?;
    let mut conn = sqlx::PgConnection::connect(&admin).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}
