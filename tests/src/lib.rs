//! Test harness for the black-box suites: real databases, a real server on
//! 127.0.0.1.
//!
//! PostgreSQL comes from a throwaway server that `scripts/postgres.sh`
//! starts (the test command does it); its admin URL arrives in
//! `MEATSPACE_TEST_POSTGRES_URL`. Each test gets a fresh database on it, so
//! tests run in parallel without seeing each other. A missing server is a
//! test failure, never a skip.

pub mod browser;
pub mod cli;
pub mod k8s;
pub mod pg;
pub mod process;
pub mod prometheus;
pub mod push;
pub mod schema;
pub mod server;
pub mod smtp;

use std::sync::Arc;

use meatspace_store::ConnectOptions;

use meatspace_domain::Policy;
use meatspace_store::Store;
use meatspace_store_connect::connect;
use sqlx::Connection;

/// Environment variable holding the admin URL of the test PostgreSQL server.
pub const POSTGRES_ENV: &str = "MEATSPACE_TEST_POSTGRES_URL";

/// Which backend a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Postgres,
    Sqlite,
}

/// A database for one test. Holds the SQLite directory alive while the test runs.
#[derive(Debug)]
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// A fresh, empty database of the given backend.
    pub async fn new(db: Db) -> TestDb {
        match db {
            Db::Postgres => TestDb {
                url: fresh_postgres_database().await,
                _dir: None,
            },
            Db::Sqlite => {
                let dir = tempfile::tempdir().expect("temporary directory");
                let url = format!("sqlite://{}/meatspace.db", dir.path().display());
                TestDb {
                    url,
                    _dir: Some(dir),
                }
            }
        }
    }

    /// A fresh, empty database on the PostgreSQL server at `admin_url`
    /// (for tests that run a server of their own, see [`pg::PgServer`]).
    pub async fn postgres_on(admin_url: &str) -> TestDb {
        TestDb {
            url: create_database(admin_url).await,
            _dir: None,
        }
    }

    /// Another handle on the same PostgreSQL database, for a second server
    /// (a replica) on it. SQLite has one owning process: not for it.
    pub fn replica(&self) -> TestDb {
        assert!(
            self._dir.is_none(),
            "replicas share a PostgreSQL database, not a SQLite file"
        );
        TestDb {
            url: self.url.clone(),
            _dir: None,
        }
    }

    /// Opens the store (running migrations) with the given policy.
    pub async fn store(&self, policy: Policy) -> Arc<dyn Store> {
        connect(&self.url, policy, &ConnectOptions::default())
            .await
            .expect("open the store")
    }
}

/// Creates a new database on the test PostgreSQL server and returns its URL.
///
/// Panics when the server is not configured: run the suite with
/// `scripts/test`, which starts one.
pub async fn fresh_postgres_database() -> String {
    let admin = std::env::var(POSTGRES_ENV).unwrap_or_else(|_| {
        panic!(
            "{POSTGRES_ENV} is not set: these tests need a real PostgreSQL server. \
             Run the suite with scripts/test, which starts a throwaway one."
        )
    });
    create_database(&admin).await
}

/// Creates a new database on the server at `admin` and returns its URL.
async fn create_database(admin: &str) -> String {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .unwrap_or_else(|e| panic!("connect to the test PostgreSQL server: {e}"));
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create test database");
    conn.close().await.ok();
    replace_database(admin, &name)
}

/// `url` with its database name replaced by `name`.
pub(crate) fn replace_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// Polls `check` every 20 ms until it yields a value; fails after `limit`
/// naming `what`. Returns the value and how long it took. The one polling
/// loop of the suite: tests wait on a condition, never for a fixed time.
pub async fn eventually_timed<T, F, Fut>(
    limit: std::time::Duration,
    what: &str,
    check: F,
) -> (T, std::time::Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_every(std::time::Duration::from_millis(20), limit, what, check).await
}

