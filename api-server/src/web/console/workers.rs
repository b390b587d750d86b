//! The console's workers: a list with a search of names, and a worker's
//! page with its tasks, its qualifications, its history in the audit
//! trail, and the operator's actions on it (suspend with a reason,
//! reinstate, a new token shown once, grant and revoke qualifications),
//! each the same code as the API's and audited as the signed-in operator.

use askama::Template;
use axum::Router;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use meatspace_api_types::Grant;
use meatspace_domain::identity::Worker;
use meatspace_domain::qualification::QualificationValue;
use meatspace_store::AuditFilter;
use serde::Deserialize;
use uuid::Uuid;

use super::audit::time;
use super::{Console, ConsoleForm, CsrfForm, Missing, Nav};
use crate::AppState;
use crate::http::error::ApiError;
use crate::routes::{qualifications, workers};
use crate::web::{AppError, html};

/// Workers on a page.
const PAGE: u32 = 50;
/// Tasks and history entries shown on a worker's page.
const SHOWN: u32 = 50;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/console/workers", get(list))
        .route("/console/workers/{worker_id}", get(page))
        .route("/console/workers/{worker_id}/suspend", post(suspend))
        .route("/console/workers/{worker_id}/reinstate", post(reinstate))
        .route("/console/workers/{worker_id}/rotate", post(rotate))
        .route("/console/workers/{worker_id}/qualifications", post(grant))
        .route(
            "/console/workers/{worker_id}/qualifications/{name}/revoke",
            post(revoke),
        )
}

const MISSING: Missing = Missing::new("No such worker", "There is no worker with this id.");

// ------------------------------------------------------------------- list

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListQuery {
    q: String,
    after: Option<Uuid>,
}

#[derive(Template)]
#[template(path = "console_workers.html")]
struct ListPage {
    nav: Option<Nav>,
    q: String,
    workers: Vec<Worker>,
    next: Option<String>,
}

async fn list(c: Console, Query(q): Query<ListQuery>) -> Result<Response, AppError> {
    let search: String = q.q.trim().chars().take(200).collect();
    let mut workers = c
        .state
        .store
        .console_workers((!search.is_empty()).then_some(&*search), q.after, PAGE + 1)
        .await?;
    let next = (workers.len() > PAGE as usize).then(|| {
        workers.truncate(PAGE as usize);
        let mut next = url::form_urlencoded::Serializer::new(String::new());
        if !search.is_empty() {
            next.append_pair("q", &search);
        }
        if let Some(last) = workers.last() {
            next.append_pair("after", &last.id.to_string());
        }
        next.finish()
    });
    Ok(html(&ListPage {
        nav: Some(Nav::of(&c)),
        q: search,
        workers,
        next,
    }))
}

// ------------------------------------------------------------------- one worker

struct TaskRow {
    id: Uuid,
    state: &'static str,
    description: String,
    updated: String,
}

struct QualificationRow {
    name: String,
    value: String,
    until: String,
    holds: bool,
}

struct HistoryRow {
    at: String,
    action: &'static str,
    principal: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "console_worker.html")]
struct WorkerPage {
    nav: Option<Nav>,
    csrf: String,
    worker: Worker,
    tasks: Vec<TaskRow>,
    qualifications: Vec<QualificationRow>,
    history: Vec<HistoryRow>,
    /// A token just issued: shown this once.
    new_token: Option<String>,
    error: Option<String>,
}

async fn worker_page(
    c: &Console,
    id: Uuid,
    new_token: Option<String>,
    error: Option<String>,
) -> Result<Response, AppError> {
    let worker = MISSING.found(c.state.store.worker(id).await?)?;
    let now = c.state.clock.now();
    let tasks = c.state.store.worker_tasks(id, SHOWN).await?;
    let qualifications = c.state.store.qualifications(id).await?;
    let history = c
        .state
        .store
        .audit(&AuditFilter {
            target: Some(format!("worker:{id}")),
            limit: SHOWN,
            ..AuditFilter::default()
        })
        .await?;
    let page = WorkerPage {
        nav: Some(Nav::of(c)),
        csrf: c.csrf.clone(),
        tasks: tasks
            .iter()
            .map(|t| TaskRow {
                id: t.id,
                state: t.state.as_str(),
                description: t.description.chars().take(120).collect(),
                updated: t.updated_at.to_rfc3339(),
            })
            .collect(),
        qualifications: qualifications
            .iter()
            .map(|q| QualificationRow {
                name: q.name.clone(),
                value: match &q.value {
                    Some(QualificationValue::Text(t)) => t.clone(),
                    Some(QualificationValue::Integer(n)) => n.to_string(),
                    None => String::new(),
                },
                until: q.expires_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                holds: q.holds(now),
            })
            .collect(),
        history: history
            .iter()
            .map(|e| HistoryRow {
                at: e.at.to_rfc3339(),
                action: e.action.as_str(),
                principal: e.principal.id.to_string(),
                detail: e.detail.as_ref().map(|d| d.to_string()).unwrap_or_default(),
            })
            .collect(),
        worker,
        new_token,
        error,
    };
    Ok(super::shown(
        &page,
        &page.error,
        StatusCode::UNPROCESSABLE_ENTITY,
    ))
}

