//! The backend of the stdio transport: the meatspace HTTP API, called
//! through `meatspace-client` (its typed handles, retries and error enum),
//! with each
//! task's agent token, cursor and last known state kept in a
//! [`StateDir`] (the CLI's state directory, so either tool can follow a
//! task the other created), so tools name tasks by id only and no result
//! carries a token.
//!
//! With an API key (`MEATSPACE_API_KEY`), tasks are created as the key's
//! principal, and a task of that principal the state directory has no
//! record of (created elsewhere, or before the local state was lost) is
//! reached with the key: the first tool call on it keeps a record without a
//! token (cursor and state only), and list_my_tasks lists the principal's
//! tasks from the server as well as the local ones.
//!
//! The cursor obligation: wait_for_events returns events without moving
//! the stored cursor; a later call that passes `cursor` acknowledges the
//! events up to it, and only then is it stored. A client that crashes after
//! receiving events therefore reads them again (safe) rather than missing
//! them (not safe).

use std::time::Duration;

use async_trait::async_trait;
use meatspace_client::types::Extend;
use meatspace_client::{Client, RetryPolicy, TaskHandle};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::api::{Action, AgentApi, Caller, IssueAction, LocalTaskRef};
use crate::state_dir::{StateDir, TaskRecord};
use crate::types::{
    CreatedTask, EventPage, Problem, Task, TaskChange, TaskState, TaskSummary, status_note,
};

/// The credentials the stdio server calls the API with, from where it is
/// launched (never from the model). Its Debug shows neither key.
#[derive(Clone, Default, derive_more::Debug)]
#[debug("Credentials {{ .. }}")]
pub struct Credentials {
    /// `MEATSPACE_DEV_KEY`: creates tasks when there is no API key.
    pub dev_key: Option<String>,
    /// `MEATSPACE_API_KEY` (`msk_…`): the agent the tools act as; creates
    /// tasks and reaches that agent's tasks without a stored token.
    pub api_key: Option<String>,
}

/// Path of the extension route; its presence in the server's OpenAPI
/// document turns on extend_task.
const EXTEND_PATH: &str = "/api/v1/tasks/{task_id}/extend";

/// Shortest time wait_for_events keeps retrying an unreachable or
/// unavailable API before it reports the failure.
const RETRY_WINDOW: Duration = Duration::from_secs(30);

/// Time limit of one ordinary request (a long poll adds its wait).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// list_my_tasks over stdio takes no argument: the tasks are the ones in
/// the state directory.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// The HTTP API as an [`AgentApi`].
#[derive(Debug)]
pub struct RemoteApi {
    /// Every call but the long poll, with the client's retries.
    client: Client,
    /// Whether a development key or an API key was given (creating a task
    /// needs one).
    has_principal: bool,
    /// Whether an API key was given: the tasks of its principal are
    /// reachable without a record.
    has_api_key: bool,
    /// The long poll: one attempt per call, because wait_for_events waits
    /// out an unavailable API itself, within the call's own wait.
    poll: Client,
    state: StateDir,
    extension: bool,
    /// Serialises read-modify-write of task records within this process.
    records: Mutex<()>,
}

