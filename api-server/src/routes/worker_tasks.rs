//! The worker's side of a task: browse open tasks (nearest first, with a
//! point), claim one, start it, send messages, photos and typed issues,
//! complete or stop it, and read its feed. A worker sees open tasks and the
//! tasks assigned to it; any other task is a 404.

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use meatspace_api_types::{EndWork, ListedTask, Message, OpenTaskPage, RaiseIssue, StartWork};
use meatspace_domain::Position;
use meatspace_domain::place::MAX_NEARBY_M;
use meatspace_domain::{Command, MAX_TEXT_CHARS, NewPhoto, Refusal, Task, TaskState};
use meatspace_store::StoreError;
use meatspace_store::{Near, NearCursor};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::eligibility::Eligibility;
use super::events::{EventsQuery, FeedAnswer, Reader, open_feed};
use super::{EventPage, TaskChange, checked_optional_text, checked_text};
use crate::AppState;
use crate::auth::{WorkerAuth, task_id_param};
use crate::http::error::ApiError;
use crate::http::error::responses::{
    NearbyListErrors, TaskBodyCommandErrors, TaskCommandErrors, TaskFeedErrors, TaskReadErrors,
};
use crate::http::extract::{Json, OptionalJson, Query};
use crate::http::rate_limit::ClientAddress;
use crate::photo::{self, ACCEPTED_TYPES, ImageBytes, PhotoError};

// Schema attributes take literals only: this keeps them equal to the limits.
const _: () = assert!(MAX_TEXT_CHARS == 4000);

/// The route template of photo uploads (its body limit is the photo limit).
pub const PHOTO_PATH: &str = "/api/v1/worker/tasks/{task_id}/photos";

pub fn router(max_photo_bytes: usize) -> OpenApiRouter<AppState> {
    let photos = OpenApiRouter::new()
        .routes(routes!(send_photo))
        .layer(DefaultBodyLimit::max(max_photo_bytes));
    OpenApiRouter::new()
        .routes(routes!(list_open_tasks))
        .routes(routes!(get_task))
        .routes(routes!(claim))
        .routes(routes!(start))
        .routes(routes!(send_message))
        .routes(routes!(raise_issue))
        .routes(routes!(complete))
        .routes(routes!(stop))
        .routes(routes!(task_events))
        .merge(photos)
}

/// The `{task_id}` of a worker route; a malformed id names no task.
#[derive(Debug, Clone, Copy)]
pub struct TaskId(pub Uuid);

impl axum::extract::FromRequestParts<AppState> for TaskId {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        task_id_param(parts, state).await.map(TaskId)
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size (1-100, default 50).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// `LATITUDE,LONGITUDE` (WGS 84 degrees): list the open tasks with a
    /// place within `within_m` of this point nearest first, each with its
    /// distance, then the open tasks without a place.
    #[param(pattern = r"^-?[0-9.]+,-?[0-9.]+$")]
    pub near: Option<String>,
    /// With `near`: the farthest place to list, in metres (1 to 1000000;
    /// default 50000).
    #[param(minimum = 1, maximum = 1000000)]
    pub within_m: Option<u32>,
}

/// Default of `within_m`, in metres.
const DEFAULT_WITHIN_M: u32 = 50_000;

/// The position a photo was taken at, as query parameters: all three or none.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PhotoQuery {
    /// The device's latitude (WGS 84 degrees) when the photo was taken.
    #[param(minimum = -90, maximum = 90)]
    pub latitude: Option<f64>,
    /// The device's longitude (WGS 84 degrees).
    #[param(minimum = -180, maximum = 180)]
    pub longitude: Option<f64>,
    /// The device's accuracy in metres (0 to 100000).
    #[param(minimum = 0, maximum = 100000)]
    pub accuracy_m: Option<f64>,
}

impl PhotoQuery {
    fn position(&self) -> Result<Option<Position>, ApiError> {
        match (self.latitude, self.longitude, self.accuracy_m) {
            (None, None, None) => Ok(None),
            (Some(lat), Some(lon), Some(acc)) => checked_position(Position {
                latitude: lat,
                longitude: lon,
                accuracy_m: acc,
            })
            .map(Some),
            _ => Err(ApiError::invalid(
                "send latitude, longitude and accuracy_m together, or none of them",
            )),
        }
    }
}

/// A position a worker sent, checked; 422 with the reason otherwise.
fn checked_position(position: Position) -> Result<Position, ApiError> {
    position
        .checked()
        .map_err(|e| ApiError::invalid(format!("position: {e}")))
}

