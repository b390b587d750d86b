//! The agent API: create, list, publish, read, follow the event feed,
//! answer worker issues, cancel, fetch photos. Creating and listing take an
//! API key (or the development key); everything on one task is authorised
//! by the task's own agent token or by a key of the principal that owns it.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use meatspace_api_types::{
    CreateTask, CreatedTask, Extend, Place, Respond, ReviewAnswer, TaskPage, TaskResource,
};
use meatspace_domain::webhook_url::check_url;
use meatspace_domain::{Command, Extension, MAX_DESCRIPTION_CHARS, MAX_TEXT_CHARS};
use meatspace_domain::{Location, Presence};
use meatspace_store::NewTask;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::events::{EventsQuery, FeedAnswer, agent_event_feed};
use super::{EventPage, TaskChange, checked_optional_text, checked_text};
use crate::AppState;
use crate::auth::{AgentAuth, AgentCredential, Caller, issue_agent_token};
use crate::http::error::ApiError;
use crate::http::error::responses::{
    AdminListErrors, ScopedCreateErrors, TaskBodyCommandErrors, TaskCommandErrors, TaskFeedErrors,
    TaskReadErrors,
};
use crate::http::extract::{Json, Path, Query};
use crate::http::rate_limit::ClientAddress;
use crate::photo::ImageBytes;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_task, list_tasks))
        .routes(routes!(get_task))
        .routes(routes!(publish_task))
        .routes(routes!(cancel_task))
        .routes(routes!(extend_task))
        .routes(routes!(task_events))
        .routes(routes!(respond_to_issue))
        .routes(routes!(review_submission))
        .routes(routes!(get_photo))
}

// Schema attributes take literals only: these keep them equal to the limits.
const _: () = assert!(MAX_DESCRIPTION_CHARS == 4000 && MAX_TEXT_CHARS == 4000);

/// Creates a task in the draft state.
#[utoipa::path(post, path = "/api/v1/tasks", tag = "agent",
    request_body = CreateTask,
    security(("api_key" = ["tasks"]), ("dev_key" = [])),
    responses(
        (status = 201, description = "The task, in the draft state, and its agent token; \
            it belongs to the caller's principal",
            body = CreatedTask,
            headers(("Location" = String, description = "The task's URL"))), ScopedCreateErrors))]
async fn create_task(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<CreateTask>,
) -> Result<Response, ApiError> {
    caller.require(meatspace_domain::identity::Scope::Tasks)?;
    let created = create(&state, req, caller.principal).await?;
    let location = HeaderValue::from_str(&format!("/api/v1/tasks/{}", created.task.id))
        .map_err(|e| ApiError::Internal(e.into()))?;
    let mut res = (StatusCode::CREATED, axum::Json(created)).into_response();
    res.headers_mut().insert(header::LOCATION, location);
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// Creates a draft task from a checked request, owned by `owner` (the
/// caller has shown a key of it that may create tasks). Shared by the HTTP
/// handler and the MCP tools.
pub(crate) async fn create(
    state: &AppState,
    req: CreateTask,
    owner: Uuid,
) -> Result<CreatedTask, ApiError> {
    let description = checked_text("description", &req.description, MAX_DESCRIPTION_CHARS)?;
    let lifetime = state
        .policy
        .lifetime(req.expires_in_seconds)
        .map_err(|(min, max)| {
            ApiError::invalid(format!(
                "expires_in_seconds must be between {min} and {max}"
            ))
        })?;
    // Refused before anything is written and without contacting the URL
    // (an IP literal is checked as is; a name is only resolved).
    let webhook_url = match req.webhook_url.as_deref() {
        None => None,
        Some(raw) => Some(
            check_url(raw, &state.integrations.webhook_allow, resolve)
                .await
                .map_err(|e| ApiError::invalid(e.to_string()))?
                .to_string(),
        ),
    };
    let (location, presence) = checked_place(req.location, req.presence)?;
    let result_schema = super::results::checked_schema(req.result_schema)?;
    let review = super::results::checked_review(req.review)?;
    meatspace_domain::qualification::check_requirements(&req.requirements)
        .map_err(ApiError::invalid)?;
    let now = state.clock.now();
    let id = Uuid::new_v4();
    let (agent_token, agent_token_hash) = issue_agent_token(id);
    let new = NewTask {
        id,
        description,
        agent_token_hash,
        created_at: now,
        expires_at: now + lifetime,
        owner_id: owner,
        location,
        presence,
        result_schema,
        review,
        requirements: req.requirements,
    };
    let digest = new.agent_token_hash.clone();
    let (task, webhook_secret) = match webhook_url {
        None => (state.store.create_task(new).await?, None),
        Some(url) => (
            state.store.create_task_with_webhook(new, &url).await?,
            Some(state.integrations.server_key.webhook_secret(id)),
        ),
    };
    // Committed: the agent's first request (its publish) need not read it.
    state.agent_digests.remember(id, digest);
    state.credentials.owners.remember(id, owner);
    Ok(CreatedTask {
        task,
        agent_token,
        webhook_secret,
    })
}

/// A task's place and presence rule as the agent gave them, checked; 422
/// with the reason otherwise.
pub(crate) fn checked_place(
    place: Option<Place>,
    presence: Option<Presence>,
) -> Result<(Option<Location>, Presence), ApiError> {
    let location = place
        .map(|p| Location::new(p.latitude, p.longitude, p.radius_m, p.address))
        .transpose()
        .map_err(|e| ApiError::invalid(format!("location: {e}")))?;
    if let Some(address) = location.as_ref().and_then(|l| l.address.as_deref()) {
        checked_text(
            "location.address",
            address,
            meatspace_domain::place::MAX_ADDRESS_CHARS,
        )?;
    }
    let presence = presence.unwrap_or_default();
    if presence != Presence::None && location.is_none() {
        return Err(ApiError::invalid(
            "presence needs a location: without a place there is nowhere to be",
        ));
    }
    Ok((location, presence))
}

/// `state`, `limit` and `cursor` of the task listing.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListTasksQuery {
    /// Only tasks in this state.
    pub state: Option<meatspace_domain::TaskState>,
    /// Largest page (1-200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// The tasks the caller's principal owns, newest first: how an agent that
/// lost its local state finds its work again. Never another principal's.
#[utoipa::path(get, path = "/api/v1/tasks", tag = "agent",
    params(ListTasksQuery),
    security(("api_key" = ["tasks"]), ("dev_key" = [])),
    responses((status = 200, description = "A page of the caller's tasks", body = TaskPage),
        AdminListErrors))]
