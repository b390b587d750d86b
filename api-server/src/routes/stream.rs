//! Server-Sent Events: the task's event feed pushed as `text/event-stream`,
//! for the agent (`GET /api/v1/tasks/{id}/events/stream`) and the assigned
//! worker (`GET /api/v1/worker/tasks/{id}/events/stream`).
//!
//! Each event goes out as `id: <event id>`, `event: <type>` and
//! `data: <the same JSON object as one element of the polled page>`, so a
//! client that reconnects with `Last-Event-ID` (or `?after=`) resumes
//! exactly where it stopped; the stream is only a faster way to read the
//! durable feed, never a second source of truth. After the terminal event the
//! stream ends, so a client knows the task is over without another request.
//!
//! An idle stream holds no database connection: it waits on a
//! [`Watch`](crate::feed::Watch) of the process-wide hub
//! ([`crate::feed`]) and reads the database only when woken (its task
//! changed, or the hub may have missed changes). Heartbeats are SSE
//! comments (`: keep-alive`), sent every [`Integrations::sse_heartbeat`]
//! (`crate::integrations`) so proxies keep the connection open and clients
//! notice a dead one.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use meatspace_domain::{Event, FeedView};
use meatspace_store::Store;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::worker_tasks::TaskId;
use crate::AppState;
use crate::auth::{AgentAuth, Principal, WorkerAuth};
use crate::feed::{Watch, Woken};
use crate::http::error::ApiError;
use crate::http::error::responses::TaskFeedErrors;
use crate::http::extract::Query;
use crate::http::rate_limit::{ClientAddress, StreamSlot};

/// Events read from the database per wake-up.
const BATCH: u32 = 500;
/// How long a stream waits on the hub before it re-arms the wait; wakes
/// come from the hub, this only bounds one `changed` call.
const REARM: Duration = Duration::from_secs(3600);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(agent_stream))
        .routes(routes!(worker_stream))
}

/// `?after=` of a stream request.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Send events with an id greater than this (default 0). A
    /// `Last-Event-ID` header, sent by a reconnecting client, wins.
    pub after: Option<i64>,
}

/// The cursor a stream starts from: `Last-Event-ID`, else `after`, else 0.
pub(crate) fn start_cursor(headers: &HeaderMap, q: &StreamQuery) -> Result<i64, ApiError> {
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid-last-event-id",
                    "Last-Event-ID must be an event id (an integer)",
                )
            })?,
        None => q.after.unwrap_or(0),
    };
    if after < 0 {
        return Err(ApiError::bad_request(
            "invalid-query",
            "after must be 0 or greater",
        ));
    }
    Ok(after)
}

/// One message of the stream as an SSE parser delivers it (the document's
/// schema of `text/event-stream`; `: keep-alive` comments are not messages).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // describes the document; the stream is written as text
pub struct SseMessage {
    /// The event's id: the cursor to resume after (`Last-Event-ID`).
    id: String,
    /// The event's type, e.g. `worker.message`.
    event: String,
    /// The event as JSON, the same object as one element of the polled
    /// feed's `events`.
    data: String,
}

/// The task's event feed as Server-Sent Events. Resume with `Last-Event-ID`
/// or `?after=`; the stream ends after the terminal event. The bearer is the
/// task's agent token, or an API key of the principal that owns the task.
// The document names the agent token only: with a second bearer scheme on
// an operation that has a header parameter, schemathesis expects an unknown
// header to be refused (HTTP headers are an open set), see
// scripts/openapi-check.sh.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/events/stream", tag = "agent",
    operation_id = "stream_task_events",
    params(StreamQuery,
        ("Last-Event-ID" = Option<i64>, Header, description = "resume after this event id")),
    security(("agent_token" = [])),
    responses(
        (status = 200, description = "`text/event-stream`: `id:` event id, `event:` event type, `data:` the event as in the polled feed; `: keep-alive` comments in between",
            content_type = "text/event-stream", body = SseMessage), TaskFeedErrors))]
async fn agent_stream(
    State(state): State<AppState>,
    AgentAuth(id, _): AgentAuth,
    ClientAddress(address): ClientAddress,
    headers: HeaderMap,
    Query(q): Query<StreamQuery>,
) -> Result<Response, ApiError> {
    let after = start_cursor(&headers, &q)?;
    let slot = state
        .rate_limit
        .streams()
        .open(Principal::Agent(id), address)?;
    stream(state, id, after, FeedView::Agent, slot, ApiReader).await
}

/// The task's event feed as Server-Sent Events, for the assigned worker.
#[utoipa::path(get, path = "/api/v1/worker/tasks/{task_id}/events/stream", tag = "worker",
    operation_id = "worker_stream_task_events",
    params(StreamQuery,
        ("Last-Event-ID" = Option<i64>, Header, description = "resume after this event id")),
    responses(
        (status = 200, description = "`text/event-stream`, as the agent's stream",
            content_type = "text/event-stream", body = SseMessage), TaskFeedErrors))]
