//! The MCP endpoint (`/mcp`, Streamable HTTP, stateless): the tool set of
//! `meatspace-mcp` over this server's own state, through the same store
//! commands, credential checks and feed reads as the HTTP handlers.
//!
//! Over HTTP the server keeps no session, so credentials come with each
//! call: the development key from the MCP request's `x-meatspace-dev-key`
//! header (configured once in the MCP client, out of the model's context)
//! and a task's agent token as a tool argument, the only place for it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::FromRequestParts;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::IntoResponse;
use meatspace_api_types::{CreateTask, CreatedTask, EventPage, TaskChange};
use meatspace_domain::Task;
use meatspace_domain::{Command, Extension, IssueAction as CoreIssueAction, MAX_TEXT_CHARS};
use meatspace_mcp::api::{Action, AgentApi, Caller, IssueAction, TokenTaskRef};
use meatspace_mcp::types::{Problem, TaskSummary, status_note};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::AppState;
use crate::auth::{DEV_KEY_HEADER, authorize_agent};
use crate::http::error::ApiError;
use crate::routes::events::{EventsQuery, Reader, event_feed};
use crate::routes::{checked_optional_text, tasks};

/// Most tasks one list_my_tasks call reads.
const MAX_LISTED_TASKS: usize = 100;

/// The tool set's backend inside the server.
#[derive(Debug, Clone)]
pub struct InProcess {
    state: AppState,
}

/// Arguments of list_my_tasks over HTTP: the server keeps no list of an
/// agent's tasks, so the agent names the ones it holds tokens for.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenList {
    /// The tasks to read (at most 100), each with its agent token.
    pub tasks: Vec<TokenTaskRef>,
}

/// The problem document `error` is served as, for a tool error.
async fn problem(error: ApiError) -> Problem {
    let res = error.into_response();
    let status = res.status().as_u16();
    let bytes = axum::body::to_bytes(res.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Problem::local(status, "error", "the request failed"))
}

impl InProcess {
    pub fn new(state: AppState) -> Self {
        InProcess { state }
    }

    /// Checks the credential of `task` (its agent token, or the request's
    /// API key put in its place by `with_caller`) as the HTTP API does.
    async fn authorize(
        &self,
        task: &TokenTaskRef,
    ) -> Result<meatspace_domain::identity::ActedBy, ApiError> {
        let token = task.agent_token.as_deref().ok_or_else(|| {
            ApiError::Unauthorized(
                "pass the task's agent_token, or send an API key (Authorization: Bearer msk_…) \
                 with the MCP request"
                    .into(),
            )
        })?;
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| ApiError::Unauthorized("the agent token is not valid".into()))?;
        headers.insert(header::AUTHORIZATION, value);
        authorize_agent(&self.state, &headers, task.task_id).await
    }

    async fn create(&self, caller: &Caller, req: CreateTask) -> Result<CreatedTask, ApiError> {
        // The same extractor as POST /api/v1/tasks, over the MCP
        // request's headers.
        let mut request = axum::http::Request::builder();
        if let Some(key) = &caller.api_key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
        } else if let Some(key) = &caller.dev_key {
            request = request.header(DEV_KEY_HEADER, key);
        }
        let (mut parts, ()) = request
            .body(())
            .map_err(|_| ApiError::Unauthorized("the development key is not valid".into()))?
            .into_parts();
        let owner = crate::auth::Caller::from_request_parts(&mut parts, &self.state).await?;
        owner.require(meatspace_domain::identity::Scope::Tasks)?;
        tasks::create(&self.state, req, owner.principal).await
    }

    async fn get(&self, task: &TokenTaskRef) -> Result<Task, ApiError> {
        self.authorize(task).await?;
        self.state
            .store
            .task(task.task_id)
            .await?
            .ok_or_else(ApiError::task_not_found)
    }

    async fn apply(&self, task: &TokenTaskRef, action: Action) -> Result<TaskChange, ApiError> {
        let by = self.authorize(task).await?;
        let command = match action {
            Action::Publish => Command::Publish,
            Action::Cancel => Command::Cancel { reason: None },
            Action::RespondToIssue {
                issue_event_id,
                action,
                text,
            } => Command::RespondToIssue {
                issue_event_id,
                action: match action {
                    IssueAction::Clarify => CoreIssueAction::Clarify,
                    IssueAction::Acknowledge => CoreIssueAction::Acknowledge,
                    IssueAction::Cancel => CoreIssueAction::Cancel,
                },
                text: checked_optional_text("text", text.as_deref(), MAX_TEXT_CHARS)?,
            },
            Action::Review(answer) => Command::Review(crate::routes::results::verdict(answer)?),
            Action::Extend { add_seconds } => Command::Extend(Extension::By(
                chrono::TimeDelta::try_seconds(add_seconds)
                    .ok_or_else(|| ApiError::invalid("add_seconds is out of range".to_owned()))?,
            )),
        };
        let change = self.state.act_by(task.task_id, command, by).await?;
        Ok(change.0)
    }

    async fn page(
        &self,
        caller: &Caller,
        task: &TokenTaskRef,
        cursor: Option<i64>,
        wait: Duration,
    ) -> Result<EventPage, ApiError> {
        self.authorize(task).await?;
        // A wait takes one of the capped places of the task's token and of
        // the client's address, as a long poll of the API does; it is given
        // back when the page is answered.
        let _slot = if wait.is_zero() {
            None
        } else {
            let address = caller
                .address
                .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
            Some(self.state.rate_limit.streams().open(
                crate::auth::Principal::Agent(task.task_id),
                crate::http::rate_limit::address_key(address),
            )?)
        };
        let query = EventsQuery {
            after: cursor.unwrap_or(0),
            limit: None,
            wait: Some(u32::try_from(wait.as_secs()).unwrap_or(u32::MAX)),
        };
        event_feed(&self.state, task.task_id, &query, 0, Reader::Agent).await
    }
}

