//! The API server killed with SIGKILL and restarted while an agent follows
//! a task: `meatspace task watch` (over SSE and over long poll) keeps
//! going, says on stderr that it is retrying, resumes from its cursor and
//! prints the whole feed exactly once (no gap, no duplicate) before it
//! exits 0 at the terminal event; `meatspace mcp`'s wait_for_events called
//! while the server is down waits it out and returns the next event rather
//! than an error.
//!
//! The server runs as a process (SQLite in a directory of the test, on a
//! fixed address, so the restart comes back where the clients look); the
//! CLI is the built binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use meatspace_tests::cli::{call_tool, call_tool_result, cli_bin, mcp_open_task, mcp_session};
use meatspace_tests::process::{Binary, DevApi, ServerProcess, free_port};
use meatspace_tests::server::{ids, types};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const DEV_KEY: &str = "msd_restart_test_dev_key_0123456789";

/// A server on a fixed address in `dir`, restartable.
struct Restartable {
    dir: PathBuf,
    addr: String,
    runs: usize,
    process: ServerProcess,
}

impl Restartable {
    async fn start(dir: &Path) -> Restartable {
        let addr = format!("127.0.0.1:{}", free_port());
        let process = Self::spawn(dir, &addr, 0);
        let mut s = Restartable {
            dir: dir.to_owned(),
            addr,
            runs: 1,
            process,
        };
        s.process.ready().await;
        s
    }

    fn spawn(dir: &Path, addr: &str, run: usize) -> ServerProcess {
        ServerProcess::start_in(
            Binary::ApiServer,
            dir,
            &format!("server-{run}"),
            addr,
            &[
                ("MEATSPACE_DEV_KEY", DEV_KEY),
                ("MEATSPACE_RATE_LIMIT_PER_SECOND", "0"),
            ],
        )
    }

