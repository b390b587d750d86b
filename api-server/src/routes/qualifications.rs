//! Qualifications and blocks: operators grant and revoke workers'
//! qualifications, workers read their own, and an agent's principal
//! blocks workers from all of its tasks. Every grant, revocation, block and
//! unblock is audited. What they decide is in [`super::eligibility`].

use axum::extract::State;
use meatspace_api_types::{Block, BlockList, Grant, QualificationList};
use meatspace_domain::identity::{AuditAction, Scope};
use meatspace_domain::qualification::{Qualification, check_name, check_value};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::no_such;
use crate::AppState;
use crate::auth::{Actor, Operator, WorkerAuth};
use crate::http::error::ApiError;
use crate::http::error::responses::{AdminActionErrors, AdminListErrors, TaskReadErrors};
use crate::http::extract::{OptionalJson, Path};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_qualifications))
        .routes(routes!(grant, revoke))
        .routes(routes!(own_qualifications))
        .routes(routes!(list_blocks))
        .routes(routes!(block, unblock))
}

#[derive(Debug, Deserialize)]
struct QualificationPath {
    worker_id: Uuid,
    name: String,
}

/// A worker's qualifications, lapsed ones included.
#[utoipa::path(get, path = "/api/v1/workers/{worker_id}/qualifications", tag = "operator",
    responses((status = 200, body = QualificationList), AdminActionErrors))]
async fn list_qualifications(
    Operator(op): Operator,
    Path(worker_id): Path<Uuid>,
) -> Result<axum::Json<QualificationList>, ApiError> {
    op.state
        .store
        .worker(worker_id)
        .await?
        .ok_or_else(|| no_such("worker"))?;
    let qualifications = op.state.store.qualifications(worker_id).await?;
    Ok(axum::Json(QualificationList {
        worker_id,
        qualifications,
    }))
}

/// Grants a worker a qualification (or replaces its value and expiry).
#[utoipa::path(put, path = "/api/v1/workers/{worker_id}/qualifications/{name}", tag = "operator",
    params(("name" = String, Path,
        description = "lowercase letters, digits and : . _ - (1-100 characters)")),
    request_body(content = Option<Grant>, description = "optional value and expiry"),
    responses((status = 200, description = "The grant", body = Qualification), AdminActionErrors))]
async fn grant(
    Operator(op): Operator,
    Path(QualificationPath { worker_id, name }): Path<QualificationPath>,
    OptionalJson(req): OptionalJson<Grant>,
) -> Result<axum::Json<Qualification>, ApiError> {
    Ok(axum::Json(grant_to(&op, worker_id, name, req).await?))
}

/// Grants `worker_id` the qualification `name` (the API and the console),
/// checked and audited.
pub(crate) async fn grant_to(
    op: &Actor,
    worker_id: Uuid,
    name: String,
    req: Grant,
) -> Result<Qualification, ApiError> {
    check_name(&name).map_err(ApiError::invalid)?;
    if let Some(value) = &req.value {
        check_value(value).map_err(ApiError::invalid)?;
    }
    let now = op.state.clock.now();
    if req.expires_at.is_some_and(|e| e <= now) {
        return Err(ApiError::invalid("expires_at is in the past"));
    }
    let qualification = Qualification {
        name,
        value: req.value,
        granted_at: now,
        expires_at: req.expires_at,
    };
    let audit = op.audit(
        AuditAction::WorkerQualified,
        format!("worker:{worker_id}"),
        Some(serde_json::to_value(&qualification).map_err(|e| ApiError::Internal(e.into()))?),
    );
    if !op
        .state
        .store
        .grant_qualification(worker_id, &qualification, audit)
        .await?
    {
        return Err(no_such("worker"));
    }
    Ok(qualification)
}

/// Revokes a worker's qualification. A task it holds stays its own.
#[utoipa::path(delete, path = "/api/v1/workers/{worker_id}/qualifications/{name}", tag = "operator",
    params(("name" = String, Path)),
    responses((status = 200, description = "The worker's qualifications now", body = QualificationList),
        AdminActionErrors))]
async fn revoke(
    Operator(op): Operator,
    Path(QualificationPath { worker_id, name }): Path<QualificationPath>,
) -> Result<axum::Json<QualificationList>, ApiError> {
    revoke_from(&op, worker_id, &name).await?;
    let qualifications = op.state.store.qualifications(worker_id).await?;
    Ok(axum::Json(QualificationList {
        worker_id,
        qualifications,
    }))
}

