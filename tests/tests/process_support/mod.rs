//! The API server binary run the way a user runs it: in a directory of the
//! test's choosing (its `.meatspace/` data lands there), on an address the
//! test picks (so a restart comes back where clients look for it), with
//! stdout and stderr kept apart in files (the dev key is printed on stdout,
//! logs and start-up errors go to stderr).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use meatspace_tests::process::Binary;
pub use meatspace_tests::process::free_port;

/// One run of `meatspace-api-server`.
#[derive(Debug)]
pub struct ApiProcess {
    child: tokio::process::Child,
    /// `host:port` it was told to listen on.
    pub addr: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl ApiProcess {
    /// Starts the server in `dir` with only `env` set (plus RUST_LOG and
    /// PATH); `name` tells the output files of several runs apart.
    pub fn start(dir: &Path, name: &str, addr: &str, env: &[(&str, &str)]) -> ApiProcess {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = tokio::process::Command::new(Binary::ApiServer.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("MEATSPACE_LISTEN_ADDR", addr)
            // The metrics listener's default port would be shared by every
            // server of the suite running at once.
            .env("MEATSPACE_METRICS_LISTEN_ADDR", "127.0.0.1:0")
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .kill_on_drop(true)
            .spawn()
            .expect("start meatspace-api-server");
        ApiProcess {
            child,
            addr: addr.to_owned(),
            stdout,
            stderr,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits (up to a minute) until `/readyz` answers 200.
    pub async fn ready(&mut self) {
        let client = reqwest::Client::new();
        let url = format!("{}/readyz", self.base_url());
        let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the server exited with {status}:\n{}\n{}",
                    self.stdout(),
                    self.stderr()
                );
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "not ready after a minute:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for a server that must refuse to start to exit.
    pub async fn exit(&mut self) -> ExitStatus {
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("still running after a minute:\n{}", self.stderr()))
            .expect("wait for the server")
    }

    /// SIGKILL, and waits until it is gone.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill -9");
    }

    /// The dev key the server printed on stdout.
    pub fn printed_dev_key(&self) -> Option<String> {
        self.stdout()
            .lines()
            .find(|l| l.starts_with("meatspace dev key"))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    }
}
