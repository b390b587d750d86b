//! A task's event feed as both sides read it: pages after a cursor, long
//! polls that wait for the next event, and what the agent and the worker
//! each may see of it. The routes are the tasks' and the worker tasks'
//! (`…/events`); the SSE stream is [`super::stream`].

use std::sync::Arc;
use std::time::Duration;

use meatspace_api_types::EventPage;
use meatspace_domain::{FeedView, Task};

use meatspace_store::Store;
use uuid::Uuid;

use crate::AppState;
use crate::feed::{Watch, Woken};
use crate::http::error::ApiError;

/// `after`, `limit` and `wait` of an event feed request.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Return events with an id greater than this (start with 0).
    #[serde(default)]
    #[param(minimum = 0)]
    pub after: i64,
    /// Largest number of events to return (1-1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Long poll: seconds to wait (0-30, default 0) when there is no event
    /// after `after` yet and the task is not terminal. The answer comes as
    /// soon as an event exists, or as an empty page when the time is up (or
    /// the server is shutting down). 0 answers at once.
    #[param(minimum = 0, maximum = 30)]
    pub wait: Option<u32>,
}

/// Largest page of events.
pub const MAX_EVENTS_PAGE: u32 = 1000;
const DEFAULT_EVENTS_PAGE: u32 = 100;
/// Longest long poll, in seconds.
pub const MAX_WAIT_SECONDS: u32 = 30;

// Schema attributes of [`EventsQuery`] take literals only: this keeps them
// equal to the limits.
const _: () = assert!(MAX_EVENTS_PAGE == 1000 && MAX_WAIT_SECONDS == 30);

/// A checked [`EventsQuery`].
#[derive(Debug, Clone, Copy)]
struct PageQuery {
    after: i64,
    limit: u32,
    wait: Duration,
}

impl EventsQuery {
    fn checked(&self) -> Result<PageQuery, ApiError> {
        if self.after < 0 {
            return Err(ApiError::bad_request(
                "invalid-query",
                "after must be 0 or greater",
            ));
        }
        let limit = self.limit.unwrap_or(DEFAULT_EVENTS_PAGE);
        if !(1..=MAX_EVENTS_PAGE).contains(&limit) {
            return Err(ApiError::bad_request(
                "invalid-query",
                format!("limit must be between 1 and {MAX_EVENTS_PAGE}"),
            ));
        }
        let wait = self.wait.unwrap_or(0);
        if wait > MAX_WAIT_SECONDS {
            return Err(ApiError::bad_request(
                "invalid-query",
                format!("wait must be between 0 and {MAX_WAIT_SECONDS} seconds"),
            ));
        }
        Ok(PageQuery {
            after: self.after,
            limit,
            wait: Duration::from_secs(u64::from(wait)),
        })
    }
}

/// What `worker` may see of task `id`'s feed ([`FeedView::worker`]: from
/// its own assignment on). The JSON feed, the web app and the event stream
/// all take it from here.
pub async fn worker_view(store: &dyn Store, worker: Uuid, id: Uuid) -> Result<FeedView, ApiError> {
    let last_unassigned = store
        .last_event_of_type(id, meatspace_domain::EventType::TaskUnassigned)
        .await?;
    Ok(FeedView::worker(worker, last_unassigned))
}

/// Who reads a feed: the agent sees every event of its task; a worker
/// only a task assigned to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    Agent,
    Worker(Uuid),
}

impl Reader {
    fn may_read(self, task: &Task) -> bool {
        match self {
            Reader::Agent => true,
            Reader::Worker(worker) => task.worker_id == Some(worker),
        }
    }
}

/// The answer to a feed request after its first read: a page, or a long
/// poll that found nothing yet and waits for the next event.
#[derive(Debug)]
pub enum FeedAnswer {
    Page(EventPage),
    Wait(LongPoll),
}

impl FeedAnswer {
    /// Keeps `slot` (a place among the capped long polls, see
    /// [`crate::http::rate_limit::StreamSlots`]) for as long as the poll waits;
    /// a page answered at once gives it back now.
    pub fn holding(mut self, slot: Option<crate::http::rate_limit::StreamSlot>) -> Self {
        if let FeedAnswer::Wait(poll) = &mut self {
            poll.slot = slot;
        }
        self
    }

    /// The page, waiting for it first if need be.
    pub async fn page(self) -> EventPage {
        match self {
            FeedAnswer::Page(page) => page,
            FeedAnswer::Wait(poll) => poll.finish().await,
        }
    }
}