/// Reads `near`'s `LATITUDE,LONGITUDE`; 400 unless it is two numbers, 422
/// unless they are a point.
pub(crate) fn near_point(near: &str, within_m: Option<u32>) -> Result<Near, ApiError> {
    let (lat, lon) = near
        .split_once(',')
        .and_then(|(lat, lon)| {
            Some((
                lat.trim().parse::<f64>().ok()?,
                lon.trim().parse::<f64>().ok()?,
            ))
        })
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid-query",
                "near must be LATITUDE,LONGITUDE in degrees",
            )
        })?;
    Position::new(lat, lon, 0.0).map_err(|e| ApiError::invalid(format!("near: {e}")))?;
    let within_m = within_m.unwrap_or(DEFAULT_WITHIN_M);
    if !(1..=MAX_NEARBY_M).contains(&within_m) {
        return Err(ApiError::invalid(format!(
            "within_m must be from 1 to {MAX_NEARBY_M}"
        )));
    }
    Ok(Near {
        latitude: lat,
        longitude: lon,
        within_m: f64::from(within_m),
    })
}

/// Where a nearby listing resumes: in the tasks with a place (`d`, after a
/// distance and an id) or in those without (`u`, after a creation time and
/// an id).
pub(crate) enum NearbyCursor {
    Located(NearCursor),
    Unlocated(meatspace_store::OpenTasksCursor),
}

impl NearbyCursor {
    fn encode(&self) -> String {
        match self {
            NearbyCursor::Located(c) => format!("d{}.{}", c.distance_m, c.id.simple()),
            NearbyCursor::Unlocated(c) => {
                format!("u{}.{}", c.created_at.timestamp_millis(), c.id.simple())
            }
        }
    }

    fn decode(s: &str) -> Result<Self, ApiError> {
        let invalid = || ApiError::bad_request("invalid-query", "cursor is not valid");
        if let Some(rest) = s.strip_prefix('d') {
            let (d, id) = rest.rsplit_once('.').ok_or_else(invalid)?;
            let distance_m: f64 = d.parse().map_err(|_| invalid())?;
            if !distance_m.is_finite() || distance_m < 0.0 {
                return Err(invalid());
            }
            let id = Uuid::try_parse(id).map_err(|_| invalid())?;
            return Ok(NearbyCursor::Located(NearCursor { distance_m, id }));
        }
        let rest = s.strip_prefix('u').ok_or_else(invalid)?;
        super::decode_task_cursor(rest).map(NearbyCursor::Unlocated)
    }
}

/// The nearby listing: the open tasks with a place within reach, nearest
/// first, then those without a place, oldest first.
pub(crate) async fn nearby_page(
    state: &AppState,
    near: Near,
    cursor: Option<NearbyCursor>,
    limit: u32,
) -> Result<OpenTaskPage, ApiError> {
    let mut tasks = Vec::new();
    let unlocated_after = match cursor {
        Some(NearbyCursor::Unlocated(c)) => Some(c),
        located => {
            let after = match located {
                Some(NearbyCursor::Located(c)) => Some(c),
                _ => None,
            };
            let found = state.store.open_tasks_near(near, after, limit + 1).await?;
            if found.len() > limit as usize {
                let last = &found[limit as usize - 1];
                let next = NearbyCursor::Located(NearCursor {
                    distance_m: last.1,
                    id: last.0.id,
                });
                tasks.extend(found.into_iter().take(limit as usize).map(located_task));
                return Ok(OpenTaskPage {
                    tasks,
                    next_cursor: Some(next.encode()),
                });
            }
            tasks.extend(found.into_iter().map(located_task));
            None
        }
    };
    let room = limit - tasks.len() as u32;
    let mut unlocated = state
        .store
        .open_unlocated_tasks(unlocated_after, room + 1)
        .await?;
    let more = unlocated.len() > room as usize;
    unlocated.truncate(room as usize);
    let next_cursor = match (more, unlocated.last(), tasks.last()) {
        (true, Some(last), _) => Some(
            NearbyCursor::Unlocated(meatspace_store::OpenTasksCursor {
                created_at: last.created_at,
                id: last.id,
            })
            .encode(),
        ),
        // A full page of tasks with a place and one without next: resume
        // at the start of those without.
        (true, None, Some(_)) => Some(
            NearbyCursor::Unlocated(meatspace_store::OpenTasksCursor {
                created_at: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
                id: Uuid::nil(),
            })
            .encode(),
        ),
        _ => None,
    };
    tasks.extend(unlocated.into_iter().map(|task| ListedTask {
        task,
        distance_m: None,
    }));
    Ok(OpenTaskPage { tasks, next_cursor })
}

