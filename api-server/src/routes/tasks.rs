//! The agent API: create, publish, read, follow the event feed, answer
//! worker issues, cancel, fetch photos. Everything but creation is
//! authorised by the task's own agent token.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use meatspace_core::store::NewTask;
use meatspace_core::{Command, IssueAction, MAX_DESCRIPTION_CHARS, MAX_TEXT_CHARS, Task, clock};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::{EventPage, EventsQuery, TaskChange, checked_optional_text, checked_text, event_feed};
use crate::AppState;
use crate::auth::{AgentAuth, DevKeyAuth, issue_agent_token};
use crate::error::{ApiError, Problem};
use crate::extract::{Json, Path, Query};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_task))
        .routes(routes!(get_task))
        .routes(routes!(publish_task))
        .routes(routes!(cancel_task))
        .routes(routes!(task_events))
        .routes(routes!(respond_to_issue))
        .routes(routes!(get_photo))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTaskRequest {
    /// What to do, in plain text (1-4000 characters).
    pub description: String,
    /// Lifetime of the task in seconds from now; bounds in the capabilities
    /// document. When it ends, a task that has not started expires.
    pub expires_in_seconds: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedTask {
    pub task: Task,
    /// Task-scoped bearer credential. Shown only now; store it securely.
    pub agent_token: String,
}

/// Creates a task in the draft state.
#[utoipa::path(post, path = "/api/v1/tasks", tag = "agent",
    request_body = CreateTaskRequest,
    security(("dev_key" = [])),
    responses(
        (status = 201, body = CreatedTask),
        (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 413, body = Problem), (status = 415, body = Problem),
        (status = 422, body = Problem), (status = 503, body = Problem)))]
async fn create_task(
    State(state): State<AppState>,
    _auth: DevKeyAuth,
    Json(req): Json<CreateTaskRequest>,
) -> Result<Response, ApiError> {
    let created = create(&state, req).await?;
    let location = HeaderValue::from_str(&format!("/api/v1/tasks/{}", created.task.id))
        .map_err(|e| ApiError::Internal(e.into()))?;
    let mut res = (StatusCode::CREATED, axum::Json(created)).into_response();
    res.headers_mut().insert(header::LOCATION, location);
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// Creates a draft task from a checked request; the caller has shown the
/// development key. Shared by the HTTP handler and the MCP tools.
pub(crate) async fn create(
    state: &AppState,
    req: CreateTaskRequest,
) -> Result<CreatedTask, ApiError> {
    let description = checked_text("description", &req.description, MAX_DESCRIPTION_CHARS)?;
    let policy = &state.policy;
    let lifetime = match req.expires_in_seconds {
        None => policy.default_lifetime,
        Some(s) => {
            let (min, max) = (
                policy.min_lifetime.num_seconds(),
                policy.max_lifetime.num_seconds(),
            );
            if !(min..=max).contains(&s) {
                return Err(ApiError::invalid(format!(
                    "expires_in_seconds must be between {min} and {max}"
                )));
            }
            chrono::TimeDelta::seconds(s)
        }
    };
    let now = clock::now();
    let id = Uuid::new_v4();
    let (agent_token, agent_token_hash) = issue_agent_token(id);
    let task = state
        .store
        .create_task(NewTask {
            id,
            description,
            agent_token_hash,
            created_at: now,
            expires_at: now + lifetime,
        })
        .await?;
    Ok(CreatedTask { task, agent_token })
}

/// The task and its authoritative state.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}", tag = "agent",
    params(("task_id" = Uuid, Path)),
    security(("agent_token" = [])),
    responses((status = 200, body = Task), (status = 401, body = Problem), (status = 404, body = Problem)))]
async fn get_task(
    State(state): State<AppState>,
    AgentAuth(id): AgentAuth,
) -> Result<axum::Json<Task>, ApiError> {
    let task = state
        .store
        .task(id)
        .await?
        .ok_or_else(ApiError::task_not_found)?;
    Ok(axum::Json(task))
}