impl axum::response::IntoResponse for FeedAnswer {
    /// A waiting long poll is answered `200` at once, and its body (the
    /// page) follows when an event arrives, the wait ends or the server
    /// shuts down. Everything that could fail was checked by the first
    /// read, and a wait has no other outcome than a page, so the status is
    /// known now. Waiting inside the body rather than inside the handler
    /// lets the request's middleware and handler state go: an idle long
    /// poll then costs its connection and this [`LongPoll`], like an idle
    /// event stream (see `scripts/sse-fanout.sh`).
    fn into_response(self) -> axum::response::Response {
        match self {
            FeedAnswer::Page(page) => axum::Json(page).into_response(),
            FeedAnswer::Wait(poll) => {
                let body = futures::stream::once(async move {
                    let page = poll.finish().await;
                    // Ids, states, timestamps and JSON values only.
                    let json = serde_json::to_vec(&page).expect("an event page serializes");
                    Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(json))
                });
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        axum::http::HeaderValue::from_static("application/json"),
                    )],
                    axum::body::Body::from_stream(body),
                )
                    .into_response()
            }
        }
    }
}

/// A long poll whose first read found no event after the cursor: what it
/// needs to finish on its own, without the request that started it.
#[derive(Debug)]
pub struct LongPoll {
    store: Arc<dyn Store>,
    watch: Watch,
    deadline: tokio::time::Instant,
    reader: Reader,
    q: PageQuery,
    /// The empty page read so far.
    page: EventPage,
    /// Its place among the client's capped long polls, given back when
    /// the poll ends.
    slot: Option<crate::http::rate_limit::StreamSlot>,
}

impl LongPoll {
    /// Waits for the next event of the task, the deadline or the server's
    /// shutdown, and answers the page read last. A read that fails after a
    /// wake-up (the database restarting) does not end the wait: the next
    /// wake-up reads again, and at the deadline the page is empty, which a
    /// client treats like any empty page (poll again from the same cursor).
    /// A task the reader may no longer see (unassigned, removed) ends it
    /// with the empty page; the next poll says why.
    async fn finish(mut self) -> EventPage {
        let store = self.store.as_ref();
        loop {
            match self.watch.changed(self.deadline).await {
                Woken::Changed => {}
                // Answer with what we have.
                Woken::Deadline | Woken::Closed => return self.page,
            }
            let task = match store.task(self.page.task_id).await {
                Ok(Some(task)) if self.reader.may_read(&task) => task,
                Ok(_) => return self.page,
                Err(e) => {
                    tracing::debug!(error = %e, "a woken long poll could not read; waiting on");
                    continue;
                }
            };
            match read_page(store, task, self.q).await {
                Ok(page) if page.events.is_empty() && !page.terminal => self.page = page,
                Ok(page) => return page,
                Err(e) => {
                    tracing::debug!(error = ?e, "a woken long poll could not read; waiting on");
                }
            }
        }
    }
}

/// Answers a feed request for task `id`, which `reader` may read (otherwise
/// 404), from the event after `floor` at the earliest (the worker's feed
/// starts at its own assignment). The page is read as [`read_page`] does;
/// with `wait`, an empty page of a task that is not terminal becomes a
/// [`LongPoll`] that waits for the next event (see [`crate::feed`]).
pub async fn open_feed(
    state: &AppState,
    id: Uuid,
    q: &EventsQuery,
    floor: i64,
    reader: Reader,
) -> Result<FeedAnswer, ApiError> {
    let store = state.store.as_ref();
    let task = visible_task(store, id, |t| reader.may_read(t)).await?;
    let mut q = q.checked()?;
    q.after = q.after.max(floor);
    if q.wait.is_zero() {
        return read_page(store, task, q).await.map(FeedAnswer::Page);
    }
    let deadline = tokio::time::Instant::now() + q.wait;
    // Subscribe before reading the events: an event committed after the
    // read wakes this request, so none is missed between read and wait.
    let watch = state.feed.watch(id);
    let page = read_page(store, task, q).await?;
    if !page.events.is_empty() || page.terminal {
        return Ok(FeedAnswer::Page(page));
    }
    Ok(FeedAnswer::Wait(LongPoll {
        store: Arc::clone(&state.store),
        watch,
        deadline,
        reader,
        q,
        page,
        slot: None,
    }))
}

/// [`open_feed`], waiting for the page in place: for callers that answer
/// with more than the page (the web app, MCP tools).
pub async fn event_feed(
    state: &AppState,
    id: Uuid,
    q: &EventsQuery,
    floor: i64,
    reader: Reader,
) -> Result<EventPage, ApiError> {
    Ok(open_feed(state, id, q, floor, reader).await?.page().await)
}

/// Counter of empty polls answered from a known head, without the database.
pub const MEMORY_ANSWERS: &str = "meatspace_feed_memory_answers_total";

