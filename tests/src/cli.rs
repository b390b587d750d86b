//! Running the `meatspace` CLI binary as a user would: one command, its
//! exit status and output, and the JSON it prints with `--output json`.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{Peer, ServiceExt};
use serde_json::Value;
use tokio::process::Command;

pub use crate::process::cli_bin;
use crate::server::TestServer;

/// The `meatspace` CLI aimed at `base_url`, keeping its state in `state`,
/// with nothing else of the environment but PATH; stdin closed, killed
/// when dropped.
pub fn cli_at(base_url: &str, state: &Path) -> Command {
    let mut cmd = Command::new(cli_bin());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MEATSPACE_URL", base_url)
        .env("MEATSPACE_STATE_DIR", state)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// [`cli_at`] the test server `server` with its dev key.
pub fn dev_cli(server: &TestServer, state: &Path) -> Command {
    let mut cmd = cli_at(&server.base_url, state);
    cmd.env("MEATSPACE_DEV_KEY", &server.dev_key);
    cmd
}

/// What a finished command printed and how it exited.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// The exit code (`None` when a signal ended it).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Runs `cmd` with `args` to its end (within two minutes).
pub async fn run(mut cmd: Command, args: &[&str]) -> Ran {
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.args(args).output())
        .await
        .expect("the command finishes")
        .expect("run the CLI");
    Ran {
        status: out.status,
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    }
}

/// Runs `meatspace --output json ARGS`, which must succeed and print one
/// JSON document.
pub async fn json_of(cmd: Command, args: &[&str]) -> Value {
    let ran = run(cmd, &[&["--output", "json"], args].concat()).await;
    assert!(
        ran.status.success(),
        "meatspace {args:?} failed ({:?}): {}\n{}",
        ran.code(),
        ran.stderr,
        ran.stdout
    );
    serde_json::from_str(ran.stdout.trim())
        .unwrap_or_else(|e| panic!("meatspace {args:?} printed no JSON ({e}): {}", ran.stdout))
}

/// Runs `meatspace --output json ARGS`, which must fail with exit `code`;
/// the error document it printed on stderr.
pub async fn refused(cmd: Command, args: &[&str], code: i32) -> Value {
    let ran = run(cmd, &[&["--output", "json"], args].concat()).await;
    assert_eq!(
        ran.code(),
        Some(code),
        "meatspace {args:?}: {}\n{}",
        ran.stderr,
        ran.stdout
    );
    serde_json::from_str(ran.stderr.trim())
        .unwrap_or_else(|e| panic!("meatspace {args:?}: no JSON error ({e}): {}", ran.stderr))
}

/// An MCP client session over the stdio of `cmd` (`meatspace … mcp`),
/// which is killed with the session; its stderr goes to `stderr`.
pub async fn mcp_session(
    mut cmd: Command,
    stderr: impl Into<Stdio>,
) -> RunningService<RoleClient, ()> {
    cmd.kill_on_drop(true);
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(stderr)
        .spawn()
        .expect("start meatspace mcp");
    ().serve(transport).await.expect("MCP session over stdio")
}

/// Calls the tool `name` with `args` (a JSON object): what it returned,
/// a tool error included.
pub async fn call_tool_result(
    client: &Peer<RoleClient>,
    name: &str,
    args: Value,
) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("{name}: the arguments are a JSON object, not {args}")
    };
    client
        .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Calls the tool `name` with `args` (a JSON object), which must succeed:
/// its structured result.
pub async fn call_tool(client: &Peer<RoleClient>, name: &str, args: Value) -> Value {
    let result = call_tool_result(client, name, args).await;
    assert_ne!(result.is_error, Some(true), "{name}: {result:?}");
    result.structured_content.expect("structured result")
}

/// Creates and publishes a task described as `description` through the
/// MCP tool `create_task`: its id.
pub async fn mcp_open_task(client: &Peer<RoleClient>, description: &str) -> uuid::Uuid {
    let created = call_tool(
        client,
        "create_task",
        serde_json::json!({ "description": description, "publish": true }),
    )
    .await;
    created["task"]["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a task id in {created}"))
}
