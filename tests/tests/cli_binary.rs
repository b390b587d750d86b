//! The `meatspace` command-line tool as a real subprocess (the built
//! binary) against the real server on both backends: create, publish and
//! watch a task; a watch killed with SIGKILL mid-stream resumes from its
//! persisted cursor with no gap and no duplicate; the worker commands;
//! private state files; JSON output that parses; errors that say what to do.
//!
//! The binary is the one `cargo build --workspace --bins` (run by
//! scripts/test) put next to this test, or `MEATSPACE_CLI_BIN`.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use meatspace_tests::cli::{dev_cli as cli, json_of, run};
use meatspace_tests::server::{Expect, FULL_STORY, TestServer, ids, images, str_at, types};
use meatspace_tests::{Db, api_tests};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use uuid::Uuid;

api_tests!(
    watch_resumes_after_sigkill_without_gap_or_duplicate,
    worker_commands_do_a_task,
    errors_say_what_to_do_next,
    a_typed_result_is_reviewed_from_the_shell,
);

/// `meatspace task create --description DESCRIPTION ARGS…`: the new
/// task's id, and all it printed.
async fn create_task(cmd: Command, description: &str, args: &[&str]) -> (String, Value) {
    let created = json_of(
        cmd,
        &[&["task", "create", "--description", description], args].concat(),
    )
    .await;
    let id = created["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task id in {created}"));
    (id.to_owned(), created)
}

/// An agent's and a worker's CLI, each with its own state directory in a
/// temporary directory.
struct AgentAndWorker<'a> {
    server: &'a TestServer,
    dir: tempfile::TempDir,
    agent_state: PathBuf,
    worker_state: PathBuf,
}

impl<'a> AgentAndWorker<'a> {
    fn new(server: &'a TestServer) -> AgentAndWorker<'a> {
        let dir = tempfile::tempdir().unwrap();
        AgentAndWorker {
            server,
            agent_state: dir.path().join("agent"),
            worker_state: dir.path().join("worker"),
            dir,
        }
    }

    fn agent(&self) -> Command {
        cli(self.server, &self.agent_state)
    }

    fn worker(&self) -> Command {
        cli(self.server, &self.worker_state)
    }

    /// The worker sends a PNG, written to `png` first, as a photo of task
    /// `id`; returns the answer and the photo's id.
    async fn send_photo(&self, id: &str, png: &Path) -> (Value, String) {
        std::fs::write(png, images::png(20, 20)).unwrap();
        let photo = json_of(
            self.worker(),
            &["worker", "photo", id, png.to_str().unwrap()],
        )
        .await;
        let photo_id = str_at(&photo, "/events/0/data/photo_id");
        (photo, photo_id)
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

fn stored_cursor(state: &Path, id: Uuid) -> i64 {
    let text = std::fs::read_to_string(state.join(format!("tasks/{id}.json"))).expect("task file");
    let v: Value = serde_json::from_str(&text).expect("task file is JSON");
    v["cursor"].as_i64().expect("cursor")
}

/// A running `task watch --output json`, read line by line.
struct Watch {
    child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Watch {
    fn spawn(server: &TestServer, state: &Path, id: Uuid, transport: &str) -> Watch {
        let mut cmd = cli(server, state);
        cmd.args(["--output", "json", "task", "watch", &id.to_string()])
            .args(["--transport", transport])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("start meatspace task watch");
        let stdout = child.stdout.take().expect("stdout");
        Watch {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next printed line as JSON; `None` at the end of output.
    async fn line(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(90), self.lines.next_line())
            .await
            .expect("watch prints within the bound")
            .expect("read watch output")?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
    }

    /// Reads event lines until the one with id `last`; returns their ids.
    async fn events_through(&mut self, last: i64) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let v = self.line().await.expect("watch ended early");
            assert_eq!(v["kind"], "event", "{v}");
            let id = v["event"]["id"].as_i64().expect("event id");
            out.push(v["event"].clone());
            if id >= last {
                return out;
            }
        }
    }
}

/// Waits (up to a minute) until `check` holds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    meatspace_tests::eventually(Duration::from_secs(60), what, || {
        std::future::ready(check().then_some(()))
    })
    .await
}

async fn watch_resumes_after_sigkill_without_gap_or_duplicate(db: Db) {
    // Long poll: the transport every server has. An SSE variant is the
    // same body with "sse".
    watch_resumes_after_sigkill(db, "long-poll").await;
}