async fn list_tasks(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ListTasksQuery>,
) -> Result<axum::Json<TaskPage>, ApiError> {
    caller.require(meatspace_domain::identity::Scope::Tasks)?;
    let limit = super::page_limit(q.limit, 50, 200)?;
    let cursor = q
        .cursor
        .as_deref()
        .map(super::decode_task_cursor)
        .transpose()?;
    let tasks = state
        .store
        .owned_tasks(caller.principal, q.state, cursor, limit + 1)
        .await?;
    let (tasks, next_cursor) = super::page(tasks, limit, super::encode_task_cursor);
    Ok(axum::Json(TaskPage { tasks, next_cursor }))
}

/// The task and its authoritative state.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}", tag = "agent",
    responses(
        (status = 200, description = "The task", body = TaskResource), TaskReadErrors))]
async fn get_task(
    State(state): State<AppState>,
    AgentAuth(id, _): AgentAuth,
) -> Result<axum::Json<TaskResource>, ApiError> {
    let task = state
        .store
        .task(id)
        .await?
        .ok_or_else(ApiError::task_not_found)?;
    let webhook = state.store.webhook(id).await?;
    Ok(axum::Json(TaskResource { task, webhook }))
}

/// Publishes a draft: draft → open. Workers can now see and claim it.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/publish", tag = "agent",
    responses(
        (status = 200, description = "The open task and the event of the change", body = TaskChange), TaskCommandErrors))]
async fn publish_task(
    State(state): State<AppState>,
    AgentAuth(id, by): AgentAuth,
) -> Result<axum::Json<TaskChange>, ApiError> {
    state.act_by(id, Command::Publish, by).await
}

/// Cancels a task that is not yet terminal.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/cancel", tag = "agent",
    responses(
        (status = 200, description = "The cancelled task and the event of the change", body = TaskChange), TaskCommandErrors))]
async fn cancel_task(
    State(state): State<AppState>,
    AgentAuth(id, by): AgentAuth,
    address: ClientAddress,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let command = Command::Cancel { reason: None };
    // An operator's key cancelling a task its principal does not own is a
    // privileged action: the audit trail records it, in the cancel's own
    // transaction. (A task's owner never changes.)
    if let meatspace_domain::identity::ActedBy::ApiKey { principal_id, .. } = by
        && state.store.task_owner(id).await? != Some(principal_id)
    {
        let entry = meatspace_store::NewAudit {
            at: state.clock.now(),
            principal_id,
            action: meatspace_domain::identity::AuditAction::TaskCancelledByOperator,
            target: format!("task:{id}"),
            address: Some(address.0.to_string()),
            detail: None,
        };
        let applied = state.store.apply_audited(id, command, by, entry).await?;
        return Ok(axum::Json(super::task_change(applied)));
    }
    state.act_by(id, command, by).await
}

/// Extends the task's lifetime (`expires_at`): later only, at most the
/// longest lifetime counted from creation. Appends a `task.extended` event.
/// The active time limit of a started task is not changed.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/extend", tag = "agent",
    operation_id = "extend_task",
    request_body = Extend,
    responses((status = 200, body = TaskChange), TaskBodyCommandErrors))]