/// [`eventually_timed`], polling every `every`: for a condition that
/// holds only briefly (a sweep under way), which a test must see soon.
pub async fn eventually_every<T, F, Fut>(
    every: std::time::Duration,
    limit: std::time::Duration,
    what: &str,
    mut check: F,
) -> (T, std::time::Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return (v, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        // The interval of the poll: the condition is what is waited for.
        tokio::time::sleep(every).await;
    }
}

/// [`eventually_timed`], for the value only.
pub async fn eventually<T, F, Fut>(limit: std::time::Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_timed(limit, what, check).await.0
}

/// CPU time this process has used (user and system, all threads), from
/// /proc/self/stat in clock ticks of 10 ms: the benchmarks' CPU per
/// operation.
pub fn cpu_time() -> std::time::Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // After the command name in parentheses: fields 14 and 15 are utime and stime.
    let rest = &stat[stat.rfind(')').expect("stat") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    std::time::Duration::from_millis(ticks * 10)
}

/// Runs `command` to its end and returns what it printed; fails the test,
/// showing its stderr, unless it succeeded. `what` names it in the failure.
pub async fn run_ok(command: &mut tokio::process::Command, what: &str) -> std::process::Output {
    let out = command
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert_succeeded(&out, what);
    out
}

/// [`run_ok`] for a blocking [`std::process::Command`].
pub fn run_ok_blocking(command: &mut std::process::Command, what: &str) -> std::process::Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert_succeeded(&out, what);
    out
}

fn assert_succeeded(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every stored byte of the test database: a `pg_dump`, or the SQLite
/// files (database, WAL and shared memory).
pub async fn stored_bytes(backend: Db, url: &str) -> Vec<u8> {
    match backend {
        Db::Postgres => {
            let mut pg_dump = tokio::process::Command::new(pg_dump());
            pg_dump.arg("--no-owner").arg("--dbname").arg(url);
            run_ok(&mut pg_dump, "pg_dump").await.stdout
        }
        Db::Sqlite => {
            let path = url.trim_start_matches("sqlite://");
            let mut bytes = Vec::new();
            for suffix in ["", "-wal", "-shm"] {
                if let Ok(b) = std::fs::read(format!("{path}{suffix}")) {
                    bytes.extend(b);
                }
            }
            bytes
        }
    }
}

/// `pg_dump` of the test server's installation: `MEATSPACE_TEST_PG_BIN`
/// (set by scripts/postgres.sh), else the newest Debian installation.
fn pg_dump() -> std::path::PathBuf {
    if let Ok(bin) = std::env::var("MEATSPACE_TEST_PG_BIN") {
        return std::path::PathBuf::from(bin).join("pg_dump");
    }
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/pg_dump"))
        .filter(|p| p.exists())
        .collect();
    found.sort_by_key(|p| {
        p.components()
            .nth(4)
            .and_then(|c| c.as_os_str().to_str()?.parse::<u32>().ok())
    });
    found
        .pop()
        .expect("pg_dump not found: set MEATSPACE_TEST_PG_BIN to PostgreSQL's bin directory")
}

/// `GET /metrics` of a server process's own metrics listener; asserts 200
/// and returns the answer.
pub async fn process_metrics(
    http: &reqwest::Client,
    api: &process::ServerProcess,
) -> reqwest::Response {
    let metrics_addr = api.metrics_addr.as_deref().expect("a metrics address");
    let res = http
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(res.status(), reqwest::StatusCode::OK, "GET /metrics");
    res
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            replace_database("postgres://u@h:1/postgres", "x"),
            "postgres://u@h:1/x"
        );
        assert_eq!(
            replace_database("postgres://u@h:1/postgres?sslmode=disable", "x"),
            "postgres://u@h:1/x?sslmode=disable"
        );
        assert_eq!(
            replace_database("postgres://u@h:1", "x"),
            "postgres://u@h:1/x"
        );
    }
}