fn located_task((task, distance_m): (Task, f64)) -> ListedTask {
    ListedTask {
        task,
        // To the decimetre, as events record it.
        distance_m: Some((distance_m * 10.0).round() / 10.0),
    }
}

/// Open tasks, oldest first; with `near`, those with a place nearest first
/// (with their distance), then those without a place.
#[utoipa::path(get, path = "/api/v1/worker/tasks", tag = "worker",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of open tasks", body = OpenTaskPage),
        NearbyListErrors))]
async fn list_open_tasks(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    Query(q): Query<ListQuery>,
) -> Result<axum::Json<OpenTaskPage>, ApiError> {
    let limit = super::page_limit(q.limit, 50, 100)?;
    let eligible = Eligibility::of(&state, worker);
    if let Some(near) = q.near.as_deref() {
        let near = near_point(near, q.within_m)?;
        let cursor = q.cursor.as_deref().map(NearbyCursor::decode).transpose()?;
        let mut page = nearby_page(&state, near, cursor, limit).await?;
        page.tasks = eligible.keep(&state, page.tasks, |l| &l.task).await?;
        return Ok(axum::Json(page));
    }
    if q.within_m.is_some() {
        return Err(ApiError::invalid("within_m needs near"));
    }
    let cursor = q
        .cursor
        .as_deref()
        .map(super::decode_task_cursor)
        .transpose()?;
    let tasks = state.store.open_tasks(cursor, limit + 1).await?;
    let (tasks, next_cursor) = super::page(tasks, limit, super::encode_task_cursor);
    let tasks = eligible
        .keep(&state, tasks, |t| t)
        .await?
        .into_iter()
        .map(|task| ListedTask {
            task,
            distance_m: None,
        })
        .collect();
    Ok(axum::Json(OpenTaskPage { tasks, next_cursor }))
}

/// Loads a task the worker may see: open and for it ([`Eligibility`]), or
/// assigned to this worker.
pub(crate) async fn visible_task(
    state: &AppState,
    worker: Uuid,
    id: Uuid,
) -> Result<Task, ApiError> {
    let task = state
        .store
        .task(id)
        .await?
        .ok_or_else(ApiError::task_not_found)?;
    let open_to_it = task.state == TaskState::Open
        && Eligibility::of(state, worker).admits(state, &task).await?;
    if open_to_it || task.worker_id == Some(worker) {
        Ok(task)
    } else {
        Err(ApiError::task_not_found())
    }
}

/// One task: open, or assigned to this worker.
#[utoipa::path(get, path = "/api/v1/worker/tasks/{task_id}", tag = "worker",
    operation_id = "worker_get_task",
    responses(
        (status = 200, description = "The task", body = Task), TaskReadErrors))]
async fn get_task(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
) -> Result<axum::Json<Task>, ApiError> {
    Ok(axum::Json(visible_task(&state, worker, id).await?))
}

/// Claims an open task: open → assigned. Exactly one of several racing
/// workers wins; for the others the task is no longer open, and a task that
/// is neither open nor theirs does not exist for them (404), like every
/// other task that is not theirs. Claiming a task already theirs is a 409.
#[utoipa::path(post, path = "/api/v1/worker/tasks/{task_id}/claim", tag = "worker",
    responses(
        (status = 200, description = "The task, now assigned to the caller", body = TaskChange), TaskCommandErrors))]
async fn claim(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
) -> Result<axum::Json<TaskChange>, ApiError> {
    claim_task(&state, worker, id).await.map(axum::Json)
}

/// The claim of [`claim`], shared with the web app. The claim is tried
/// first (most claims succeed: one statement); only a refused claim reads
/// the task, to tell the worker no more than it may know.
pub(crate) async fn claim_task(
    state: &AppState,
    worker: Uuid,
    id: Uuid,
) -> Result<TaskChange, ApiError> {
    // A task the worker may not take does not exist for it. Checked before
    // the claim: requirements never change, and a block or a qualification
    // lost between the check and the claim is a race the later one wins.
    if let Some(task) = state.store.task(id).await?
        && task.state == TaskState::Open
        && !Eligibility::of(state, worker).admits(state, &task).await?
    {
        return Err(no_open_task());
    }
    let refusal = match state
        .store
        .apply(id, Command::Claim { worker }, state.clock.now())
        .await
    {
        Ok(applied) => return Ok(super::task_change(applied)),
        Err(StoreError::Refused(refusal)) => refusal,
        Err(e) => return Err(e.into()),
    };
    let task = state
        .store
        .task(id)
        .await?
        .ok_or_else(ApiError::task_not_found)?;
    let mine = task.worker_id == Some(worker);
    // Drafts are the agent's business, and a task another worker holds (or
    // held) is theirs: neither exists for this worker. A claim that lost
    // the race to another worker (or to the task's end) gets the same
    // answer, as if it had come later. Only a task that is still open, or
    // is this worker's, says why the claim was refused.
    let taken = matches!(
        refusal,
        Refusal::WrongState { .. } | Refusal::Terminal { .. }
    );
    if !mine && (task.state != TaskState::Open || taken) {
        return Err(no_open_task());
    }
    Err(refusal.into())
}

