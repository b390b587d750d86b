//! [`WorkerHandle`]: the worker API, authorised by the worker's token.

use meatspace_domain::{IssueKind, Task};
use reqwest::Method;
use uuid::Uuid;

use crate::error::Error;
use crate::feed::Feed;
use crate::http::{Auth, Body, Call, Client, Credential};
use crate::types::{EndWork, EventPage, Message, OpenTaskPage, RaiseIssue, TaskChange};

/// A registered worker.
#[derive(Clone, derive_more::Debug)]
pub struct WorkerHandle {
    client: Client,
    #[debug(skip)]
    token: String,
}

impl WorkerHandle {
    pub(crate) fn new(client: Client, token: String) -> Self {
        WorkerHandle { client, token }
    }

    /// The worker token (to store it; it is shown only once by the server).
    pub fn token(&self) -> &str {
        &self.token
    }

    fn call(&self, method: Method, path: String) -> Call<'_> {
        Call::new(method, path, Auth::Bearer(&self.token))
    }

    fn task_call(&self, method: Method, id: Uuid, suffix: &str) -> Call<'_> {
        self.call(method, format!("/api/v1/worker/tasks/{id}{suffix}"))
    }

    /// One page of open tasks, oldest first (`cursor`: the previous
    /// page's `next_cursor`).
    pub async fn open_tasks(
        &self,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<OpenTaskPage, Error> {
        let mut call = self.call(Method::GET, "/api/v1/worker/tasks".into());
        call.page(cursor, limit);
        self.client.json(call).await
    }

    /// A task that is open or assigned to this worker.
    pub async fn task(&self, id: Uuid) -> Result<Task, Error> {
        self.client.json(self.task_call(Method::GET, id, "")).await
    }

    /// open → assigned to this worker (409 when someone else won).
    pub async fn claim(&self, id: Uuid) -> Result<TaskChange, Error> {
        self.client
            .json(self.task_call(Method::POST, id, "/claim"))
            .await
    }

    /// assigned → active.
    pub async fn start(&self, id: Uuid) -> Result<TaskChange, Error> {
        self.client
            .json(self.task_call(Method::POST, id, "/start"))
            .await
    }

    /// A text message to the agent.
    pub async fn message(&self, id: Uuid, text: &str) -> Result<TaskChange, Error> {
        let call = self
            .task_call(Method::POST, id, "/messages")
            .body(Body::json(&Message {
                text: text.to_owned(),
            })?);
        self.client.json(call).await
    }

    /// A photo (JPEG, PNG or WebP; `content_type` names which).
    pub async fn photo(
        &self,
        id: Uuid,
        content_type: &str,
        bytes: Vec<u8>,
    ) -> Result<TaskChange, Error> {
        let call = self.task_call(Method::POST, id, "/photos").body(Body::Raw {
            content_type: content_type.to_owned(),
            bytes,
        });
        self.client.json(call).await
    }

    /// A typed issue for the agent; its event id is what the agent answers.
    pub async fn issue(&self, id: Uuid, kind: IssueKind, text: &str) -> Result<TaskChange, Error> {
        let call = self
            .task_call(Method::POST, id, "/issues")
            .body(Body::json(&RaiseIssue {
                kind,
                text: text.to_owned(),
            })?);
        self.client.json(call).await
    }

    /// active → completed, with an optional note.
    pub async fn complete(&self, id: Uuid, note: Option<&str>) -> Result<TaskChange, Error> {
        self.end(id, "/complete", note).await
    }

    /// Completes a task with a `result_schema`: `result` must match it
    /// (photo fields name photos sent for the task). With review on, the
    /// work is submitted and the task stays active until the agent answers.
    pub async fn complete_with_result(
        &self,
        id: Uuid,
        note: Option<&str>,
        result: serde_json::Value,
    ) -> Result<TaskChange, Error> {
        let call = self
            .task_call(Method::POST, id, "/complete")
            .body(Body::json(&EndWork {
                text: note.map(str::to_owned),
                result: Some(result),
            })?);
        self.client.json(call).await
    }

    /// assigned or active → stopped, with an optional reason.
    pub async fn stop(&self, id: Uuid, reason: Option<&str>) -> Result<TaskChange, Error> {
        self.end(id, "/stop", reason).await
    }

    async fn end(&self, id: Uuid, suffix: &str, text: Option<&str>) -> Result<TaskChange, Error> {
        let mut call = self.task_call(Method::POST, id, suffix);
        if let Some(text) = text {
            call = call.body(Body::json(&EndWork {
                text: Some(text.to_owned()),
                result: None,
            })?);
        }
        self.client.json(call).await
    }

    /// One page of the feed of a task assigned to this worker.
    pub async fn events(
        &self,
        id: Uuid,
        after: i64,
        wait_seconds: u32,
    ) -> Result<EventPage, Error> {
        let mut call = self.task_call(Method::GET, id, "/events");
        call.query.push(("after", after.to_string()));
        call.query.push(("wait", wait_seconds.to_string()));
        call.extra_time = std::time::Duration::from_secs(u64::from(wait_seconds));
        self.client.json(call).await
    }

    /// Follows the feed of a task assigned to this worker.
    pub fn follow(&self, id: Uuid, after: i64) -> Feed {
        Feed::new(
            self.client.clone(),
            format!("/api/v1/worker/tasks/{id}/events"),
            Credential::Token(self.token.clone()),
            after,
        )
    }
}