/// The calling worker's own qualifications.
#[utoipa::path(get, path = "/api/v1/worker/qualifications", tag = "worker",
    responses((status = 200, body = QualificationList), TaskReadErrors))]
async fn own_qualifications(
    State(state): State<AppState>,
    WorkerAuth(worker_id): WorkerAuth,
) -> Result<axum::Json<QualificationList>, ApiError> {
    let qualifications = state.store.qualifications(worker_id).await?;
    Ok(axum::Json(QualificationList {
        worker_id,
        qualifications,
    }))
}

/// The workers the caller's principal has blocked from its tasks.
#[utoipa::path(get, path = "/api/v1/blocks", tag = "agent",
    security(("api_key" = ["tasks"]), ("dev_key" = [])),
    responses((status = 200, body = BlockList), AdminListErrors))]
async fn list_blocks(actor: Actor) -> Result<axum::Json<BlockList>, ApiError> {
    actor.caller.require(Scope::Tasks)?;
    block_list(&actor.state, actor.caller.principal).await
}

async fn block_list(state: &AppState, principal: Uuid) -> Result<axum::Json<BlockList>, ApiError> {
    let blocks = state
        .store
        .blocked_workers(principal)
        .await?
        .into_iter()
        .map(|(worker_id, blocked_at)| Block {
            worker_id,
            blocked_at,
        })
        .collect();
    Ok(axum::Json(BlockList { blocks }))
}

/// Blocks a worker from every task of the caller's principal: it no longer
/// sees them or can claim them. A task it holds stays its own.
#[utoipa::path(put, path = "/api/v1/blocks/{worker_id}", tag = "agent",
    security(("api_key" = ["tasks"]), ("dev_key" = [])),
    responses((status = 200, description = "The principal's blocks now", body = BlockList),
        AdminActionErrors))]
async fn block(
    actor: Actor,
    Path(worker_id): Path<Uuid>,
) -> Result<axum::Json<BlockList>, ApiError> {
    set_block(&actor, worker_id, true).await
}

/// Lifts a block.
#[utoipa::path(delete, path = "/api/v1/blocks/{worker_id}", tag = "agent",
    security(("api_key" = ["tasks"]), ("dev_key" = [])),
    responses((status = 200, description = "The principal's blocks now", body = BlockList),
        AdminActionErrors))]
async fn unblock(
    actor: Actor,
    Path(worker_id): Path<Uuid>,
) -> Result<axum::Json<BlockList>, ApiError> {
    set_block(&actor, worker_id, false).await
}

/// Blocks (`blocked`) or unblocks a worker for the caller's principal,
/// audited, and answers the principal's blocks as they are then.
async fn set_block(
    actor: &Actor,
    worker_id: Uuid,
    blocked: bool,
) -> Result<axum::Json<BlockList>, ApiError> {
    actor.caller.require(Scope::Tasks)?;
    let (action, missing) = match blocked {
        true => (AuditAction::WorkerBlocked, "worker"),
        false => (AuditAction::WorkerUnblocked, "block of this worker"),
    };
    let audit = actor.audit(action, format!("worker:{worker_id}"), None);
    let store = &actor.state.store;
    let done = match blocked {
        true => {
            store
                .block_worker(actor.caller.principal, worker_id, audit)
                .await?
        }
        false => {
            store
                .unblock_worker(actor.caller.principal, worker_id, audit)
                .await?
        }
    };
    if !done {
        return Err(no_such(missing));
    }
    block_list(&actor.state, actor.caller.principal).await
}

/// Revokes `worker_id`'s qualification `name` (the API and the console),
/// audited.
pub(crate) async fn revoke_from(op: &Actor, worker_id: Uuid, name: &str) -> Result<(), ApiError> {
    let audit = op.audit(
        AuditAction::WorkerUnqualified,
        format!("worker:{worker_id}"),
        Some(serde_json::json!({ "name": name })),
    );
    if !op
        .state
        .store
        .revoke_qualification(worker_id, name, audit)
        .await?
    {
        return Err(no_such("qualification of this worker"));
    }
    Ok(())
}