async fn page(c: Console, Path(raw): Path<String>) -> Result<Response, AppError> {
    worker_page(&c, MISSING.id(&raw)?, None, None).await
}

/// Runs an operator's action on the worker the path names, then shows the
/// worker's page: again (after a redirect), with the token the action made
/// shown this once, or with the action's refusal in words.
async fn act(
    c: &Console,
    raw: &str,
    action: impl AsyncFnOnce(Uuid) -> Result<Option<String>, ApiError>,
) -> Result<Response, AppError> {
    let id = MISSING.id(raw)?;
    match action(id).await {
        Ok(None) => Ok(Redirect::to(&format!("/console/workers/{id}")).into_response()),
        Ok(Some(token)) => worker_page(c, id, Some(token), None).await,
        Err(ApiError::NotFound(_)) => Err(MISSING.error()),
        Err(ApiError::Invalid(e)) => worker_page(c, id, None, Some(e)).await,
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ReasonForm {
    csrf: Option<String>,
    reason: String,
}
crate::web::form::csrf_field!(ReasonForm, GrantForm);

async fn suspend(
    Path(raw): Path<String>,
    ConsoleForm { c, address, form }: ConsoleForm<ReasonForm>,
) -> Result<Response, AppError> {
    let reason = Some(form.reason.trim()).filter(|r| !r.is_empty());
    act(&c, &raw, async |id| {
        workers::suspend(&c.actor(address), id, reason).await?;
        Ok(None)
    })
    .await
}

async fn reinstate(
    Path(raw): Path<String>,
    ConsoleForm { c, address, .. }: ConsoleForm<CsrfForm>,
) -> Result<Response, AppError> {
    act(&c, &raw, async |id| {
        workers::reinstate(&c.actor(address), id).await?;
        Ok(None)
    })
    .await
}

/// A new token, shown on the page this once (never again: only its
/// digest is kept).
async fn rotate(
    Path(raw): Path<String>,
    ConsoleForm { c, address, .. }: ConsoleForm<CsrfForm>,
) -> Result<Response, AppError> {
    act(&c, &raw, async |id| {
        let rotated = workers::rotate_token(&c.actor(address), id).await?;
        Ok(Some(rotated.worker_token))
    })
    .await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct GrantForm {
    csrf: Option<String>,
    name: String,
    value: String,
    expires_at: String,
}

async fn grant(
    Path(raw): Path<String>,
    ConsoleForm { c, address, form }: ConsoleForm<GrantForm>,
) -> Result<Response, AppError> {
    let value = Some(form.value.trim())
        .filter(|v| !v.is_empty())
        .map(|v| match v.parse::<i64>() {
            Ok(n) => QualificationValue::Integer(n),
            Err(_) => QualificationValue::Text(v.to_owned()),
        });
    let expires_at = match time(&form.expires_at) {
        Ok(t) => t,
        Err(e) => return worker_page(&c, MISSING.id(&raw)?, None, Some(e)).await,
    };
    act(&c, &raw, async |id| {
        let name = form.name.trim().to_owned();
        qualifications::grant_to(&c.actor(address), id, name, Grant { value, expires_at }).await?;
        Ok(None)
    })
    .await
}

async fn revoke(
    Path((raw, name)): Path<(String, String)>,
    ConsoleForm { c, address, .. }: ConsoleForm<CsrfForm>,
) -> Result<Response, AppError> {
    act(&c, &raw, async |id| {
        qualifications::revoke_from(&c.actor(address), id, &name).await?;
        Ok(None)
    })
    .await
}