async fn worker_stream(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    ClientAddress(address): ClientAddress,
    headers: HeaderMap,
    Query(q): Query<StreamQuery>,
) -> Result<Response, ApiError> {
    let after = start_cursor(&headers, &q)?;
    // The same view as the polled feed: from this worker's assignment on,
    // never the conversation of a worker whose assignment lapsed.
    let view = super::events::worker_view(state.store.as_ref(), worker, id).await?;
    let slot = state
        .rate_limit
        .streams()
        .open(Principal::Worker(worker), address)?;
    stream(state, id, after, view, slot, ApiReader).await
}

/// Who reads a stream: how each event is sent to it, and whether it may
/// still read.
pub(crate) trait StreamReader: Send + Sync + 'static {
    /// The event as this reader receives it.
    fn render(&self, e: &Event) -> SseEvent;

    /// Asked when new events were read, before they are sent: false ends
    /// the stream without them (a console session that ended receives
    /// nothing written after it ended).
    fn allowed(&self) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }
}

/// A reader of the API's streams, whose credential was checked when the
/// stream opened: each event as in the polled feed.
struct ApiReader;

impl StreamReader for ApiReader {
    fn render(&self, e: &Event) -> SseEvent {
        let data = serde_json::to_string(e).unwrap_or_else(|_| "{}".to_owned());
        SseEvent::default()
            .id(e.id.to_string())
            .event(e.kind.as_str())
            .data(data)
    }
}

/// Streams what `who` may see of task `id`'s feed after `after` to
/// `reader`. Whether the reader may read the task is checked again on every
/// wake, so a worker who loses the assignment stops receiving.
pub(crate) async fn stream(
    state: AppState,
    id: Uuid,
    after: i64,
    who: FeedView,
    slot: StreamSlot,
    reader: impl StreamReader,
) -> Result<Response, ApiError> {
    // Subscribe before the first read, as the long poll does: a change
    // committed after the read still wakes the stream.
    let watch = state.feed.watch(id);
    state
        .store
        .task(id)
        .await?
        .filter(|t| who.may_read(t))
        .ok_or_else(ApiError::task_not_found)?;
    let follower = Follower {
        store: state.store.clone(),
        watch,
        task_id: id,
        cursor: who.start(after),
        who,
        pending: VecDeque::new(),
        done: false,
        reader,
        _slot: slot,
    };
    let keep_alive = KeepAlive::new()
        .interval(state.integrations.sse_heartbeat)
        .text("keep-alive");
    let mut res = Sse::new(follower.into_stream())
        .keep_alive(keep_alive)
        .into_response();
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Reverse proxies that buffer responses would hold events back.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(res)
}

/// One stream's position in the feed.
struct Follower<R> {
    store: std::sync::Arc<dyn Store>,
    watch: Watch,
    task_id: Uuid,
    /// Id of the last event sent (or the starting cursor).
    cursor: i64,
    who: FeedView,
    /// Events read but not yet sent.
    pending: VecDeque<Event>,
    /// The terminal event has been queued, or the stream must stop.
    done: bool,
    reader: R,
    /// Its place among the client's capped streams, given back when the
    /// stream ends or the client goes away (the body is dropped).
    _slot: StreamSlot,
}

impl<R: StreamReader> Follower<R> {
    fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
        futures::stream::unfold(self, |mut f| async move {
            let event = f.next().await?;
            Some((Ok(event), f))
        })
    }

    /// The next SSE event, or `None` when the stream ends.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                self.cursor = e.id;
                return Some(self.reader.render(&e));
            }
            if self.done {
                return None;
            }
            match self.read().await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    // The client reconnects with its Last-Event-ID and
                    // misses nothing; ending is better than a stuck stream.
                    tracing::warn!(error = %e, task_id = %self.task_id, "event stream read failed; ending it");
                    return None;
                }
            }
            if self.done {
                continue;
            }
            match self
                .watch
                .changed(tokio::time::Instant::now() + REARM)
                .await
            {
                Woken::Changed | Woken::Deadline => {}
                Woken::Closed => return None,
            }
        }
    }

    /// Reads the task and the events after the cursor. True when events
    /// were queued; sets `done` when the stream must end.
    async fn read(&mut self) -> Result<bool, meatspace_store::StoreError> {
        let Some(task) = self
            .store
            .task(self.task_id)
            .await?
            .filter(|t| self.who.may_read(t))
        else {
            // Deleted by retention, or no longer this worker's task.
            self.done = true;
            return Ok(false);
        };
        let events = self.store.events(self.task_id, self.cursor, BATCH).await?;
        if events.is_empty() {
            // The task was read before the events: if it was terminal then,
            // its terminal event is at or before the cursor.
            self.done = task.state.is_terminal();
            return Ok(false);
        }
        // Asked after the read: whatever was written after the reader lost
        // its right is in this batch only if the loss is already visible.
        if !self.reader.allowed().await {
            self.done = true;
            return Ok(false);
        }
        for e in events.into_iter().filter(|e| self.who.shows(e)) {
            let terminal = e.kind.is_terminal();
            self.pending.push_back(e);
            if terminal {
                self.done = true;
                break;
            }
        }
        Ok(true)
    }
}