async fn extend_task(
    State(state): State<AppState>,
    AgentAuth(id, by): AgentAuth,
    Json(req): Json<Extend>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let max = state.policy.max_lifetime.num_seconds();
    let extension = match (req.expires_at, req.add_seconds) {
        (Some(t), None) => Extension::Until(t),
        (None, Some(n)) if (1..=max).contains(&n) => Extension::By(chrono::TimeDelta::seconds(n)),
        (None, Some(_)) => {
            return Err(ApiError::invalid(format!(
                "add_seconds must be between 1 and {max}"
            )));
        }
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of expires_at and add_seconds",
            ));
        }
    };
    state.act_by(id, Command::Extend(extension), by).await
}

/// The task's events with `id > after`, ascending. With `wait`, a page
/// that would be empty waits for the next event (long poll).
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/events", tag = "agent",
    params(EventsQuery),
    responses(
        (status = 200, description = "A page of the task's events", body = EventPage), TaskFeedErrors))]
async fn task_events(
    State(state): State<AppState>,
    credential: AgentCredential,
    ClientAddress(address): ClientAddress,
    query: Result<Query<EventsQuery>, ApiError>,
) -> Result<FeedAnswer, ApiError> {
    let query = query.map(|Query(q)| q);
    // A long poll takes one of the client's capped places, once its token
    // is known to be genuine (a forged one cannot take the holder's).
    let slot = match &query {
        Ok(q) if q.wait.unwrap_or(0) > 0 => {
            crate::auth::authorize_agent_token(&state, credential.token(), credential.task_id)
                .await?;
            let principal = crate::auth::Principal::Agent(credential.task_id);
            Some(state.rate_limit.streams().open(principal, address)?)
        }
        _ => None,
    };
    agent_event_feed(&state, &credential, query)
        .await
        .map(|answer| answer.holding(slot))
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

/// Answers one worker issue (the `worker.issue` event `event_id`).
/// `cancel` also cancels the task.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/issues/{event_id}/respond", tag = "agent",
    params(("event_id" = i64, Path, description = "id of the worker.issue event")),
    request_body = Respond,
    responses(
        (status = 200, description = "The task and the events of the answer", body = TaskChange), TaskBodyCommandErrors))]
async fn respond_to_issue(
    State(state): State<AppState>,
    AgentAuth(id, by): AgentAuth,
    Path(IssuePath { event_id, .. }): Path<IssuePath>,
    Json(req): Json<Respond>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    // A missing text is the domain's to refuse, after it has checked the
    // task's state (a terminal task answers 409 whatever the body says).
    let text = checked_optional_text("text", req.text.as_deref(), MAX_TEXT_CHARS)?;
    state
        .act_by(
            id,
            Command::RespondToIssue {
                issue_event_id: event_id,
                action: req.action,
                text,
            },
            by,
        )
        .await
}

/// Answers the worker's submission of a task created with `review`:
/// `accept` completes the task with the submitted result, `revise` sends
/// the work back with `text` (at most `review.max_revisions` times),
/// `reject` cancels the task with `text` as the reason.
#[utoipa::path(post, path = "/api/v1/tasks/{task_id}/review", tag = "agent",
    request_body = ReviewAnswer,
    responses(
        (status = 200, description = "The task and the event of the answer", body = TaskChange), TaskBodyCommandErrors))]
async fn review_submission(
    State(state): State<AppState>,
    AgentAuth(id, by): AgentAuth,
    Json(req): Json<ReviewAnswer>,
) -> Result<axum::Json<TaskChange>, ApiError> {
    let verdict = super::results::verdict(req)?;
    state.act_by(id, Command::Review(verdict), by).await
}

/// A photo a worker sent, as re-encoded by the server.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/photos/{photo_id}", tag = "agent",
    responses(
        (status = 200, description = "The image, in the format it was sent in",
            content((ImageBytes = "image/jpeg"), (ImageBytes = "image/png"), (ImageBytes = "image/webp"))), TaskReadErrors))]
async fn get_photo(
    State(state): State<AppState>,
    AgentAuth(id, _): AgentAuth,
    Path(PhotoPath { photo_id, .. }): Path<PhotoPath>,
) -> Result<Response, ApiError> {
    photo_answer(&state, id, photo_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such photo on this task".into()))
}

/// A photo of a task as the answer that serves it: to the agent here, to
/// the console, and to the worker who sent it in the web app. `None` when
/// the task has no such photo.
pub(crate) async fn photo_answer(
    state: &AppState,
    task: Uuid,
    photo: Uuid,
) -> Result<Option<Response>, ApiError> {
    state
        .store
        .photo(task, photo)
        .await?
        .map(photo_response)
        .transpose()
}

fn photo_response(photo: meatspace_store::Photo) -> Result<Response, ApiError> {
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

/// Resolves a webhook URL's host name for [`check_url`]: a DNS query, never
/// a connection.
async fn resolve(name: String, port: u16) -> std::io::Result<Vec<std::net::IpAddr>> {
    Ok(tokio::net::lookup_host((name, port))
        .await?
        .map(|a| a.ip())
        .collect())
}
