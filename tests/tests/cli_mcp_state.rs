//! One local state directory for the CLI and the MCP stdio server: a task
//! created through `meatspace mcp` is followed to its end with `meatspace
//! task watch`, and a task created with `meatspace task create` is read,
//! published and waited on through `meatspace mcp`'s tools, both with only
//! the task id (the token is in the shared directory).
//!
//! The API server is the built binary on SQLite; the CLI and its `mcp`
//! subcommand are the built `meatspace` binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use meatspace_tests::cli::{call_tool as call, json_of, mcp_open_task, mcp_session, run};
use meatspace_tests::process::cli_bin;
use meatspace_tests::process::{Binary, DevApi, ServerProcess};
use rmcp::service::{RoleClient, RunningService};
use serde_json::json;
use uuid::Uuid;

const DEV_KEY: &str = "msd_shared_state_test_dev_key_0123456789";

/// The CLI with only the given state directory and server.
fn cli(base: &str, state: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(cli_bin());
    cmd.env_clear()
        .env("MEATSPACE_DEV_KEY", DEV_KEY)
        .args(["--url", base, "--state-dir"])
        .arg(state);
    cmd
}

/// `meatspace mcp` as an MCP session over its stdio.
async fn mcp(base: &str, state: &Path) -> RunningService<RoleClient, ()> {
    let mut cmd = cli(base, state);
    cmd.arg("mcp");
    mcp_session(cmd, Stdio::null()).await
}

/// The API server on SQLite in `dir`/data, its URL, and the state
/// directory `dir`/state for the CLI.
async fn server(dir: &Path) -> (ServerProcess, String, PathBuf) {
    let data = dir.join("data").display().to_string();
    let mut server = ServerProcess::start(
        Binary::ApiServer,
        &[
            ("MEATSPACE_DEV_KEY", DEV_KEY),
            ("MEATSPACE_DATA_DIR", &data),
        ],
    );
    server.ready().await;
    let base = server.base_url();
    (server, base, dir.join("state"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_through_mcp_is_watched_with_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, base, state) = server(dir.path()).await;

    let session = mcp(&base, &state).await;
    let id = mcp_open_task(&session, "Check the mailbox").await;
    session.cancel().await.expect("end the MCP session");

    let api = DevApi::new(&base, DEV_KEY);
    let wtoken = api.register_worker("Lin").await;
    for step in ["claim", "start"] {
        api.worker_post(&wtoken, id, step, json!({})).await;
    }
    api.worker_post(&wtoken, id, "complete", json!({ "text": "empty" }))
        .await;

    // Only the id: the token is the one `meatspace mcp` stored.
    let id = id.to_string();
    let out = run(
        cli(&base, &state),
        &["--output", "json", "task", "watch", &id],
    )
    .await;
    assert!(
        out.status.success(),
        "task watch failed: {}\n{}",
        out.stderr,
        out.stdout
    );
    assert!(
        out.stdout.contains("task.completed"),
        "the watch follows the task to its end: {}",
        out.stdout
    );
    server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_with_the_cli_is_driven_through_mcp() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, base, state) = server(dir.path()).await;

    let created = json_of(
        cli(&base, &state),
        &["task", "create", "-d", "Read the gas meter"],
    )
    .await;
    let id = created["task"]["id"]
        .as_str()
        .or_else(|| created["id"].as_str())
        .unwrap_or_else(|| panic!("a task id in {created}"))
        .to_owned();

    let session = mcp(&base, &state).await;
    let listed = call(&session, "list_my_tasks", json!({})).await;
    assert!(
        listed.to_string().contains(&id),
        "list_my_tasks shows the CLI's task: {listed}"
    );
    let task = call(&session, "get_task", json!({ "task_id": id })).await;
    assert_eq!(task["task"]["state"], "draft", "{task}");
    call(&session, "publish_task", json!({ "task_id": id })).await;
    let api = DevApi::new(&base, DEV_KEY);
    let wtoken = api.register_worker("Lin").await;
    let id: Uuid = id.parse().unwrap();
    api.worker_post(&wtoken, id, "claim", json!({})).await;
    let events = call(
        &session,
        "wait_for_events",
        json!({ "task_id": id, "cursor": 0 }),
    )
    .await;
    assert!(
        events.to_string().contains("task.assigned"),
        "the tools read the CLI's task feed: {events}"
    );
    session.cancel().await.expect("end the MCP session");
    server.kill().await;
}