impl RemoteApi {
    /// A backend for the API at `base_url` (e.g. `http://127.0.0.1:8080`),
    /// creating tasks with the API key, else the development key. Reads the
    /// server's OpenAPI document once to learn whether deadline extension
    /// exists.
    pub async fn connect(
        base_url: &str,
        credentials: Credentials,
        state: StateDir,
    ) -> anyhow::Result<Self> {
        let mut builder = Client::builder(base_url).timeout(REQUEST_TIMEOUT);
        let has_api_key = credentials.api_key.is_some();
        let has_principal = has_api_key || credentials.dev_key.is_some();
        if let Some(key) = credentials.dev_key {
            builder = builder.dev_key(key);
        }
        if let Some(key) = credentials.api_key {
            builder = builder.api_key(key);
        }
        let client = builder.clone().build()?;
        let poll = builder
            .retry(RetryPolicy {
                max_attempts: 1,
                ..RetryPolicy::default()
            })
            .build()?;
        let mut api = RemoteApi {
            client,
            has_principal,
            has_api_key,
            poll,
            state,
            extension: false,
            records: Mutex::new(()),
        };
        api.extension = match api.client.openapi().await {
            Ok(doc) => doc["paths"].get(EXTEND_PATH).is_some(),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the OpenAPI document; extend_task is off");
                false
            }
        };
        Ok(api)
    }

    /// The record of `task_id`; with an API key, a task the directory does
    /// not know is asked for with the key (404 when another principal owns
    /// it) and kept as a record without a token.
    async fn record(&self, task_id: uuid::Uuid) -> Result<TaskRecord, Problem> {
        if let Some(record) = self.state.load(task_id).map_err(state_problem)? {
            return Ok(record);
        }
        if !self.has_api_key {
            return Err(Problem::local(
                404,
                "unknown-task",
                format!(
                    "task {task_id} is not in this server's state directory (only tasks created through it or `meatspace task create` can be used; with MEATSPACE_API_KEY set where this MCP server is launched, every task of the key's owner can)"
                ),
            ));
        }
        let task = self
            .client
            .task_owned(task_id)
            .get()
            .await
            .map_err(problem)?;
        let task = serde_json::to_value(&task).map_err(state_problem)?;
        let _guard = self.records.lock().await;
        self.state
            .adopt(self.client.base_url(), &task)
            .map_err(state_problem)?;
        self.state
            .load(task_id)
            .map_err(state_problem)?
            .ok_or_else(|| state_problem("the adopted task's record is missing"))
    }

    /// The client's handle of a task: with its token from the state
    /// directory, else with the owner's API key.
    async fn handle(
        &self,
        client: &Client,
        task_id: uuid::Uuid,
    ) -> Result<(TaskRecord, TaskHandle), Problem> {
        let record = self.record(task_id).await?;
        let handle = match &record.agent_token {
            Some(token) => client.task(task_id, token.clone()),
            None => client.task_owned(task_id),
        };
        Ok((record, handle))
    }

    /// Stores the task as the API just returned it.
    async fn note_task(&self, task: &meatspace_client::Task) -> Result<(), Problem> {
        let task = serde_json::to_value(task).map_err(state_problem)?;
        let _guard = self.records.lock().await;
        self.state
            .note_task(self.client.base_url(), &task)
            .map_err(state_problem)
    }

    async fn note_state(&self, task_id: uuid::Uuid, state: TaskState) -> Result<(), Problem> {
        let _guard = self.records.lock().await;
        self.state.note_state(task_id, state).map_err(state_problem)
    }
}

fn state_problem(e: impl std::fmt::Display) -> Problem {
    Problem::local(
        500,
        "state-directory",
        format!("the local state directory failed: {e}"),
    )
}

/// The client's error as the problem a tool reports: the API's own problem
/// document when it sent one, else a local one that says what failed.
fn problem(e: meatspace_client::Error) -> Problem {
    use meatspace_client::Error;
    match e {
        Error::Problem(p) => Problem {
            status: p.status,
            kind: p.kind,
            title: p.title,
            detail: p.detail,
            task_state: p.task_state,
        },
        Error::Http { status, .. } => Problem::local(
            status,
            "http-error",
            format!(
                "the API answered {}",
                reqwest::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("an error")
            ),
        ),
        Error::Transport(e) => Problem::local(
            503,
            "api-unreachable",
            format!(
                "the meatspace API could not be reached: {}",
                e.without_url()
            ),
        ),
        Error::Decode(e) => Problem::local(
            502,
            "bad-answer",
            format!("the API's answer was not understood: {e}"),
        ),
        Error::Invalid(e) => Problem::local(400, "invalid-request", e),
        Error::State(e) => state_problem(e),
    }
}

#[async_trait]
impl AgentApi for RemoteApi {
    type TaskRef = LocalTaskRef;
    type ListArgs = NoArgs;
    const CREDENTIAL_NOTE: &'static str = "Credentials never pass through you: this local server keeps each task's agent token (and its cursor) in its state directory, or uses its API key for your own tasks, so tools take only task_id.";
    const SHOWS_TOKEN: bool = false;

    async fn create_task(
        &self,
        _caller: &Caller,
        req: meatspace_client::types::CreateTask,
    ) -> Result<CreatedTask, Problem> {
        if !self.has_principal {
            return Err(Problem::local(
                401,
                "no-credential",
                "creating a task needs an API key or the development key: set MEATSPACE_API_KEY (an operator creates one with `meatspace key create`) or MEATSPACE_DEV_KEY where this MCP server is launched",
            ));
        }
        let (created, _) = self.client.create_task(&req).await.map_err(problem)?;
        let answer = serde_json::to_value(&created).map_err(state_problem)?;
        // Kept before the result is returned: the token is shown only once.
        let _guard = self.records.lock().await;
        self.state
            .save_created(self.client.base_url(), &answer)
            .map_err(state_problem)?;
        Ok(created)
    }

    fn task_ref(&self, created: &CreatedTask) -> LocalTaskRef {
        LocalTaskRef {
            task_id: created.task.id,
        }
    }

    async fn get_task(&self, task: &LocalTaskRef) -> Result<Task, Problem> {
        let (_, handle) = self.handle(&self.client, task.task_id).await?;
        let answer = handle.get().await.map_err(problem)?;
        self.note_task(&answer).await?;
        Ok(answer)
    }

