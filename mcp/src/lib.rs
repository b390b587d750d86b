//! meatspace as Model Context Protocol tools, on the official Rust SDK
//! (`rmcp`): one tool set ([`tools::MeatspaceTools`]) over a small backend
//! trait ([`api::AgentApi`]), with two transports:
//!
//! - Streamable HTTP, mounted by the API server at `/mcp` over its own
//!   store ([`streamable_http_service`] builds the stateless service);
//! - stdio, for agents that launch local tools, over the HTTP API through
//!   `meatspace-client`
//!   ([`remote::RemoteApi`], which keeps tokens and cursors on disk).

pub mod api;
pub mod remote;
pub mod state_dir;
pub mod stdio;
pub mod tools;
pub mod types;

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

pub use api::AgentApi;
pub use tools::MeatspaceTools;

/// Path the API server mounts the Streamable HTTP endpoint at.
pub const HTTP_PATH: &str = "/mcp";

/// Which `Host` headers the Streamable HTTP endpoint accepts. The check
/// guards a server on a developer's machine against DNS rebinding; behind
/// an Ingress the public host names must be listed (or the check turned
/// off when the Ingress already pins the host).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AllowedHosts {
    /// localhost, 127.0.0.1 and ::1 (any port): rmcp's default.
    #[default]
    Loopback,
    /// Exactly these host names or `host:port` authorities.
    List(Vec<String>),
    /// Any host.
    Any,
}

impl AllowedHosts {
    /// Parses a comma-separated list; `*` means any host, empty means
    /// loopback only.
    pub fn parse(value: &str) -> Self {
        let hosts: Vec<String> = value
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .collect();
        if hosts.iter().any(|h| h == "*") {
            AllowedHosts::Any
        } else if hosts.is_empty() {
            AllowedHosts::Loopback
        } else {
            AllowedHosts::List(hosts)
        }
    }
}

/// The Streamable HTTP service for `api`: stateless (every POST is served
/// on its own, so any replica can answer any request and nothing is kept
/// between calls), answering plain JSON rather than an event stream, with
/// bodies limited to `max_body_bytes`.
pub fn streamable_http_service<A: AgentApi>(
    api: Arc<A>,
    allowed_hosts: &AllowedHosts,
    max_body_bytes: usize,
) -> StreamableHttpService<MeatspaceTools<A>, NeverSessionManager> {
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(max_body_bytes);
    config = match allowed_hosts {
        AllowedHosts::Loopback => config,
        AllowedHosts::List(hosts) => config.with_allowed_hosts(hosts.clone()),
        AllowedHosts::Any => config.disable_allowed_hosts(),
    };
    let tools = MeatspaceTools::new(api);
    StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_hosts_parse() {
        assert_eq!(AllowedHosts::parse(""), AllowedHosts::Loopback);
        assert_eq!(AllowedHosts::parse("*"), AllowedHosts::Any);
        assert_eq!(
            AllowedHosts::parse("a.example, b.example:8443"),
            AllowedHosts::List(vec!["a.example".into(), "b.example:8443".into()])
        );
    }
}