fn no_open_task() -> ApiError {
    ApiError::NotFound(
        "no open task with this id: another worker may have claimed it, or it ended".into(),
    )
}

/// Starts the assigned task: assigned → active. The optional body carries
/// the device's position, which a task whose `presence` is `require`
/// needs (refused with `position-required` or `off-site` otherwise).
#[utoipa::path(post, path = "/api/v1/worker/tasks/{task_id}/start", tag = "worker",
    request_body(content = Option<StartWork>, description = "optional position"),
    responses(
        (status = 200, description = "The active task", body = TaskChange), TaskBodyCommandErrors))]
async fn start(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    OptionalJson(req): OptionalJson<StartWork>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let position = req.position.map(checked_position).transpose()?;
    state.act(id, Command::Start { worker, position }).await
}

/// Sends a text message to the agent (a `worker.message` event).
#[utoipa::path(post, path = "/api/v1/worker/tasks/{task_id}/messages", tag = "worker",
    request_body = Message,
    responses(
        (status = 200, description = "The task and the message's event", body = TaskChange), TaskBodyCommandErrors))]
async fn send_message(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    Json(req): Json<Message>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let text = checked_text("text", &req.text, MAX_TEXT_CHARS)?;
    state.act(id, Command::Message { worker, text }).await
}

/// Sends a photo: the body is a JPEG, PNG or WebP image with the matching
/// `Content-Type`. It is decoded, checked and re-encoded without metadata.
#[utoipa::path(post, path = "/api/v1/worker/tasks/{task_id}/photos", tag = "worker",
    params(PhotoQuery),
    request_body(description = "The image",
        content((ImageBytes = "image/jpeg"), (ImageBytes = "image/png"), (ImageBytes = "image/webp"))),
    responses(
        (status = 200, description = "The task and the photo's event", body = TaskChange), TaskBodyCommandErrors))]
async fn send_photo(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    Query(at): Query<PhotoQuery>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let position = at.position()?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        });
    if !content_type
        .as_deref()
        .is_some_and(|t| ACCEPTED_TYPES.contains(&t))
    {
        return Err(ApiError::UnsupportedMediaType(format!(
            "send the photo as one of {}",
            ACCEPTED_TYPES.join(", ")
        )));
    }
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(format!(
                "photos are limited to {} bytes",
                state.photo_limits.max_bytes
            ))
        } else {
            ApiError::bad_request("unreadable-body", e.body_text())
        }
    })?;
    send_photo_bytes(&state, worker, id, body, position)
        .await
        .map(axum::Json)
}

/// Checks, cleans and stores a photo of the worker's task: the photo path
/// of [`send_photo`], shared with the web app's upload form.
pub(crate) async fn send_photo_bytes(
    state: &AppState,
    worker: Uuid,
    id: Uuid,
    body: Bytes,
    position: Option<Position>,
) -> Result<TaskChange, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid("the photo body is empty"));
    }
    // Fail fast on the assignment before spending CPU on decoding.
    let task = state
        .store
        .task(id)
        .await?
        .ok_or_else(ApiError::task_not_found)?;
    if task.worker_id != Some(worker) {
        return Err(ApiError::task_not_found());
    }
    // The per-task cap is checked before decoding (a full task costs no
    // CPU) and again with the re-encoded size. Two uploads at once may
    // both pass the first check; the second check still holds each of
    // them to the cap, so a task ends at most one photo over it.
    let stored = state.store.photo_bytes(id).await?;
    let cap = state.photo_limits.max_task_bytes;
    let quota = || {
        ApiError::PhotoQuota(format!(
            "this task already holds {stored} bytes of photos; the limit is {cap} bytes per task"
        ))
    };
    if stored >= cap {
        return Err(quota());
    }
    let clean = photo::clean(body, &state.photo_limits)
        .await
        .map_err(|e| match e {
            PhotoError::UnsupportedFormat => ApiError::UnsupportedMediaType(e.to_string()),
            PhotoError::Encode(_) => ApiError::Internal(e.into()),
            PhotoError::TooLargeToDecode(_) | PhotoError::StoredTooLarge(_) => {
                ApiError::TooLarge(e.to_string())
            }
            _ => ApiError::invalid(e.to_string()),
        })?;
    if stored + clean.bytes.len() as u64 > cap {
        return Err(quota());
    }
    let photo = NewPhoto {
        id: Uuid::new_v4(),
        content_type: clean.content_type.to_owned(),
        width: clean.width,
        height: clean.height,
        bytes: clean.bytes,
    };
    let applied = state
        .store
        .apply(
            id,
            Command::Photo {
                worker,
                photo,
                position,
            },
            state.clock.now(),
        )
        .await?;
    Ok(super::task_change(applied))
}

