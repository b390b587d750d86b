//! A PostgreSQL server of one test's own, for fault tests that stop and
//! restart it (the suite's shared server must stay up for everyone else).
//!
//! It is the same throwaway server `scripts/postgres.sh` starts for the
//! suite: its own data directory, a free port on 127.0.0.1, trust
//! authentication. [`PgServer::stop_fast`] and [`PgServer::start`] run
//! `pg_ctl` on that data directory, so the server comes back on the same
//! port with the same data, as after an operator's restart.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A running (or stopped) PostgreSQL server; removed when dropped.
#[derive(Debug)]
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Admin URL (`postgres://postgres@127.0.0.1:PORT/postgres`).
    pub admin_url: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres.sh")
}

impl PgServer {
    /// Starts a new server; panics (with the script's output) if it cannot.
    pub fn start_new() -> PgServer {
        // Under /tmp: the postgres user must be able to enter it, and a
        // unix socket path must stay short.
        let dir = tempfile::Builder::new()
            .prefix("meatspace-pg-")
            .tempdir_in("/tmp")
            .expect("temporary directory");
        let out = crate::run_ok_blocking(
            Command::new(script())
                .arg("start")
                .arg(dir.path())
                // As production must: a crashed server then loses no commit it
                // acknowledged (with it off, the WAL of an acknowledged commit
                // may still be in shared memory when the server is killed).
                .env("MEATSPACE_PG_SYNCHRONOUS_COMMIT", "on"),
            "scripts/postgres.sh start",
        );
        let env = String::from_utf8_lossy(&out.stdout).into_owned();
        let value = |key: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("export {key}=")))
                .unwrap_or_else(|| panic!("{key} missing from the server's env: {env}"))
                .trim_matches('\'')
                .to_owned()
        };
        PgServer {
            bin: PathBuf::from(value("MEATSPACE_TEST_PG_BIN")),
            admin_url: value("MEATSPACE_TEST_POSTGRES_URL"),
            dir,
        }
    }

    /// `pg_ctl ARGS` on this server's data directory, as the user that
    /// owns it; returns whether it succeeded and how long it took.
    fn pg_ctl(&self, args: &[&str]) -> (bool, Duration, String) {
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("postgres.log");
        let pg_ctl = self.bin.join("pg_ctl");
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
            c
        } else {
            Command::new(&pg_ctl)
        };
        cmd.current_dir(self.dir.path())
            .arg("--pgdata")
            .arg(&data)
            .arg("--log")
            .arg(&log)
            .args(args);
        let started = Instant::now();
        let out = cmd.output().expect("run pg_ctl");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), started.elapsed(), said)
    }

    /// A fast shutdown (`pg_ctl stop -m fast`: sessions are terminated,
    /// then a shutdown checkpoint), waiting at most `limit`. Returns how
    /// long it took, or `Err` with pg_ctl's words if it did not finish.
    pub fn stop_fast(&self, limit: Duration) -> Result<Duration, String> {
        let timeout = limit.as_secs().max(1).to_string();
        let (ok, took, said) =
            self.pg_ctl(&["stop", "-m", "fast", "--wait", "--timeout", &timeout]);
        if ok { Ok(took) } else { Err(said) }
    }

    /// Starts the stopped server again (same data, same port) and waits
    /// until it accepts connections.
    pub fn start(&self) -> Duration {
        let (ok, took, said) = self.pg_ctl(&["start", "--wait", "--timeout", "60"]);
        assert!(ok, "pg_ctl start failed: {said}");
        took
    }
}

impl PgServer {
    /// Kills the postmaster with SIGKILL, as a crash would (`postgres.sh
    /// crash`); the data directory stays.
    pub fn crash(&self) {
        self.script(&["crash"]);
    }

    /// Starts a crashed server again on the same data and port (`postgres.sh
    /// restart`, which waits out the backends the crash orphaned) and waits
    /// until it accepts connections.
    pub fn restart_after_crash(&self) {
        self.script(&["restart"]);
    }

    fn script(&self, args: &[&str]) {
        crate::run_ok_blocking(
            Command::new(script()).args(args).arg(self.dir.path()),
            &format!("scripts/postgres.sh {args:?}"),
        );
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
