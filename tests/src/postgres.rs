//! A PostgreSQL server of a test's own, for the fault tests that crash and
//! restart it (the shared test server must keep running for every other
//! test). It is `scripts/postgres.sh` driven from Rust: `start` in a fresh
//! directory, `crash` (SIGKILL of the postmaster), `restart` on the same
//! data directory and port, and `stop` when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use sqlx::Connection;

/// A throwaway PostgreSQL server; stopped and removed on drop.
#[derive(Debug)]
pub struct OwnPostgres {
    dir: PathBuf,
    /// Admin URL (database `postgres`).
    pub admin_url: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres.sh")
}

async fn run(args: &[&str]) -> String {
    let out = tokio::process::Command::new("bash")
        .arg(script())
        .args(args)
        // A crash must not lose acknowledged commits (see postgres.sh).
        .env("MEATSPACE_PG_SYNCHRONOUS_COMMIT", "on")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run scripts/postgres.sh");
    assert!(
        out.status.success(),
        "scripts/postgres.sh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl OwnPostgres {
    /// Starts a new server (a few seconds: initdb and start).
    pub async fn start() -> OwnPostgres {
        // Short path: the unix socket lives in it (107 bytes at most).
        let dir = std::env::temp_dir().join(format!(
            "ms-pg-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir_all(&dir).expect("create the server directory");
        let env = run(&["start", dir.to_str().expect("UTF-8 path")]).await;
        let admin_url = env
            .lines()
            .find_map(|l| l.strip_prefix("export MEATSPACE_TEST_POSTGRES_URL="))
            .expect("postgres.sh printed the URL")
            .trim_matches('\'')
            .to_owned();
        OwnPostgres { dir, admin_url }
    }

    /// A fresh, empty database on this server.
    pub async fn database(&self) -> String {
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&self.admin_url)
            .await
            .expect("connect to the own PostgreSQL server");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create the database");
        conn.close().await.ok();
        crate::replace_database(&self.admin_url, &name)
    }

    /// Kills the postmaster with SIGKILL, as a crash would.
    pub async fn crash(&self) {
        run(&["crash", self.dir()]).await;
    }

    /// Starts the server again on the same data and port; returns once it
    /// accepts connections.
    pub async fn restart(&self) {
        run(&["restart", self.dir()]).await;
    }

    fn dir(&self) -> &str {
        self.dir.to_str().expect("UTF-8 path")
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script())
            .args(["stop", self.dir()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