/// Raises a typed issue for the agent (a `worker.issue` event; its id is
/// the issue id the agent answers).
#[utoipa::path(post, path = "/api/v1/worker/tasks/{task_id}/issues", tag = "worker",
    request_body = RaiseIssue,
    responses(
        (status = 200, description = "The task and the issue's event", body = TaskChange), TaskBodyCommandErrors))]
async fn raise_issue(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    Json(req): Json<RaiseIssue>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let text = checked_text("text", &req.text, MAX_TEXT_CHARS)?;
    state
        .act(
            id,
            Command::RaiseIssue {
                worker,
                kind: req.kind,
                text,
            },
        )
        .await
}

/// The optional `text` and `result` of a complete or stop request. The
/// body itself is optional: empty means neither.
fn end_work(req: EndWork) -> Result<(Option<String>, Option<serde_json::Value>), ApiError> {
    let text = checked_optional_text("text", req.text.as_deref(), MAX_TEXT_CHARS)?;
    Ok((text, req.result))
}

/// Completes the active task: active → completed, or, for a task created
/// with `review`, submits the work for the agent's review (`task.submitted`;
/// the task stays active). A task with a `result_schema` needs `result`,
/// checked against it (422 with each error at its JSON pointer).
#[utoipa::path(post, path = "/api/v1/worker/tasks/{task_id}/complete", tag = "worker",
    request_body(content = Option<EndWork>, description = "optional note"),
    responses(
        (status = 200, description = "The completed task and the event of the change", body = TaskChange), TaskBodyCommandErrors))]
async fn complete(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    OptionalJson(req): OptionalJson<EndWork>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let (note, result) = end_work(req)?;
    state.complete(id, worker, note, result).await
}

/// Stops the task: assigned or active → stopped. Always allowed to the
/// assigned worker; it ends the agent's obligation.
#[utoipa::path(post, path = "/api/v1/worker/tasks/{task_id}/stop", tag = "worker",
    request_body(content = Option<EndWork>, description = "optional reason"),
    responses(
        (status = 200, description = "The stopped task and the event of the change", body = TaskChange), TaskBodyCommandErrors))]
async fn stop(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    OptionalJson(req): OptionalJson<EndWork>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let (reason, result) = end_work(req)?;
    if result.is_some() {
        return Err(ApiError::invalid(
            "a stop takes no result: complete the task to send one",
        ));
    }
    state.act(id, Command::Stop { worker, reason }).await
}

/// The task's event feed, for the assigned worker, from the task's last
/// reopening on (a previous worker's messages and answers are not shown).
/// With `wait`, a page that would be empty waits for the next event (long
/// poll).
#[utoipa::path(get, path = "/api/v1/worker/tasks/{task_id}/events", tag = "worker",
    operation_id = "worker_task_events",
    params(EventsQuery),
    responses(
        (status = 200, description = "A page of the task's events", body = EventPage), TaskFeedErrors))]
async fn task_events(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    TaskId(id): TaskId,
    ClientAddress(address): ClientAddress,
    Query(q): Query<EventsQuery>,
) -> Result<FeedAnswer, ApiError> {
    let view = super::events::worker_view(state.store.as_ref(), worker, id).await?;
    // A long poll takes one of the worker's capped places.
    let slot = if q.wait.unwrap_or(0) > 0 {
        let principal = crate::auth::Principal::Worker(worker);
        Some(state.rate_limit.streams().open(principal, address)?)
    } else {
        None
    };
    open_feed(&state, id, &q, view.floor(), Reader::Worker(worker))
        .await
        .map(|answer| answer.holding(slot))
}