#[async_trait]
impl AgentApi for InProcess {
    type TaskRef = TokenTaskRef;
    type ListArgs = TokenList;
    const CREDENTIAL_NOTE: &'static str = "Credentials over HTTP: configure your MCP client to send your API key (Authorization: Bearer msk_…); then the task tools need only task_id and no token is shown to you. Without a key, the development key comes from the x-meatspace-dev-key header and each task tool takes the task's agent_token (from create_task) as an argument, because this server keeps no session. Pass it only to these tools.";
    const SHOWS_TOKEN: bool = true;

    async fn create_task(&self, caller: &Caller, req: CreateTask) -> Result<CreatedTask, Problem> {
        match self.create(caller, req).await {
            Ok(created) => Ok(created),
            Err(e) => Err(problem(e).await),
        }
    }

    fn task_ref(&self, created: &CreatedTask) -> TokenTaskRef {
        TokenTaskRef {
            task_id: created.task.id,
            agent_token: Some(created.agent_token.clone()),
        }
    }

    fn with_caller(&self, task: TokenTaskRef, caller: &Caller) -> TokenTaskRef {
        match (&task.agent_token, &caller.api_key) {
            (None, Some(key)) => TokenTaskRef {
                agent_token: Some(key.clone()),
                ..task
            },
            _ => task,
        }
    }

    // With an API key the token never enters the model's context: the
    // key acts on the task.
    fn shows_token(&self, caller: &Caller) -> bool {
        caller.api_key.is_none()
    }

    async fn get_task(&self, task: &TokenTaskRef) -> Result<Task, Problem> {
        match self.get(task).await {
            Ok(view) => Ok(view),
            Err(e) => Err(problem(e).await),
        }
    }

    async fn act(&self, task: &TokenTaskRef, action: Action) -> Result<TaskChange, Problem> {
        match self.apply(task, action).await {
            Ok(change) => Ok(change),
            Err(e) => Err(problem(e).await),
        }
    }

    async fn events(
        &self,
        caller: &Caller,
        task: &TokenTaskRef,
        cursor: Option<i64>,
        wait: Duration,
    ) -> Result<EventPage, Problem> {
        match self.page(caller, task, cursor, wait).await {
            Ok(page) => Ok(page),
            Err(e) => Err(problem(e).await),
        }
    }

    async fn list(&self, args: TokenList) -> Result<Vec<TaskSummary>, Problem> {
        if args.tasks.len() > MAX_LISTED_TASKS {
            return Err(problem(ApiError::invalid(format!(
                "list at most {MAX_LISTED_TASKS} tasks at a time"
            )))
            .await);
        }
        let mut summaries = Vec::with_capacity(args.tasks.len());
        for task in &args.tasks {
            summaries.push(match self.get(task).await {
                Ok(view) => TaskSummary {
                    task_id: view.id,
                    state: Some(view.state),
                    terminal: view.state.is_terminal(),
                    description: Some(view.description),
                    cursor: None,
                    problem: None,
                    status_note: status_note(view.state),
                },
                Err(e) => TaskSummary {
                    task_id: task.task_id,
                    state: None,
                    terminal: false,
                    description: None,
                    cursor: None,
                    problem: Some(problem(e).await),
                    status_note: "This task could not be read with the token given.".into(),
                },
            });
        }
        Ok(summaries)
    }

    fn supports_extension(&self) -> bool {
        true
    }
}

/// Middleware of `/mcp`: an HTTP-level refusal of the MCP transport (a
/// refused `Host`, a wrong `Accept`, a malformed message) becomes a
/// problem document carrying rmcp's own explanation, so it keeps its
/// meaning when the server's catch-all turns every error into a problem.
/// Hands the client's address to the MCP tools ([`meatspace_mcp::api::PeerAddress`]),
/// which see only the HTTP request's parts, so that their long waits are
/// capped per address as the API's are.
pub async fn with_peer_address(mut req: axum::extract::Request) -> axum::extract::Request {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|axum::extract::ConnectInfo(addr)| addr.ip());
    if let Some(ip) = peer {
        req.extensions_mut()
            .insert(meatspace_mcp::api::PeerAddress(ip));
    }
    req
}

pub async fn transport_errors_as_problems(
    res: axum::response::Response,
) -> axum::response::Response {
    let status = res.status();
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return res;
    }
    let bytes = axum::body::to_bytes(res.into_body(), 16 * 1024)
        .await
        .unwrap_or_default();
    // A JSON-RPC error names its message; anything else is rmcp's text.
    let detail = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let detail: String = detail.trim().chars().take(500).collect();
    let detail = if detail.is_empty() {
        "the MCP request was refused".to_owned()
    } else {
        detail
    };
    crate::http::error::problem(status, "mcp-transport", detail, None)
}

/// The `/mcp` service over `state`.
pub fn service(
    state: AppState,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    meatspace_mcp::MeatspaceTools<InProcess>,
    rmcp::transport::streamable_http_server::session::never::NeverSessionManager,
> {
    let hosts = state.mcp_allowed_hosts.clone();
    meatspace_mcp::streamable_http_service(
        Arc::new(InProcess::new(state)),
        &hosts,
        crate::MAX_JSON_BYTES,
    )
}
