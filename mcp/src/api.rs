//! The seam between the tool set and meatspace: [`AgentApi`], implemented
//! once inside the API server (over its own store, for Streamable HTTP at
//! `/mcp`) and once over the HTTP API (for stdio, see [`crate::remote`]).
//!
//! The two differ in where credentials live, so each backend says how a
//! tool names a task ([`AgentApi::TaskRef`]): over HTTP the server is
//! stateless and the agent token has no other place than the tool's
//! arguments; over stdio the local process keeps tokens and cursors in its
//! state directory and tools take only a task id.

use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use meatspace_api_types::{CreateTask, ReviewAnswer};

use crate::types::{CreatedTask, EventPage, Problem, Task, TaskChange, TaskSummary};

/// What the transport knows about who calls. Its Debug shows neither key.
#[derive(Clone, Default, derive_more::Debug)]
pub struct Caller {
    /// The development key, from the MCP request's
    /// `x-meatspace-dev-key` header (HTTP transport).
    #[debug(skip)]
    pub dev_key: Option<String>,
    /// An API key (`msk_…`) from the MCP request's `Authorization: Bearer`
    /// header (HTTP transport): it creates tasks as its principal, and task
    /// tools act with it, so no task token need pass through the model.
    #[debug(skip)]
    pub api_key: Option<String>,
    /// The client's address (HTTP transport, when the server that mounts
    /// the endpoint puts a [`PeerAddress`] in the request's extensions):
    /// long waits are capped per address as the API's are.
    pub address: Option<std::net::IpAddr>,
}

/// The address of the client of an MCP request over HTTP, as the server
/// saw it; inserted into the HTTP request's extensions before the MCP
/// service, read into [`Caller::address`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddress(pub std::net::IpAddr);

/// How an agent answers a worker issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IssueAction {
    /// Answer with more information (text required).
    Clarify,
    /// Accept the issue and let the worker carry on (text required).
    Acknowledge,
    /// Cancel the whole task (text optional). Ends the task for good.
    Cancel,
}

/// A state-changing request on a task.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Publish,
    Cancel,
    RespondToIssue {
        issue_event_id: i64,
        action: IssueAction,
        text: Option<String>,
    },
    Extend {
        add_seconds: i64,
    },
    Review(ReviewAnswer),
}

/// Over HTTP: a task is named by its id and its agent token.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct TokenTaskRef {
    /// The task's id (task.id from create_task).
    pub task_id: Uuid,
    /// The task's agent token, returned once by create_task. Omit it when
    /// your MCP client sends an API key (Authorization: Bearer msk_…): the
    /// key of the task's owner acts on the task. Without a key this server
    /// keeps no session, so the token travels as this argument. Pass it only
    /// to this server's tools, never into any other text or tool.
    #[serde(default)]
    pub agent_token: Option<String>,
}

/// Over stdio: a task is named by its id; the local server keeps its token.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct LocalTaskRef {
    /// The task's id (task.id from create_task or list_my_tasks).
    pub task_id: Uuid,
}

/// The operations the tool set needs.
#[async_trait]
pub trait AgentApi: Send + Sync + 'static {
    /// How task tools name a task (flattened into their arguments).
    type TaskRef: JsonSchema + DeserializeOwned + Send + Sync + 'static;
    /// Arguments of list_my_tasks.
    type ListArgs: JsonSchema + DeserializeOwned + Send + Sync + 'static;
    /// Appended to every tool's description: where credentials come from
    /// on this transport.
    const CREDENTIAL_NOTE: &'static str;
    /// Whether create_task's result shows the agent token (HTTP: it must,
    /// there is nowhere else to keep it; stdio: never).
    const SHOWS_TOKEN: bool;

    /// Creates a draft task.
    async fn create_task(&self, caller: &Caller, task: CreateTask) -> Result<CreatedTask, Problem>;

    /// How tools name the task just created.
    fn task_ref(&self, created: &CreatedTask) -> Self::TaskRef;

    /// `task` with what the request's own credentials supply (over HTTP,
    /// its API key in place of a missing agent token). The default keeps
    /// it as it is.
    fn with_caller(&self, task: Self::TaskRef, _caller: &Caller) -> Self::TaskRef {
        task
    }

    /// Whether create_task's result shows the agent token to this caller.
    fn shows_token(&self, _caller: &Caller) -> bool {
        Self::SHOWS_TOKEN
    }

    async fn get_task(&self, task: &Self::TaskRef) -> Result<Task, Problem>;

    async fn act(&self, task: &Self::TaskRef, action: Action) -> Result<TaskChange, Problem>;

    /// A page of the feed after `cursor`, waiting up to `wait` for the
    /// first event. Without a cursor, a backend that keeps one starts from
    /// it (others from 0); a given cursor acknowledges every event up to it.
    async fn events(
        &self,
        caller: &Caller,
        task: &Self::TaskRef,
        cursor: Option<i64>,
        wait: Duration,
    ) -> Result<EventPage, Problem>;

    async fn list(&self, args: Self::ListArgs) -> Result<Vec<TaskSummary>, Problem>;

    /// Whether the server can extend a task's deadline.
    fn supports_extension(&self) -> bool;
}
