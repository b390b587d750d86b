//! Workers: registering one with an API key (the app's invites are the
//! other way in, see [`super::invites`]), and for operators listing them,
//! suspending (which releases what the worker holds), reinstating and
//! rotating a worker's token.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use meatspace_api_types as api;
use meatspace_api_types::{RegisterWorker, RegisteredWorker};
use meatspace_domain::identity::AuditAction;
use meatspace_store::Worker;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::{PageQuery, checked_text, no_such, secret_answer};
use crate::AppState;
use crate::auth::{Actor, Caller, Operator, issue_worker_token};
use crate::http::error::ApiError;
use crate::http::error::responses::{AdminActionErrors, AdminListErrors, ScopedCreateErrors};
use crate::http::extract::{Json, OptionalJson, Path, Query};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register_worker, list_workers))
        .routes(routes!(suspend_worker))
        .routes(routes!(reinstate_worker))
        .routes(routes!(rotate_worker_token))
}

/// Longest worker name.
const MAX_NAME_CHARS: usize = 200;

// Schema attributes take literals only: this keeps them equal to the limit.
const _: () = assert!(MAX_NAME_CHARS == 200);

/// Registers a worker.
#[utoipa::path(post, path = "/api/v1/workers", tag = "worker",
    request_body = RegisterWorker,
    security(("api_key" = ["workers:register"]), ("dev_key" = [])),
    responses(
        (status = 201, description = "The worker and its token", body = RegisteredWorker),
        ScopedCreateErrors))]
async fn register_worker(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<RegisterWorker>,
) -> Result<Response, ApiError> {
    caller.require(meatspace_domain::identity::Scope::RegisterWorkers)?;
    let name = checked_text("name", &req.name, MAX_NAME_CHARS)?;
    let id = Uuid::new_v4();
    let (worker_token, hash) = issue_worker_token(id);
    let worker = state
        .store
        .create_worker(id, &name, hash, state.clock.now())
        .await?;
    Ok(secret_answer(
        StatusCode::CREATED,
        RegisteredWorker {
            worker,
            worker_token,
        },
    ))
}

/// Every worker, suspended ones included, ordered by id.
#[utoipa::path(get, path = "/api/v1/workers", tag = "operator", params(PageQuery),
    responses((status = 200, body = api::WorkerPage), AdminListErrors))]
pub(crate) async fn list_workers(
    Operator(op): Operator,
    Query(q): Query<PageQuery>,
) -> Result<axum::Json<api::WorkerPage>, ApiError> {
    let (workers, next_cursor) = q
        .read(|after, n| op.state.store.workers(after, n), |w| w.id)
        .await?;
    Ok(axum::Json(api::WorkerPage {
        workers,
        next_cursor,
    }))
}

/// Suspends a worker on every replica: its token and sessions are refused,
/// its sessions end, and the task it holds (assigned or active) reopens
/// for another worker (`task.unassigned`, reason `worker_suspended`).
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/suspend", tag = "operator",
    request_body(content = Option<api::Suspend>, description = "optional reason"),
    responses((status = 200, body = Worker), AdminActionErrors))]
async fn suspend_worker(
    Operator(op): Operator,
    Path(id): Path<Uuid>,
    OptionalJson(req): OptionalJson<api::Suspend>,
) -> Result<axum::Json<Worker>, ApiError> {
    let worker = suspend(&op, id, req.reason.as_deref()).await?;
    Ok(axum::Json(worker))
}

/// Suspends a worker (the API and the console): its sessions end and the
/// tasks it holds reopen, with the audit entry, in one transaction.
pub(crate) async fn suspend(
    op: &Actor,
    id: Uuid,
    reason: Option<&str>,
) -> Result<Worker, ApiError> {
    let reason = super::checked_optional_text("reason", reason, 1000)?;
    let audit = op.audit(
        AuditAction::WorkerSuspended,
        format!("worker:{id}"),
        reason.map(|r| serde_json::json!({ "reason": r })),
    );
    let worker = op
        .state
        .store
        .suspend_worker(id, audit)
        .await?
        .ok_or_else(|| no_such("worker"))?;
    op.state.credentials.workers.forget(id);
    Ok(worker)
}

/// Lifts a worker's suspension.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/reinstate", tag = "operator",
    responses((status = 200, body = Worker), AdminActionErrors))]
async fn reinstate_worker(
    Operator(op): Operator,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<Worker>, ApiError> {
    Ok(axum::Json(reinstate(&op, id).await?))
}

/// Lifts a worker's suspension (the API and the console), audited.
pub(crate) async fn reinstate(op: &Actor, id: Uuid) -> Result<Worker, ApiError> {
    let audit = op.audit(AuditAction::WorkerReinstated, format!("worker:{id}"), None);
    op.state
        .store
        .reinstate_worker(id, audit)
        .await?
        .ok_or_else(|| no_such("worker"))
}

/// Gives a worker a new token; the old one stops working at once.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/rotate", tag = "operator",
    responses((status = 200, body = api::RotatedWorker), AdminActionErrors))]
async fn rotate_worker_token(
    Operator(op): Operator,
    Path(id): Path<Uuid>,
) -> Result<Response, ApiError> {
    Ok(secret_answer(StatusCode::OK, rotate_token(&op, id).await?))
}

/// Gives a worker a new token (the API and the console), audited; the old
/// one stops working at once.
pub(crate) async fn rotate_token(op: &Actor, id: Uuid) -> Result<api::RotatedWorker, ApiError> {
    let (worker_token, hash) = issue_worker_token(id);
    let audit = op.audit(
        AuditAction::WorkerTokenRotated,
        format!("worker:{id}"),
        None,
    );
    let worker = op
        .state
        .store
        .rotate_worker_token(id, hash, audit)
        .await?
        .ok_or_else(|| no_such("worker"))?;
    op.state.credentials.workers.forget(id);
    Ok(api::RotatedWorker {
        worker,
        worker_token,
    })
}
