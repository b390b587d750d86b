//! `meatspace-mcp-stdio`: the meatspace MCP tools over stdio, for agents
//! that launch local tools (desktop and coding agents). It talks to a
//! meatspace API server over HTTP and keeps each task's agent token and
//! cursor in a private state directory. `meatspace mcp` runs the same
//! server; all the logic lives in the library ([`meatspace_mcp::stdio`]).

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use meatspace_mcp::state_dir::StateDir;

/// Serve meatspace's agent tools over MCP on stdin/stdout.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Base URL of the meatspace API server.
    #[arg(
        long,
        env = "MEATSPACE_API_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    api_url: String,
    /// Development key that creates tasks (when there is no API key).
    #[arg(long, env = "MEATSPACE_DEV_KEY", hide_env_values = true)]
    dev_key: Option<String>,
    /// API key (`msk_…`) of the agent the tools act as: creates tasks, and
    /// reaches that agent's tasks that have no local record.
    #[arg(long, env = "MEATSPACE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Where task tokens and cursors are kept (0700; files 0600). Default:
    /// $XDG_STATE_HOME/meatspace, else ~/.local/state/meatspace.
    #[arg(long, env = "MEATSPACE_STATE_DIR")]
    state_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // stdout carries the protocol: logs go to stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let root = args
        .state_dir
        .or_else(StateDir::default_root)
        .context("no state directory: pass --state-dir or set HOME")?;
    let credentials = meatspace_mcp::stdio::Credentials {
        dev_key: args.dev_key,
        api_key: args.api_key,
    };
    meatspace_mcp::stdio::serve(&args.api_url, credentials, &root).await
}