/// Publishes a draft: draft → open. Workers can now see and claim it.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/publish", tag = "agent",
    params(("task_id" = Uuid, Path)),
    security(("agent_token" = [])),
    responses((status = 200, body = TaskChange), (status = 401, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn publish_task(
    State(state): State<AppState>,
    AgentAuth(id): AgentAuth,
) -> Result<axum::Json<TaskChange>, ApiError> {
    state.act(id, Command::Publish).await
}

/// Cancels a task that is not yet terminal.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/cancel", tag = "agent",
    params(("task_id" = Uuid, Path)),
    security(("agent_token" = [])),
    responses((status = 200, body = TaskChange), (status = 401, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn cancel_task(
    State(state): State<AppState>,
    AgentAuth(id): AgentAuth,
) -> Result<axum::Json<TaskChange>, ApiError> {
    state.act(id, Command::Cancel { reason: None }).await
}

/// The task's events with `id > after`, ascending. With `wait`, a page
/// that would be empty waits for the next event (long poll).
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/events", tag = "agent",
    params(("task_id" = Uuid, Path), EventsQuery),
    security(("agent_token" = [])),
    responses((status = 200, body = EventPage), (status = 400, body = Problem),
        (status = 401, body = Problem), (status = 404, body = Problem)))]
async fn task_events(
    State(state): State<AppState>,
    AgentAuth(id): AgentAuth,
    Query(q): Query<EventsQuery>,
) -> Result<axum::Json<EventPage>, ApiError> {
    Ok(axum::Json(event_feed(&state, id, &q, 0, |_| true).await?))
}

#[derive(Debug, Deserialize)]
struct IssuePath {
    #[allow(dead_code)] // checked by AgentAuth
    task_id: Uuid,
    event_id: i64,
}

#[derive(Debug, Deserialize)]
struct PhotoPath {
    #[allow(dead_code)] // checked by AgentAuth
    task_id: Uuid,
    photo_id: Uuid,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RespondRequest {
    pub action: IssueAction,
    /// Required for clarify and acknowledge; optional for cancel.
    pub text: Option<String>,
}

/// Answers one worker issue (the `worker.issue` event `event_id`).
/// `cancel` also cancels the task.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/issues/{event_id}/respond", tag = "agent",
    params(("task_id" = Uuid, Path), ("event_id" = i64, Path, description = "id of the worker.issue event")),
    request_body = RespondRequest,
    security(("agent_token" = [])),
    responses((status = 200, body = TaskChange), (status = 400, body = Problem),
        (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn respond_to_issue(
    State(state): State<AppState>,
    AgentAuth(id): AgentAuth,
    Path(IssuePath { event_id, .. }): Path<IssuePath>,
    Json(req): Json<RespondRequest>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    // A missing text is the domain's to refuse, after it has checked the
    // task's state (a terminal task answers 409 whatever the body says).
    let text = checked_optional_text("text", req.text.as_deref(), MAX_TEXT_CHARS)?;
    state
        .act(
            id,
            Command::RespondToIssue {
                issue_event_id: event_id,
                action: req.action,
                text,
            },
        )
        .await
}

/// A photo a worker sent, as re-encoded by the server.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/photos/{photo_id}", tag = "agent",
    params(("task_id" = Uuid, Path), ("photo_id" = Uuid, Path)),
    security(("agent_token" = [])),
    responses((status = 200, description = "The image", content_type = "image/*", body = Vec<u8>),
        (status = 401, body = Problem), (status = 404, body = Problem)))]
async fn get_photo(
    State(state): State<AppState>,
    AgentAuth(id): AgentAuth,
    Path(PhotoPath { photo_id, .. }): Path<PhotoPath>,
) -> Result<Response, ApiError> {
    let photo = state
        .store
        .photo(id, photo_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such photo on this task".into()))?;
    let content_type =
        HeaderValue::from_str(&photo.content_type).map_err(|e| ApiError::Internal(e.into()))?;
    Ok((
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, max-age=86400, immutable"),
            ),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("inline"),
            ),
        ],
        photo.bytes,
    )
        .into_response())
}
