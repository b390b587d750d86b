//! The real `meatspace-api-server` binary as a child process, for tests
//! that restart the server (same database, new process) and for
//! benchmarks. The binary is the one cargo built next to the test binary
//! (`cargo build -p meatspace-api-server`, which `scripts/test` runs), or
//! `MEATSPACE_API_SERVER_BIN`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// Path of the API server binary.
pub fn api_server_bin() -> PathBuf {
    let path = match std::env::var_os("MEATSPACE_API_SERVER_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("test binary path");
            // target/<profile>/deps/<test> → target/<profile>/meatspace-api-server
            exe.parent()
                .and_then(|deps| deps.parent())
                .expect("target directory")
                .join("meatspace-api-server")
        }
    };
    assert!(
        path.is_file(),
        "the API server binary {} does not exist: build it first with \
         `cargo build -p meatspace-api-server` (scripts/test does), or set MEATSPACE_API_SERVER_BIN",
        path.display()
    );
    path
}

/// A free TCP port on 127.0.0.1 (free when this returns).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A running `meatspace-api-server`. Killed if dropped while running.
#[derive(Debug)]
pub struct ApiServerProcess {
    child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base_url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ApiServerProcess {
    /// Starts the binary on a free port of 127.0.0.1 with exactly `env`
    /// (plus the listen address) and waits until `/readyz` answers 200.
    pub async fn start(env: &[(&str, &str)]) -> ApiServerProcess {
        let dir = tempfile::tempdir().expect("temporary directory");
        let log = dir.path().join("api-server.log");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = tokio::process::Command::new(api_server_bin());
        cmd.env_clear()
            .env("MEATSPACE_LISTEN_ADDR", &addr)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true);
        let child = cmd.spawn().expect("start meatspace-api-server");
        let mut p = ApiServerProcess {
            child,
            base_url: format!("http://{addr}"),
            log,
            _dir: dir,
        };
        p.ready().await;
        p
    }

    /// What the process has logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    async fn ready(&mut self) {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(format!("{}/readyz", self.base_url)).send().await
                && r.status() == 200
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "meatspace-api-server exited with {status}:\n{}",
                    self.logs()
                );
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "not ready after 60 s:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits for the exit; returns whether it exited 0 within 30 s.
    pub async fn terminate(&mut self) -> bool {
        let pid = self.pid().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success());
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => false,
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill -9");
    }
}
