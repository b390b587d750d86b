//! The backend of the stdio transport: the meatspace HTTP API, with each
//! task's agent token, cursor and last known state kept in a
//! [`StateDir`] (the CLI's state directory, so either tool can follow a
//! task the other created), so tools name tasks by id only and no result
//! carries a token.
//!
//! The cursor obligation: wait_for_events returns events without moving
//! the stored cursor; a later call that passes `cursor` acknowledges the
//! events up to it, and only then is it stored. A client that crashes after
//! receiving events therefore reads them again (safe) rather than missing
//! them (not safe).

use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, RequestBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use crate::api::{Action, AgentApi, Caller, LocalTaskRef};
use crate::state_dir::{StateDir, TaskRecord};
use crate::tools::DEV_KEY_HEADER;
use crate::types::{
    ApiCreated, ApiEventPage, ApiTaskChange, Problem, TaskState, TaskSummary, TaskView,
};
use serde_json::Value;

/// Path of the extension route; its presence in the server's OpenAPI
/// document turns on extend_task.
const EXTEND_PATH: &str = "/api/v1/tasks/{task_id}/extend";

/// Shortest time wait_for_events keeps retrying an unreachable or
/// unavailable API before it reports the failure.
const RETRY_WINDOW: Duration = Duration::from_secs(30);

/// list_my_tasks over stdio takes no argument: the tasks are the ones in
/// the state directory.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// The HTTP API as an [`AgentApi`].
#[derive(Debug)]
pub struct RemoteApi {
    base_url: String,
    dev_key: Option<String>,
    client: reqwest::Client,
    state: StateDir,
    extension: bool,
    /// Serialises read-modify-write of task records within this process.
    records: Mutex<()>,
}

impl RemoteApi {
    /// A backend for the API at `base_url` (e.g. `http://127.0.0.1:8080`),
    /// creating tasks with `dev_key`. Reads the server's OpenAPI document
    /// once to learn whether deadline extension exists.
    pub async fn connect(
        base_url: &str,
        dev_key: Option<String>,
        state: StateDir,
    ) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        let mut api = RemoteApi {
            base_url: base_url.trim_end_matches('/').to_owned(),
            dev_key,
            client,
            state,
            extension: false,
            records: Mutex::new(()),
        };
        api.extension = match api.openapi_paths().await {
            Ok(paths) => paths.iter().any(|p| p == EXTEND_PATH),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the OpenAPI document; extend_task is off");
                false
            }
        };
        Ok(api)
    }

    async fn openapi_paths(&self) -> anyhow::Result<Vec<String>> {
        #[derive(Deserialize)]
        struct Doc {
            paths: serde_json::Map<String, serde_json::Value>,
        }
        let doc: Doc = self
            .client
            .get(format!("{}/api/v1/openapi.json", self.base_url))
            .timeout(Duration::from_secs(30))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(doc.paths.keys().cloned().collect())
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base_url))
            .timeout(Duration::from_secs(60))
    }

    fn record(&self, task_id: uuid::Uuid) -> Result<TaskRecord, Problem> {
        self.state
            .load(task_id)
            .map_err(state_problem)?
            .ok_or_else(|| {
                Problem::local(
                    404,
                    "unknown-task",
                    format!(
                        "task {task_id} is not in this server's state directory (only tasks created through it can be used)"
                    ),
                )
            })
    }

    /// Stores the task as the API just returned it (JSON).
    async fn note_task(&self, task: &Value) -> Result<(), Problem> {
        let _guard = self.records.lock().await;
        self.state
            .note_task(&self.base_url, task)
            .map_err(state_problem)
    }

    async fn note_state(&self, task_id: uuid::Uuid, state: TaskState) -> Result<(), Problem> {
        let _guard = self.records.lock().await;
        self.state.note_state(task_id, state).map_err(state_problem)
    }
}

/// The API's answer, read as the tools' type.
fn parse<T: DeserializeOwned>(value: Value) -> Result<T, Problem> {
    serde_json::from_value(value).map_err(|e| {
        Problem::local(
            502,
            "bad-answer",
            format!("the API's answer was not understood: {e}"),
        )
    })
}

fn state_problem(e: impl std::fmt::Display) -> Problem {
    Problem::local(
        500,
        "state-directory",
        format!("the local state directory failed: {e}"),
    )
}