    async fn act(&self, task: &LocalTaskRef, action: Action) -> Result<TaskChange, Problem> {
        let (_, handle) = self.handle(&self.client, task.task_id).await?;
        let answer = match action {
            Action::Publish => handle.publish().await,
            Action::Cancel => handle.cancel().await,
            Action::RespondToIssue {
                issue_event_id,
                action,
                text,
            } => {
                let action = match action {
                    IssueAction::Clarify => meatspace_client::IssueAction::Clarify,
                    IssueAction::Acknowledge => meatspace_client::IssueAction::Acknowledge,
                    IssueAction::Cancel => meatspace_client::IssueAction::Cancel,
                };
                handle.respond(issue_event_id, action, text).await
            }
            Action::Extend { add_seconds } => handle.extend(Extend::add_seconds(add_seconds)).await,
            Action::Review(answer) => handle.review(answer).await,
        }
        .map_err(problem)?;
        self.note_task(&answer.task).await?;
        Ok(answer)
    }

    async fn events(
        &self,
        _caller: &Caller,
        task: &LocalTaskRef,
        cursor: Option<i64>,
        wait: Duration,
    ) -> Result<EventPage, Problem> {
        let id = task.task_id;
        let (record, handle) = self.handle(&self.poll, id).await?;
        // A given cursor acknowledges the events up to it: store it now
        // (never moving backwards), after they were returned by an earlier
        // call.
        if let Some(ack) = cursor.filter(|c| *c > record.cursor) {
            let _guard = self.records.lock().await;
            self.state.acknowledge(id, ack).map_err(state_problem)?;
        }
        let after = cursor.unwrap_or(record.cursor);
        // A restarting or overloaded server is waited out, within the call's
        // wait (and at least RETRY_WINDOW), so an agent does not read a
        // server restart as the end of its task.
        let started = tokio::time::Instant::now();
        let wait_until = started + wait;
        let give_up = started + wait.max(RETRY_WINDOW);
        let mut failures = 0u32;
        let page = loop {
            let left = wait_until.saturating_duration_since(tokio::time::Instant::now());
            let seconds = u32::try_from(left.as_secs()).unwrap_or(u32::MAX);
            match handle.events(after, None, seconds).await.map_err(problem) {
                Ok(page) => break page,
                Err(p) if matches!(p.status, 429 | 502 | 503 | 504) => {
                    let now = tokio::time::Instant::now();
                    if now >= give_up {
                        let mut p = p;
                        p.detail.push_str(
                            "; the task is unaffected: call wait_for_events again with the same \
                             cursor",
                        );
                        return Err(p);
                    }
                    failures += 1;
                    let delay = Duration::from_millis(250)
                        .saturating_mul(2u32.saturating_pow(failures.min(5)))
                        .min(Duration::from_secs(5))
                        .min(give_up - now);
                    // stderr, which the stdio transport leaves free (stdout
                    // is the protocol): MCP hosts show it in their logs.
                    eprintln!(
                        "meatspace mcp: wait_for_events: the API is unavailable ({}: {}); \
                         retrying in {:.1} s",
                        p.status,
                        p.detail,
                        delay.as_secs_f64()
                    );
                    tokio::time::sleep(delay).await;
                }
                Err(p) => return Err(p),
            }
        };
        self.note_state(id, page.task_state).await?;
        Ok(page)
    }

    async fn list(&self, _args: NoArgs) -> Result<Vec<TaskSummary>, Problem> {
        let records = self.state.list().map_err(state_problem)?;
        let mut tasks = Vec::with_capacity(records.len());
        // With an API key, the server knows the principal's tasks, also
        // those without a local record: newest first, those not yet ended
        // (the ones still to monitor), up to one page.
        if self.has_api_key {
            let page = self.client.tasks(None, None).await.map_err(problem)?;
            for task in page.tasks {
                if records.iter().any(|r| r.task_id == task.id) {
                    continue;
                }
                let state = task.state;
                tasks.push(TaskSummary {
                    task_id: task.id,
                    state: Some(state),
                    terminal: state.is_terminal(),
                    description: Some(task.description),
                    cursor: None,
                    problem: None,
                    status_note: status_note(state),
                });
            }
        }
        for record in records {
            let reference = LocalTaskRef {
                task_id: record.task_id,
            };
            // Terminal tasks never change: no need to ask the API.
            let fresh = if record.last_known_state.is_terminal() {
                Ok(None)
            } else {
                self.get_task(&reference).await.map(Some)
            };
            let (state, problem) = match fresh {
                Ok(Some(task)) => (task.state, None),
                Ok(None) => (record.last_known_state, None),
                Err(p) => (record.last_known_state, Some(p)),
            };
            tasks.push(TaskSummary {
                task_id: record.task_id,
                state: Some(state),
                terminal: state.is_terminal(),
                description: Some(record.description),
                cursor: Some(record.cursor),
                problem,
                status_note: status_note(state),
            });
        }
        Ok(tasks)
    }

    fn supports_extension(&self) -> bool {
        self.extension
    }
}