/// `task watch --transport TRANSPORT` killed with SIGKILL after printing
/// some events, restarted: together the two runs print the feed exactly.
async fn watch_resumes_after_sigkill(db: Db, transport: &str) {
    let server = TestServer::start(db).await;
    let clis = AgentAndWorker::new(&server);

    let (id, created) = create_task(
        clis.agent(),
        "Read the gas meter",
        &["--lifetime", "3600", "--publish"],
    )
    .await;
    assert_eq!(created["task"]["state"], "open", "{created}");
    let id: Uuid = id.parse().unwrap();
    let file = clis.agent_state.join(format!("tasks/{id}.json"));
    assert_eq!(created["state_file"], json!(file));
    assert_eq!(mode(&clis.agent_state), 0o700, "state directory is private");
    assert_eq!(mode(&clis.agent_state.join("tasks")), 0o700);
    assert_eq!(mode(&file), 0o600, "the token file is private");
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let token = stored["agent_token"]
        .as_str()
        .expect("token stored")
        .to_owned();
    // The stored token is the task's working credential.
    server.task(id, &token).await;

    let (_, worker_token) = server.register_worker("Ada").await;
    let worker = server.worker(&worker_token);
    for action in ["claim", "start"] {
        worker
            .post(&format!("/api/v1/worker/tasks/{id}/{action}"))
            .expect_json(StatusCode::OK)
            .await;
    }
    let message = |text: String| {
        let worker = server.worker(&worker_token);
        async move {
            worker
                .post(&format!("/api/v1/worker/tasks/{id}/messages"))
                .json(&json!({ "text": text }))
                .expect_json(StatusCode::OK)
                .await
        }
    };
    for i in 0..3 {
        message(format!("reading {i}")).await;
    }
    // published, assigned, started, 3 messages.
    let mut first = Watch::spawn(&server, &clis.agent_state, id, transport);
    let printed = first.events_through(6).await;
    // Mid-stream: more events arrive while it is following.
    message("reading 3 \u{1b}[2J".into()).await;
    let mut more = first.events_through(7).await;
    let mut printed_first = printed;
    printed_first.append(&mut more);
    // The cursor is stored once the batch is printed; kill it after that.
    eventually("the cursor of the printed events is stored", || {
        stored_cursor(&clis.agent_state, id) == 7
    })
    .await;
    first.child.start_kill().expect("SIGKILL");
    let status = first.child.wait().await.expect("wait for the killed watch");
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL");

    // While it is down, the feed moves on.
    message("reading 4".into()).await;
    message("reading 5".into()).await;
    let issue = worker
        .post(&format!("/api/v1/worker/tasks/{id}/issues"))
        .json(&json!({ "kind": "unclear_instructions", "text": "Which meter?" }))
        .expect_json(StatusCode::OK)
        .await;
    let issue_id = issue["events"][0]["id"].as_i64().unwrap();

    let mut second = Watch::spawn(&server, &clis.agent_state, id, transport);
    let mut printed_second = second.events_through(issue_id).await;
    // The agent answers the issue through the CLI while watch runs.
    let answered = json_of(
        clis.agent(),
        &[
            "task",
            "respond",
            &id.to_string(),
            &issue_id.to_string(),
            "--action",
            "clarify",
            "--text",
            "The one in the hall",
        ],
    )
    .await;
    assert_eq!(
        answered["events"][0]["type"], "agent.issue_response",
        "{answered}"
    );
    worker
        .post(&format!("/api/v1/worker/tasks/{id}/complete"))
        .json(&json!({ "text": "42 units" }))
        .expect_json(StatusCode::OK)
        .await;
    let final_line = loop {
        let v = second.line().await.expect("watch prints the final state");
        if v["kind"] == "final" {
            break v;
        }
        printed_second.push(v["event"].clone());
    };
    assert_eq!(final_line["task"]["state"], "completed", "{final_line}");
    assert!(
        second.line().await.is_none(),
        "nothing after the final state"
    );
    let status = second.child.wait().await.unwrap();
    assert!(
        status.success(),
        "watch exits 0 on a terminal task: {status}"
    );

    let feed = server.feed(id, &token).await;
    let mut all = printed_first.clone();
    all.extend(printed_second.iter().cloned());
    assert_eq!(
        ids(&all),
        ids(&feed),
        "no gap, no duplicate across the kill"
    );
    assert_eq!(all, feed, "every event printed as the server serves it");
    assert_eq!(
        ids(&printed_second)[0],
        8,
        "the restart resumed after the stored cursor"
    );
    assert_eq!(types(&all).last(), Some(&"task.completed"));
    for e in &all {
        if e["type"] == "worker.message" {
            assert_eq!(
                e["untrusted"], true,
                "worker text is flagged untrusted: {e}"
            );
        }
    }
    assert_eq!(
        stored_cursor(&clis.agent_state, id),
        *ids(&feed).last().unwrap()
    );

    // The local listing shows the last known state.
    let list = json_of(clis.agent(), &["task", "list"]).await;
    assert_eq!(list["tasks"][0]["id"], id.to_string(), "{list}");
    assert_eq!(list["tasks"][0]["state"], "completed", "{list}");
    assert!(
        list["tasks"][0].get("agent_token").is_none(),
        "listings never print tokens"
    );

    // For people: worker text is framed as untrusted and cannot drive the terminal.
    let human = run(
        clis.agent(),
        &[
            "task",
            "watch",
            &id.to_string(),
            "--from-start",
            "--transport",
            transport,
        ],
    )
    .await;
    assert!(human.status.success(), "{}", human.stderr);
    assert!(
        human.stdout.contains("UNTRUSTED worker-provided data"),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("text: reading 0"), "{}", human.stdout);
    assert!(
        human.stdout.contains("reading 3 \\u{1b}[2J"),
        "{}",
        human.stdout
    );
    assert!(
        !human.stdout.contains('\u{1b}'),
        "no raw escape reaches the terminal"
    );
    assert!(human.stdout.contains("task ended"), "{}", human.stdout);
    server.stop().await;
}

