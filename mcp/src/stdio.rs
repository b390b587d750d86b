//! The stdio transport: the tool set over stdin/stdout with the HTTP
//! backend ([`crate::remote`]), as `meatspace mcp` and the
//! `meatspace-mcp-stdio` binary run it. Desktop and coding agents launch it
//! as a local tool; it keeps each task's token and cursor in `state_root`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rmcp::ServiceExt;

use crate::MeatspaceTools;
pub use crate::remote::Credentials;
use crate::remote::RemoteApi;
use crate::state_dir::StateDir;

/// Serves the tools on stdin/stdout until the client closes the session.
/// stdout carries the protocol: log to stderr only.
pub async fn serve(
    api_url: &str,
    credentials: Credentials,
    state_root: &Path,
) -> anyhow::Result<()> {
    let state = StateDir::open(state_root)?;
    let api = RemoteApi::connect(api_url, credentials, state).await?;
    let service = MeatspaceTools::new(Arc::new(api))
        .serve(rmcp::transport::stdio())
        .await
        .context("start the MCP session")?;
    service.waiting().await.context("serve MCP")?;
    Ok(())
}
