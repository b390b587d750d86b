//! [`TaskHandle`]: everything an agent does with one task, authorised by
//! the task's own agent token, or by the API key of the principal that
//! owns the task ([`crate::Client::task_owned`]).

use meatspace_domain::{IssueAction, Task};
use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use serde::Serialize;
use uuid::Uuid;

use crate::error::Error;
use crate::feed::Feed;
use crate::http::{Body, Call, Client, Credential};
use crate::types::{EventPage, Extend, Photo, Respond, ReviewAnswer, TaskChange};

/// One task, as its agent sees it.
#[derive(Clone, Debug)]
pub struct TaskHandle {
    client: Client,
    id: Uuid,
    /// Its Debug leaves the token out.
    credential: Credential,
}

impl TaskHandle {
    pub(crate) fn new(client: Client, id: Uuid, credential: Credential) -> Self {
        TaskHandle {
            client,
            id,
            credential,
        }
    }

    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The agent token (to store it; it is shown only once by the server),
    /// or `None` for a handle that acts with the owner's API key.
    pub fn token(&self) -> Option<&str> {
        match &self.credential {
            Credential::Token(t) => Some(t),
            Credential::Principal => None,
        }
    }

    fn call(&self, method: Method, suffix: &str) -> Call<'_> {
        Call::new(
            method,
            format!("/api/v1/tasks/{}{suffix}", self.id),
            self.credential.auth(),
        )
    }

    /// A POST of `body`, as JSON, to the task's route `suffix`.
    async fn post_json(&self, suffix: &str, body: &impl Serialize) -> Result<TaskChange, Error> {
        let call = self.call(Method::POST, suffix).body(Body::json(body)?);
        self.client.json(call).await
    }

    /// The task and its authoritative state.
    pub async fn get(&self) -> Result<Task, Error> {
        self.client.json(self.call(Method::GET, "")).await
    }

    /// draft → open: workers can see and claim it.
    pub async fn publish(&self) -> Result<TaskChange, Error> {
        self.client.json(self.call(Method::POST, "/publish")).await
    }

    /// Cancels the task (refused with 409 once it is terminal).
    pub async fn cancel(&self) -> Result<TaskChange, Error> {
        self.client.json(self.call(Method::POST, "/cancel")).await
    }

    /// Gives the task more time (never less); a `task.extended` event.
    pub async fn extend(&self, extension: Extend) -> Result<TaskChange, Error> {
        self.post_json("/extend", &extension).await
    }

    /// Answers the worker issue raised by event `issue_event_id`.
    pub async fn respond(
        &self,
        issue_event_id: i64,
        action: IssueAction,
        text: Option<String>,
    ) -> Result<TaskChange, Error> {
        let path = format!("/issues/{issue_event_id}/respond");
        self.post_json(&path, &Respond { action, text }).await
    }

    /// Answers the worker's submission (a task created with `review`):
    /// accept, revise with a text, or reject with a reason.
    pub async fn review(&self, answer: ReviewAnswer) -> Result<TaskChange, Error> {
        self.post_json("/review", &answer).await
    }

    /// One page of the feed: events with `id > after`, at most `limit`,
    /// waiting up to `wait_seconds` (0-30) for the first one.
    pub async fn events(
        &self,
        after: i64,
        limit: Option<u32>,
        wait_seconds: u32,
    ) -> Result<EventPage, Error> {
        let mut call = self.call(Method::GET, "/events");
        call.query.push(("after", after.to_string()));
        if let Some(limit) = limit {
            call.query.push(("limit", limit.to_string()));
        }
        call.query.push(("wait", wait_seconds.to_string()));
        call.extra_time = std::time::Duration::from_secs(u64::from(wait_seconds));
        self.client.json(call).await
    }

    /// Follows the feed from `after` (0: from the first event).
    pub fn follow(&self, after: i64) -> Feed {
        Feed::new(
            self.client.clone(),
            format!("/api/v1/tasks/{}/events", self.id),
            self.credential.clone(),
            after,
        )
    }

    /// A photo a worker sent (`photo_id` from a `worker.photo` event).
    pub async fn photo(&self, photo_id: Uuid) -> Result<Photo, Error> {
        let res = self
            .client
            .send(self.call(Method::GET, &format!("/photos/{photo_id}")))
            .await?;
        let content_type = res
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_owned();
        let bytes = res.bytes().await.map_err(Error::Transport)?.to_vec();
        Ok(Photo {
            content_type,
            bytes,
        })
    }
}