    async fn restart(&mut self) {
        self.process = Self::spawn(&self.dir, &self.addr, self.runs);
        self.runs += 1;
        self.process.ready().await;
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn api(&self) -> DevApi {
        DevApi::new(&self.base(), DEV_KEY)
    }
}

type Lines<R> = tokio::io::Lines<BufReader<R>>;

async fn next_line<R: tokio::io::AsyncRead + Unpin>(lines: &mut Lines<R>, what: &str) -> String {
    tokio::time::timeout(Duration::from_secs(90), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("no {what} within 90 s"))
        .expect("read")
        .unwrap_or_else(|| panic!("output ended before {what}"))
}

/// The next line of a JSON watch; an event's id is added to `printed`.
async fn read_event<R: tokio::io::AsyncRead + Unpin>(
    out: &mut Lines<R>,
    printed: &mut Vec<i64>,
) -> Value {
    let line = next_line(out, "an event line").await;
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    if v["kind"] == "event" {
        printed.push(v["event"]["id"].as_i64().unwrap());
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_over_sse_survives_a_server_restart() {
    watch_survives_a_server_restart("sse").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_over_long_poll_survives_a_server_restart() {
    watch_survives_a_server_restart("long-poll").await;
}

async fn watch_survives_a_server_restart(transport: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Restartable::start(dir.path()).await;
    let base = server.base();
    let api = server.api();
    let (id, token, wtoken) = api.active_task("Count the bikes in the rack", "Ada").await;

    // The task was made with curl-like calls: the CLI adopts it.
    let state = dir.path().join("state");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let import = tokio::process::Command::new(cli_bin())
        .env_clear()
        .env("MEATSPACE_URL", &base)
        .env("MEATSPACE_STATE_DIR", &state)
        .args(["task", "import", &id.to_string(), "--token-file"])
        .arg(&token_file)
        .output()
        .await
        .unwrap();
    assert!(import.status.success(), "{:?}", import);

    let mut watch = tokio::process::Command::new(cli_bin())
        .env_clear()
        .env("MEATSPACE_URL", &base)
        .env("MEATSPACE_STATE_DIR", &state)
        .args(["--output", "json", "task", "watch", &id.to_string()])
        .args(["--transport", transport])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut err = BufReader::new(watch.stderr.take().unwrap()).lines();
    let mut printed: Vec<i64> = Vec::new();
    api.worker_post(&wtoken, id, "messages", json!({ "text": "one" }))
        .await;
    loop {
        let v = read_event(&mut out, &mut printed).await;
        if v["event"]["data"]["text"] == "one" {
            break;
        }
    }

    // SIGKILL: the watch must notice, say so, and keep trying.
    server.process.kill().await;
    loop {
        let line = next_line(&mut err, "a retry notice on stderr").await;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_ne!(v["kind"], "error", "the watch gave up: {line}");
        if v["kind"] == "retry" {
            break;
        }
    }
    assert!(
        watch.try_wait().unwrap().is_none(),
        "the watch exited while the server was down"
    );
    server.restart().await;
    // Drain stderr from here on, so the watch never blocks on it.
    let notices = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Ok(Some(line)) = err.next_line().await {
            all.push(line);
        }
        all
    });

    for text in ["two", "three"] {
        api.worker_post(&wtoken, id, "messages", json!({ "text": text }))
            .await;
    }
    api.worker_post(&wtoken, id, "complete", json!({ "text": "12 bikes" }))
        .await;
    let last = loop {
        let v = read_event(&mut out, &mut printed).await;
        if v["kind"] == "final" {
            break v;
        }
    };
    assert_eq!(last["task"]["state"], "completed", "{last}");
    let status = tokio::time::timeout(Duration::from_secs(30), watch.wait())
        .await
        .expect("the watch exits after the final line")
        .unwrap();
    assert!(status.success(), "exit {status}");
    let notices = notices.await.unwrap();
    assert!(
        notices.iter().all(|l| !l.contains("\"kind\":\"error\"")),
        "{notices:?}"
    );
    assert_eq!(
        printed,
        ids(&api.events(&token, id, "after=0&limit=500").await),
        "every event printed once, in order, across the restart"
    );
    server.process.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_wait_for_events_waits_out_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Restartable::start(dir.path()).await;
    let base = server.base();
    let stderr_path = dir.path().join("mcp.stderr");
    let mut cmd = tokio::process::Command::new(cli_bin());
    cmd.env_clear()
        .env("MEATSPACE_DEV_KEY", DEV_KEY)
        .args(["mcp", "--url", &base, "--state-dir"])
        .arg(dir.path().join("state"));
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let client = mcp_session(cmd, stderr).await;
    let id = mcp_open_task(&client, "Check the mailbox").await;

    // A worker claims; the agent reads up to there.
    let api = server.api();
    let wtoken = api.register_worker("Lin").await;
    api.worker_post(&wtoken, id, "claim", json!({})).await;
    let first = call_tool(
        &client,
        "wait_for_events",
        json!({ "task_id": id, "cursor": 0 }),
    )
    .await;
    let cursor = first["next_cursor"].as_i64().unwrap();

    // Down: a wait starts now and must outlast the restart.
    server.process.kill().await;
    let peer = client.peer().clone();
    let waiting = tokio::spawn(async move {
        call_tool_result(
            &peer,
            "wait_for_events",
            json!({ "task_id": id, "cursor": cursor, "wait_seconds": 25 }),
        )
        .await
    });
    meatspace_tests::eventually(
        Duration::from_secs(60),
        "wait_for_events says it is retrying",
        || async {
            std::fs::read_to_string(&stderr_path)
                .unwrap_or_default()
                .contains("retrying")
                .then_some(())
        },
    )
    .await;
    server.restart().await;
    api.worker_post(&wtoken, id, "start", json!({})).await;
    let result = tokio::time::timeout(Duration::from_secs(90), waiting)
        .await
        .expect("wait_for_events answers")
        .unwrap();
    assert_ne!(
        result.is_error,
        Some(true),
        "a restart is not an error: {result:?}"
    );
    let result = result.structured_content.unwrap();
    let events = result["events"].as_array().expect("events");
    assert_eq!(types(events), ["task.started"], "{result}");
    client.cancel().await.ok();
    server.process.kill().await;
}
