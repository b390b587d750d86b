//! The README's walk ("A task from the shell") as a user follows it: the
//! shell block after the `readme-walk` marker is taken from README.md
//! itself (never a copy) and run with bash, in the directory of a real
//! server started as the first README command starts it (embedded SQLite,
//! no configuration). The agent and the worker both act in it, and the
//! test checks what they print: each state in turn, the located task in
//! the worker's nearby list, the start's position recorded on site, the
//! worker's message marked untrusted, the long poll answering with the
//! worker's typed submission, and the agent's accept completing the task
//! with that result.
//!
//! Needs `bash`, `curl` and `jq` (scripts/test runs under .ci/run, which
//! installs them); a missing one fails the test.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use meatspace_tests::process::{Binary, ServerProcess, free_port};
use serde_json::Value;

/// The marker line that precedes the walk's code block in README.md.
const MARKER: &str = "<!-- readme-walk";

/// The body of the first fenced block after the marker.
fn walk_block(readme: &str) -> String {
    let after = &readme[readme
        .find(MARKER)
        .expect("README.md has the readme-walk marker")..];
    let fence = after
        .find("\n```")
        .expect("a code block follows the marker")
        + 1;
    let body_start = fence + after[fence..].find('\n').expect("fence line") + 1;
    let body_len = after[body_start..]
        .find("\n```")
        .expect("the walk's block is closed");
    after[body_start..body_start + body_len + 1].to_owned()
}

#[test]
fn the_walk_is_found_between_its_fences() {
    let text = "x\n<!-- readme-walk -->\n```sh\necho 1\necho 2\n```\n```sh\nno\n```\n";
    assert_eq!(walk_block(text), "echo 1\necho 2\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walk_runs_as_printed() {
    let readme_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("read README.md");
    let walk = walk_block(&readme);
    for tool in ["bash", "curl", "jq"] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .expect("run sh");
        assert!(
            found.status.success(),
            "the README walk needs {tool}, which is not installed (.ci/run installs it)"
        );
    }

    // The first README command: no configuration at all.
    let dir = tempfile::tempdir().expect("temporary directory");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut server = ServerProcess::start_in(Binary::ApiServer, dir.path(), "server", &addr, &[]);
    server.ready().await;

    let run = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &walk])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MEATSPACE_URL", server.base_url())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the walk finishes (its long poll must answer at once)")
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the README walk failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- server\n{}",
        out.status,
        server.stderr()
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // capabilities, then each state the agent and the worker see in turn.
    let states: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            matches!(
                *l,
                "meatspace" | "open" | "assigned" | "active" | "submitted" | "completed"
            )
        })
        .collect();
    assert_eq!(
        states,
        ["meatspace", "open", "assigned", "active", "submitted"],
        "{stdout}"
    );
    let json: Vec<Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect();
    let message = json
        .iter()
        .find(|v| v["type"] == "worker.message" && v.get("data").is_some())
        .unwrap_or_else(|| panic!("the agent's read of the feed shows the message: {stdout}"));
    assert_eq!(message["untrusted"], true, "{message}");
    assert_eq!(message["data"]["text"], "On my way", "{message}");
    // The worker found the task near where they stood, with its distance
    // and address; its start recorded the position, on site.
    let listed = json
        .iter()
        .find(|v| v.get("distance_m").is_some())
        .unwrap_or_else(|| panic!("the nearby list shows the task: {stdout}"));
    let distance = listed["distance_m"].as_f64().expect("a distance");
    assert!((200.0..300.0).contains(&distance), "{listed}");
    assert_eq!(listed["address"], "Rathausstrasse 15, Berlin", "{listed}");
    let started = json
        .iter()
        .find(|v| v["type"] == "task.started" && v.get("data").is_some())
        .unwrap_or_else(|| panic!("the agent's read of the feed shows the start: {stdout}"));
    assert_eq!(
        started["untrusted"], true,
        "a position is worker-sent: {started}"
    );
    assert_eq!(started["data"]["position"]["off_site"], false, "{started}");
    let result = serde_json::json!({ "notice_up": true, "notices": 3 });
    let poll = &json[json.len() - 2];
    assert_eq!(poll["task_state"], "active", "a submission waits: {stdout}");
    assert_eq!(poll["events"][0]["type"], "task.submitted", "{stdout}");
    assert_eq!(poll["events"][0]["data"]["note"], "Photo taken", "{stdout}");
    assert_eq!(poll["events"][0]["data"]["result"], result, "{stdout}");
    assert_eq!(
        poll["events"].as_array().map(Vec::len),
        Some(1),
        "the poll from next_cursor returns only what came after it: {stdout}"
    );
    let accepted = json.last().expect("the agent's accept");
    assert_eq!(
        *accepted,
        serde_json::json!({ "state": "completed", "result": result }),
        "{stdout}"
    );

    // The key the walk read from .meatspace/dev.key is the printed one.
    let printed = server
        .printed_dev_key()
        .expect("the server printed a dev key");
    let kept = std::fs::read_to_string(dir.path().join(".meatspace/dev.key")).expect("dev.key");
    assert_eq!(kept.trim(), printed);
    server.kill().await;
}