async fn worker_commands_do_a_task(db: Db) {
    let server = TestServer::start(db).await;
    let clis = AgentAndWorker::new(&server);

    let (id, created) = create_task(clis.agent(), "Feed the cat", &[]).await;
    assert_eq!(created["task"]["state"], "draft");
    let published = json_of(clis.agent(), &["task", "publish", &id]).await;
    assert_eq!(published["task"]["state"], "open");

    let registered = json_of(clis.worker(), &["worker", "register", "--name", "Lin"]).await;
    assert_eq!(registered["worker"]["name"], "Lin");
    assert_eq!(mode(&clis.worker_state.join("worker.json")), 0o600);
    let again = run(clis.worker(), &["worker", "register", "--name", "Lin"]).await;
    assert!(!again.status.success(), "a second register needs --replace");
    assert!(again.stderr.contains("--replace"), "{}", again.stderr);

    let open = json_of(clis.worker(), &["worker", "tasks"]).await;
    assert!(
        open["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == id),
        "{open}"
    );
    assert_eq!(
        json_of(clis.worker(), &["worker", "get", &id]).await["state"],
        "open"
    );
    json_of(clis.worker(), &["worker", "claim", &id]).await;
    let started = json_of(clis.worker(), &["worker", "start", &id]).await;
    assert_eq!(started["task"]["state"], "active");
    json_of(clis.worker(), &["worker", "message", &id, "At the door"]).await;
    let (photo, photo_id) = clis.send_photo(&id, &clis.dir.path().join("cat.png")).await;
    assert_eq!(photo["events"][0]["type"], "worker.photo");
    let issue = json_of(
        clis.worker(),
        &[
            "worker",
            "issue",
            &id,
            "--kind",
            "item_unavailable",
            "--text",
            "No cat food",
        ],
    )
    .await;
    assert_eq!(issue["events"][0]["data"]["kind"], "item_unavailable");
    let issue_id = issue["events"][0]["id"].as_i64().unwrap().to_string();
    json_of(
        clis.agent(),
        &[
            "task",
            "respond",
            &id,
            &issue_id,
            "--action",
            "acknowledge",
            "--text",
            "Buy some",
        ],
    )
    .await;
    let done = json_of(
        clis.worker(),
        &["worker", "complete", &id, "--text", "Cat fed"],
    )
    .await;
    assert_eq!(done["task"]["state"], "completed");

    let saved = clis.dir.path().join("photo.png");
    let got = json_of(
        clis.agent(),
        &[
            "task",
            "photo",
            &id,
            &photo_id,
            "--out",
            saved.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(got["content_type"], "image/png");
    assert!(std::fs::read(&saved).unwrap().starts_with(b"\x89PNG"));

    let task = json_of(clis.agent(), &["task", "get", &id]).await;
    assert_eq!(task["state"], "completed");
    let id: Uuid = id.parse().unwrap();
    let token = serde_json::from_str::<Value>(
        &std::fs::read_to_string(clis.agent_state.join(format!("tasks/{id}.json"))).unwrap(),
    )
    .unwrap()["agent_token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(types(&server.feed(id, &token).await), FULL_STORY);

    // Cancel and stop, on tasks of their own.
    let (other_id, _) = create_task(clis.agent(), "Walk the dog", &["--publish"]).await;
    let cancelled = json_of(clis.agent(), &["task", "cancel", &other_id]).await;
    assert_eq!(cancelled["task"]["state"], "cancelled");
    let (third_id, _) = create_task(clis.agent(), "Water the roses", &["--publish"]).await;
    json_of(clis.worker(), &["worker", "claim", &third_id]).await;
    let stopped = json_of(
        clis.worker(),
        &["worker", "stop", &third_id, "--text", "Hose broken"],
    )
    .await;
    assert_eq!(stopped["task"]["state"], "stopped");
    let list = json_of(clis.agent(), &["task", "list"]).await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), 3, "{list}");
    server.stop().await;
}

async fn errors_say_what_to_do_next(db: Db) {
    let server = TestServer::start(db).await;
    let clis = AgentAndWorker::new(&server);

    let mut no_key = clis.agent();
    no_key.env_remove("MEATSPACE_DEV_KEY");
    let ran = run(no_key, &["task", "create", "--description", "x"]).await;
    assert_eq!(ran.status.code(), Some(2), "a missing key is a usage error");
    assert!(ran.stderr.contains("MEATSPACE_DEV_KEY"), "{}", ran.stderr);

    let unknown = Uuid::new_v4().to_string();
    let ran = run(clis.agent(), &["task", "get", &unknown]).await;
    assert_eq!(
        ran.status.code(),
        Some(2),
        "an unknown local task is a bad argument"
    );
    assert!(ran.stderr.contains("no local record"), "{}", ran.stderr);
    assert!(ran.stderr.contains("meatspace task list"), "{}", ran.stderr);

    let (id, _) = create_task(clis.agent(), "Buy stamps", &["--publish"]).await;
    let ran = run(clis.agent(), &["task", "publish", &id]).await;
    assert_eq!(ran.status.code(), Some(1));
    assert!(ran.stderr.contains("409"), "{}", ran.stderr);
    assert!(ran.stderr.contains("meatspace task get"), "{}", ran.stderr);

    let ran = run(
        clis.agent(),
        &["task", "respond", &id, "1", "--action", "clarify"],
    )
    .await;
    assert_eq!(ran.status.code(), Some(1));
    assert!(ran.stderr.contains("--text"), "{}", ran.stderr);

    let port = meatspace_tests::process::free_port();
    let mut dead = clis.agent();
    dead.env("MEATSPACE_URL", format!("http://127.0.0.1:{port}"));
    let ran = run(dead, &["task", "get", &id]).await;
    assert_eq!(ran.status.code(), Some(5), "unreachable is exit 5");
    assert!(
        ran.stderr.contains("is the server running"),
        "{}",
        ran.stderr
    );

    let ran = run(clis.agent(), &["task", "extend", &id]).await;
    assert_eq!(ran.status.code(), Some(2), "a usage error: {}", ran.stderr);
    assert!(ran.stderr.contains("--add-seconds"), "{}", ran.stderr);

    // --help documents every command.
    let documented: [(&str, &[&str]); 2] = [
        (
            "task",
            &[
                "create", "publish", "get", "list", "watch", "respond", "review", "cancel",
                "extend", "photo",
            ],
        ),
        (
            "worker",
            &[
                "register", "tasks", "claim", "start", "message", "photo", "issue", "complete",
                "stop",
            ],
        ),
    ];
    for (command, verbs) in documented {
        let help = run(clis.agent(), &[command, "--help"]).await;
        for verb in verbs {
            assert!(
                help.stdout.contains(verb),
                "{command} --help lacks {verb}: {}",
                help.stdout
            );
        }
    }
    server.stop().await;
}

// ---- agent integrations: SSE, Idempotency-Key replays, POST /extend ----

meatspace_tests::api_tests!(integrations:
    watch_over_sse_resumes_after_sigkill,
    extend_moves_the_deadline,
);

async fn watch_over_sse_resumes_after_sigkill(db: Db) {
    watch_resumes_after_sigkill(db, "sse").await;
}

async fn extend_moves_the_deadline(db: Db) {
    let server = TestServer::start(db).await;
    let clis = AgentAndWorker::new(&server);
    let (id, created) =
        create_task(clis.agent(), "Queue for tickets", &["--lifetime", "600"]).await;
    let before: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(created["task"]["expires_at"].clone()).unwrap();
    let extended = json_of(
        clis.agent(),
        &["task", "extend", &id, "--add-seconds", "120"],
    )
    .await;
    assert_eq!(extended["events"][0]["type"], "task.extended", "{extended}");
    let after: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(extended["task"]["expires_at"].clone()).unwrap();
    assert_eq!(after - before, chrono::TimeDelta::seconds(120));
    let target = (after + chrono::TimeDelta::seconds(60)).to_rfc3339();
    let extended = json_of(
        clis.agent(),
        &["task", "extend", &id, "--expires-at", &target],
    )
    .await;
    assert_eq!(
        serde_json::from_value::<chrono::DateTime<chrono::Utc>>(
            extended["task"]["expires_at"].clone()
        )
        .unwrap(),
        after + chrono::TimeDelta::seconds(60)
    );
    // The local copy follows.
    let list = json_of(clis.agent(), &["task", "list"]).await;
    assert_eq!(
        list["tasks"][0]["expires_at"],
        extended["task"]["expires_at"]
    );
    server.stop().await;
}

/// An agent asks for a typed result with review; the worker submits one
/// with a photo (refused first for a field of the wrong type), the agent
/// sends it back, the worker submits again and the agent accepts: each
/// from the CLI, the result printed field by field.
async fn a_typed_result_is_reviewed_from_the_shell(db: Db) {
    let server = TestServer::start(db).await;
    let clis = AgentAndWorker::new(&server);
    let schema = clis.dir.path().join("gate.json");
    std::fs::write(
        &schema,
        json!({
            "type": "object",
            "properties": {
                "locked": { "type": "boolean", "title": "Was the gate locked?" },
                "photos": { "type": "array", "items": { "type": "string", "format": "photo" },
                            "minItems": 1, "maxItems": 1 }
            },
            "required": ["locked", "photos"]
        })
        .to_string(),
    )
    .unwrap();
    let schema = schema.to_str().unwrap();
    let (id, created) = create_task(
        clis.agent(),
        "Check the gate",
        &[
            "--publish",
            "--result-schema",
            schema,
            "--review",
            "--auto-accept",
            "600",
        ],
    )
    .await;
    assert_eq!(created["task"]["review"]["auto_accept_seconds"], 600);
    assert_eq!(
        created["task"]["result_schema"]["additionalProperties"],
        false
    );

    json_of(clis.worker(), &["worker", "register", "--name", "Lin"]).await;
    json_of(clis.worker(), &["worker", "claim", &id]).await;
    json_of(clis.worker(), &["worker", "start", &id]).await;
    let (_, photo_id) = clis
        .send_photo(&id, &clis.dir.path().join("gate.png"))
        .await;

    let wrong = run(
        clis.worker(),
        &[
            "worker",
            "complete",
            &id,
            "--result",
            r#"{"locked":"yes","photos":[]}"#,
        ],
    )
    .await;
    assert!(!wrong.status.success());
    assert!(wrong.stderr.contains("/locked"), "{}", wrong.stderr);
    let result = json!({ "locked": true, "photos": [photo_id] }).to_string();
    let submitted = json_of(
        clis.worker(),
        &["worker", "complete", &id, "--result", &result],
    )
    .await;
    assert_eq!(submitted["task"]["state"], "active");
    assert_eq!(submitted["events"][0]["type"], "task.submitted");

    // A verdict is required, and only one.
    let none = run(clis.agent(), &["task", "review", &id]).await;
    assert_eq!(none.status.code(), Some(2), "{}", none.stderr);
    let revised = json_of(
        clis.agent(),
        &["task", "review", &id, "--revise", "Closer, please"],
    )
    .await;
    assert_eq!(revised["events"][0]["type"], "task.revision_requested");
    json_of(
        clis.worker(),
        &["worker", "complete", &id, "--result", &result],
    )
    .await;
    let accepted = json_of(clis.agent(), &["task", "review", &id, "--accept"]).await;
    assert_eq!(accepted["task"]["state"], "completed");

    // People read the result as fields.
    let shown = run(clis.agent(), &["--output", "human", "task", "get", &id]).await;
    assert!(shown.status.success(), "{}", shown.stderr);
    assert!(
        shown.stdout.contains("review:      accepted"),
        "{}",
        shown.stdout
    );
    assert!(shown.stdout.contains("locked: true"), "{}", shown.stdout);
    server.stop().await;
}