/// Sends `req` and reads a JSON answer, or the API's problem document.
async fn send<T: DeserializeOwned>(req: RequestBuilder) -> Result<T, Problem> {
    let res = req.send().await.map_err(|e| {
        Problem::local(
            503,
            "api-unreachable",
            format!(
                "the meatspace API could not be reached: {}",
                e.without_url()
            ),
        )
    })?;
    let status = res.status();
    if status.is_success() {
        return res.json().await.map_err(|e| {
            Problem::local(
                502,
                "bad-answer",
                format!("the API's answer was not understood: {}", e.without_url()),
            )
        });
    }
    let bytes = res.bytes().await.unwrap_or_default();
    Err(
        serde_json::from_slice::<Problem>(&bytes).unwrap_or_else(|_| {
            Problem::local(
                status.as_u16(),
                "http-error",
                format!(
                    "the API answered {}",
                    status.canonical_reason().unwrap_or("an error")
                ),
            )
        }),
    )
}

#[async_trait]
impl AgentApi for RemoteApi {
    type TaskRef = LocalTaskRef;
    type ListArgs = NoArgs;
    const CREDENTIAL_NOTE: &'static str = "Credentials never pass through you: this local server keeps each task's agent token (and its cursor) in its state directory, so tools take only task_id.";
    const SHOWS_TOKEN: bool = false;

    async fn create_task(
        &self,
        _caller: &Caller,
        description: String,
        expires_in_seconds: Option<i64>,
    ) -> Result<ApiCreated, Problem> {
        let mut req = self
            .request(Method::POST, "/api/v1/tasks")
            .json(&serde_json::json!({
                "description": description,
                "expires_in_seconds": expires_in_seconds,
            }));
        if let Some(key) = &self.dev_key {
            req = req.header(DEV_KEY_HEADER, key);
        }
        let answer: Value = send(req).await?;
        let created: ApiCreated = parse(answer.clone())?;
        // Kept before the result is returned: the token is shown only once.
        let _guard = self.records.lock().await;
        self.state
            .save_created(&self.base_url, &answer)
            .map_err(state_problem)?;
        Ok(created)
    }

    fn task_ref(&self, created: &ApiCreated) -> LocalTaskRef {
        LocalTaskRef {
            task_id: created.task.id,
        }
    }

    async fn get_task(&self, task: &LocalTaskRef) -> Result<TaskView, Problem> {
        let record = self.record(task.task_id)?;
        let answer: Value = send(
            self.request(Method::GET, &format!("/api/v1/tasks/{}", task.task_id))
                .bearer_auth(&record.agent_token),
        )
        .await?;
        self.note_task(&answer).await?;
        parse(answer)
    }

    async fn act(&self, task: &LocalTaskRef, action: Action) -> Result<ApiTaskChange, Problem> {
        let record = self.record(task.task_id)?;
        let id = task.task_id;
        let (path, body) = match action {
            Action::Publish => (format!("/api/v1/tasks/{id}/publish"), None),
            Action::Cancel => (format!("/api/v1/tasks/{id}/cancel"), None),
            Action::RespondToIssue {
                issue_event_id,
                action,
                text,
            } => (
                format!("/api/v1/tasks/{id}/issues/{issue_event_id}/respond"),
                Some(serde_json::json!({ "action": action, "text": text })),
            ),
            Action::Extend { add_seconds } => (
                format!("/api/v1/tasks/{id}/extend"),
                Some(serde_json::json!({ "add_seconds": add_seconds })),
            ),
        };
        let mut req = self
            .request(Method::POST, &path)
            .bearer_auth(&record.agent_token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let answer: Value = send(req).await?;
        let change: ApiTaskChange = parse(answer.clone())?;
        self.note_task(&answer["task"]).await?;
        Ok(change)
    }

    async fn events(
        &self,
        _caller: &Caller,
        task: &LocalTaskRef,
        cursor: Option<i64>,
        wait: Duration,
    ) -> Result<ApiEventPage, Problem> {
        let id = task.task_id;
        let record = self.record(id)?;
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
        let page: ApiEventPage = loop {
            let left = wait_until.saturating_duration_since(tokio::time::Instant::now());
            let result = send(
                self.request(Method::GET, &format!("/api/v1/tasks/{id}/events"))
                    .query(&[("after", after), ("wait", left.as_secs() as i64)])
                    .timeout(left + Duration::from_secs(30))
                    .bearer_auth(&record.agent_token),
            )
            .await;
            match result {
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
                Ok(Some(view)) => (view.state, None),
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
                status_note: state.status_note(),
            });
        }
        Ok(tasks)
    }

    fn supports_extension(&self) -> bool {
        self.extension
    }
}
