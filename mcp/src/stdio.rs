//! The stdio transport: the tool set over stdin/stdout with the HTTP
//! backend ([`crate::remote`]), as `meatspace mcp` and the
//! `meatspace-mcp-stdio` binary run it. Desktop and coding agents launch it
//! as a local tool; it keeps each task's token and cursor in `state_root`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rmcp::ServiceExt;

use crate::MeatspaceTools;
use crate::remote::RemoteApi;
use crate::state_dir::StateDir;

/// The credentials the stdio server calls the API with, from where it is
/// launched (never from the model).
#[derive(Clone, Default)]
pub struct Credentials {
    /// `MEATSPACE_DEV_KEY`: creates tasks when there is no API key.
    pub dev_key: Option<String>,
    /// `MEATSPACE_API_KEY` (`msk_…`): the agent the tools act as; creates
    /// tasks and reaches that agent's tasks without a stored token.
    pub api_key: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("dev_key", &self.dev_key.as_ref().map(|_| ".."))
            .field("api_key", &self.api_key.as_ref().map(|_| ".."))
            .finish()
    }
}

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