/// The [`MEMORY_ANSWERS`] counter, looked up in the recorder once rather
/// than on every answer (building the key, hashing it, finding it in the
/// registry: about 0.5 % of the server's CPU under empty polls). First
/// used by a poll, so after the server installed the recorder
/// ([`crate::http::metrics::handle`]).
fn memory_answers() -> &'static metrics::Counter {
    static COUNTER: std::sync::LazyLock<metrics::Counter> =
        std::sync::LazyLock::new(|| metrics::counter!(MEMORY_ANSWERS));
    &COUNTER
}

/// An agent's request of its task's feed (`GET /api/v1/tasks/{id}/events`),
/// authenticated here rather than by an extractor, so that a page read from
/// the database costs one statement ([`TaskReads::feed_read`]: token digest,
/// state and events together) and an empty page of a task whose head is
/// known costs none ([`crate::feed_heads`]). Answers exactly as
/// [`crate::auth::AgentAuth`] followed by [`event_feed`] would: 401 for a
/// wrong token, 404 for another task's token or a task that is gone, and
/// only then 400 for a bad query.
pub async fn agent_event_feed(
    state: &AppState,
    credential: &crate::auth::AgentCredential,
    query: Result<EventsQuery, ApiError>,
) -> Result<FeedAnswer, ApiError> {
    use crate::auth::{agent_token_subject, authorize_agent_token, invalid_agent_token};
    let (id, token) = (credential.task_id, credential.token());
    let (query, q) = match query.and_then(|query| query.checked().map(|q| (query, q))) {
        Ok(checked) => checked,
        Err(e) => {
            authorize_agent_token(state, token, id).await?;
            return Err(e);
        }
    };
    // A key of the task's owner (or an operator's) is checked first, from
    // memory when it was seen before; then the task's digest has no say.
    let by_key = token.starts_with(crate::auth::KEY_PREFIX);
    if by_key {
        authorize_agent_token(state, token, id).await?;
    }
    if q.wait.is_zero() && (by_key || agent_token_subject(token) == Some(id)) {
        let heads = state.feed.heads();
        if let Some(head) = heads.get(id) {
            if !by_key && !head.agent_token_hash.verify(token) {
                return Err(invalid_agent_token());
            }
            if q.after >= head.last_event_id {
                memory_answers().increment(1);
                return Ok(FeedAnswer::Page(EventPage {
                    task_id: id,
                    task_state: head.state,
                    terminal: head.state.is_terminal(),
                    events: Vec::new(),
                    next_cursor: q.after,
                    has_more: false,
                }));
            }
        }
        let stamp = heads.stamp(id);
        if let Some(read) = state.store.feed_read(id, q.after, q.limit + 1).await? {
            if !by_key && !read.agent_token_hash.verify(token) {
                return Err(invalid_agent_token());
            }
            let mut events = read.events;
            let has_more = events.len() > q.limit as usize;
            events.truncate(q.limit as usize);
            let next_cursor = events.last().map_or(q.after, |e| e.id);
            let page = EventPage {
                task_id: id,
                task_state: read.state,
                terminal: read.state.is_terminal(),
                events,
                next_cursor,
                has_more,
            };
            if let Some(stamp) = stamp {
                heads.remember(
                    id,
                    stamp,
                    crate::feed_heads::Head {
                        agent_token_hash: read.agent_token_hash,
                        state: read.state,
                        last_event_id: read.last_event_id,
                    },
                );
            }
            return Ok(FeedAnswer::Page(page));
        }
        // No such task: purged (its tombstone says 404) or never there (401).
    }
    if !by_key {
        authorize_agent_token(state, token, id).await?;
    }
    open_feed(state, id, &query, 0, Reader::Agent).await
}

/// The task, if it exists and `visible` lets the caller see it.
async fn visible_task(
    store: &dyn Store,
    id: Uuid,
    visible: impl Fn(&Task) -> bool,
) -> Result<Task, ApiError> {
    store
        .task(id)
        .await?
        .filter(|t| visible(t))
        .ok_or_else(ApiError::task_not_found)
}

/// Reads a page of the feed: `task` is the state read first, then the
/// events (see [`EventPage`]).
async fn read_page(store: &dyn Store, task: Task, q: PageQuery) -> Result<EventPage, ApiError> {
    let mut events = store.events(task.id, q.after, q.limit + 1).await?;
    let has_more = events.len() > q.limit as usize;
    events.truncate(q.limit as usize);
    let next_cursor = events.last().map_or(q.after, |e| e.id);
    Ok(EventPage {
        task_id: task.id,
        task_state: task.state,
        terminal: task.state.is_terminal(),
        events,
        next_cursor,
        has_more,
    })
}
