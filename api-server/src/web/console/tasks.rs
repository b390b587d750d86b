//! The console's tasks: a list filtered by state, owner and time with a
//! search of descriptions, and a task's page with its fields, place,
//! result and feed (which the page's script keeps up to date from the
//! feed the API serves), its photos, and a cancel with a reason that the
//! audit trail records.

use askama::Template;
use axum::Router;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use meatspace_domain::identity::AuditAction;
use meatspace_domain::{Command, Event, FeedView, Task, TaskState};
use meatspace_store::console::TaskFilter;
use serde::Deserialize;
use uuid::Uuid;

use super::audit::time;
use super::{Console, ConsoleForm, Missing, Nav, optional, session_value};
use crate::AppState;
use crate::http::error::ApiError;
use crate::http::rate_limit::ClientAddress;
use crate::routes::{self, stream::StreamQuery, stream::StreamReader, stream::start_cursor};
use crate::web::{AppError, html};

/// Tasks on a page.
const PAGE: u32 = 50;
/// Events shown on a task's page (the newest; the feed has them all).
const FEED_SHOWN: u32 = 200;
/// Longest reason for a cancel.
const MAX_REASON_CHARS: usize = 1000;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/console/tasks", get(list))
        .route("/console/tasks/{task_id}", get(page))
        .route("/console/tasks/{task_id}/cancel", post(cancel))
        .route("/console/tasks/{task_id}/stream", get(stream))
        .route("/console/tasks/{task_id}/photos/{photo_id}", get(photo))
}

const MISSING: Missing = Missing::new(
    "No such task",
    "There is no task with this id (it may have been deleted after its retention period).",
);

// ------------------------------------------------------------------- list

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListQuery {
    state: String,
    owner: String,
    since: String,
    until: String,
    q: String,
    /// `<created_at RFC 3339>_<id>` of the previous page's last task.
    before: String,
}

impl ListQuery {
    fn filter(&self) -> Result<TaskFilter, String> {
        let state = optional(&self.state, |s| {
            TaskState::parse(s).ok_or_else(|| format!("No state is called {s:?}."))
        })?;
        let owner = optional(&self.owner, |o| {
            Uuid::try_parse(o).map_err(|_| "The owner must be an id.".to_owned())
        })?;
        let search = self.q.trim();
        if search.chars().count() > 200 {
            return Err("Search for at most 200 characters.".into());
        }
        let before = match self.before.split_once('_') {
            None => None,
            Some((at, id)) => Some((
                DateTime::parse_from_rfc3339(at)
                    .map_err(|_| "That page link is broken.".to_owned())?
                    .with_timezone(&Utc),
                Uuid::try_parse(id).map_err(|_| "That page link is broken.".to_owned())?,
            )),
        };
        Ok(TaskFilter {
            state,
            owner,
            since: time(&self.since)?,
            until: time(&self.until)?,
            search: (!search.is_empty()).then(|| search.to_owned()),
            before,
            limit: PAGE + 1,
        })
    }

    fn query(&self, before: Option<String>) -> String {
        super::filter_query(
            &[
                ("state", &self.state),
                ("owner", &self.owner),
                ("since", &self.since),
                ("until", &self.until),
                ("q", &self.q),
            ],
            before,
        )
    }
}

struct Row {
    id: Uuid,
    created: String,
    state: &'static str,
    description: String,
    owner: Uuid,
    worker: String,
}

#[derive(Template)]
#[template(path = "console_tasks.html")]
struct ListPage {
    nav: Option<Nav>,
    states: Vec<&'static str>,
    state: String,
    owner: String,
    since: String,
    until: String,
    q: String,
    rows: Vec<Row>,
    next: Option<String>,
    error: Option<String>,
}

/// The first 120 characters of a description, on one line.
fn short(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out: String = flat.chars().take(120).collect();
    if flat.chars().count() > 120 {
        out.push('…');
    }
    out
}

async fn list(c: Console, Query(q): Query<ListQuery>) -> Result<Response, AppError> {
    let mut page = ListPage {
        nav: Some(Nav::of(&c)),
        states: TaskState::ALL.iter().map(|s| s.as_str()).collect(),
        state: q.state.clone(),
        owner: q.owner.clone(),
        since: q.since.clone(),
        until: q.until.clone(),
        q: q.q.clone(),
        rows: Vec::new(),
        next: None,
        error: None,
    };
    let filter = match q.filter() {
        Ok(f) => f,
        Err(e) => {
            page.error = Some(e);
            return Ok((StatusCode::BAD_REQUEST, html(&page)).into_response());
        }
    };
    let mut tasks = c.state.store.console_tasks(&filter).await?;
    if tasks.len() > PAGE as usize {
        tasks.truncate(PAGE as usize);
        page.next = tasks
            .last()
            .map(|(t, _)| q.query(Some(format!("{}_{}", t.created_at.to_rfc3339(), t.id))));
    }
    page.rows = tasks
        .into_iter()
        .map(|(t, owner)| Row {
            id: t.id,
            created: t.created_at.to_rfc3339(),
            state: t.state.as_str(),
            description: short(&t.description),
            owner,
            worker: t.worker_id.map(|w| w.to_string()).unwrap_or_default(),
        })
        .collect();
    Ok(html(&page))
}

// ------------------------------------------------------------------- one task

/// One event of the feed, in words: worker text stays text (askama
/// escapes it) and is marked as the worker's.
struct Item {
    id: i64,
    at: String,
    kind: &'static str,
    actor: &'static str,
    text: String,
    photo: Option<String>,
}

fn item(task: Uuid, e: &Event) -> Item {
    let data = &e.data;
    let text = ["text", "note", "reason", "kind"]
        .iter()
        .filter_map(|k| data.get(*k).and_then(|v| v.as_str()))
        .collect::<Vec<_>>()
        .join(" · ");
    let photo = data
        .get("photo_id")
        .and_then(|v| v.as_str())
        .map(|p| format!("/console/tasks/{task}/photos/{p}"));
    Item {
        id: e.id,
        at: e.created_at.to_rfc3339(),
        kind: e.kind.as_str(),
        actor: e.actor.as_str(),
        text,
        photo,
    }
}

#[derive(Template)]
#[template(path = "console_task.html")]
struct TaskPage {
    nav: Option<Nav>,
    csrf: String,
    task: Task,
    owner: String,
    place: Option<(String, String)>,
    result: Option<String>,
    review: Option<String>,
    items: Vec<Item>,
    cursor: i64,
    terminal: bool,
    error: Option<String>,
}

async fn task_page(c: &Console, id: Uuid, error: Option<String>) -> Result<Response, AppError> {
    let task = MISSING.found(c.state.store.task(id).await?)?;
    let owner = c
        .state
        .store
        .task_owner(id)
        .await?
        .map(|o| o.to_string())
        .unwrap_or_default();
    let events = c.state.store.events(id, 0, FEED_SHOWN).await?;
    let place = task.location.as_ref().map(|l| {
        (
            format!(
                "{:.5}, {:.5} (within {} m){}",
                l.latitude,
                l.longitude,
                l.radius_m,
                l.address
                    .as_deref()
                    .map(|a| format!(": {a}"))
                    .unwrap_or_default()
            ),
            format!("geo:{:.6},{:.6}", l.latitude, l.longitude),
        )
    });
    let result = task
        .result
        .as_ref()
        .map(|r| serde_json::to_string_pretty(r).unwrap_or_default());
    let review = task.review.as_ref().map(|r| format!("{r:?}"));
    let page = TaskPage {
        nav: Some(Nav::of(c)),
        csrf: c.csrf.clone(),
        owner,
        place,
        result,
        review,
        cursor: events.last().map_or(0, |e| e.id),
        items: events.iter().map(|e| item(id, e)).collect(),
        terminal: task.state.is_terminal(),
        task,
        error,
    };
    Ok(super::shown(&page, &page.error, StatusCode::CONFLICT))
}

async fn page(c: Console, Path(raw): Path<String>) -> Result<Response, AppError> {
    task_page(&c, MISSING.id(&raw)?, None).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CancelForm {
    csrf: Option<String>,
    reason: String,
}
crate::web::form::csrf_field!(CancelForm);

/// Cancels the task, as the signed-in operator, with the audit entry in
/// the cancel's own transaction.
async fn cancel(
    Path(raw): Path<String>,
    ConsoleForm { c, address, form }: ConsoleForm<CancelForm>,
) -> Result<Response, AppError> {
    let id = MISSING.id(&raw)?;
    let reason = form.reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        let error = format!("Give a reason of 1 to {MAX_REASON_CHARS} characters.");
        return task_page(&c, id, Some(error)).await;
    }
    let audit = c.caller.audit(
        AuditAction::TaskCancelledByOperator,
        format!("task:{id}"),
        &address,
        Some(serde_json::json!({ "reason": reason, "via": "console" })),
    );
    let command = Command::Cancel {
        reason: Some(reason.to_owned()),
    };
    match c
        .state
        .store
        .apply_audited(id, command, c.caller.acted_by(), audit)
        .await
    {
        Ok(_) => Ok(Redirect::to(&format!("/console/tasks/{id}")).into_response()),
        Err(meatspace_store::StoreError::NotFound) => Err(MISSING.error()),
        Err(meatspace_store::StoreError::Refused(r)) => {
            task_page(&c, id, Some(ApiError::from(r).to_string())).await
        }
        Err(e) => Err(ApiError::from(e).into()),
    }
}

/// The task's feed as it happens, for the page's script: the API's event
/// stream (Server-Sent Events, resumed with `Last-Event-ID`), read as the
/// task's owner reads it, each event in words as the page shows it. It ends
/// when the session does.
async fn stream(
    c: Console,
    Path(raw): Path<String>,
    headers: HeaderMap,
    Query(q): Query<StreamQuery>,
    ClientAddress(address): ClientAddress,
) -> Result<Response, ApiError> {
    let id = Uuid::try_parse(&raw).map_err(|_| ApiError::task_not_found())?;
    let after = start_cursor(&headers, &q)?;
    let slot = c
        .state
        .rate_limit
        .streams()
        .open(c.caller.as_principal(), address)?;
    let reader = ConsoleReader {
        state: c.state.clone(),
        session: session_value(&c.state, &headers)
            .unwrap_or_default()
            .to_owned(),
        task: id,
    };
    routes::stream::stream(c.state, id, after, FeedView::Agent, slot, reader).await
}

/// The console page reading a task's stream: for as long as its session is
/// good, each event in the page's words.
struct ConsoleReader {
    state: AppState,
    /// The session cookie's value, checked again before anything is sent.
    session: String,
    task: Uuid,
}

impl StreamReader for ConsoleReader {
    fn render(&self, e: &Event) -> SseEvent {
        let i = item(self.task, e);
        let data = serde_json::json!({
            "id": i.id, "at": i.at, "kind": i.kind, "actor": i.actor,
            "text": i.text, "photo": i.photo, "terminal": e.kind.is_terminal(),
        });
        SseEvent::default()
            .id(e.id.to_string())
            .data(data.to_string())
    }

    async fn allowed(&self) -> bool {
        Console::of_session(&self.state, &self.session)
            .await
            .is_ok()
    }
}

async fn photo(
    c: Console,
    Path((raw, photo_id)): Path<(String, String)>,
) -> Result<Response, AppError> {
    let id = MISSING.id(&raw)?;
    let photo_id = MISSING.id(&photo_id)?;
    let photo = crate::routes::tasks::photo_answer(&c.state, id, photo_id).await?;
    MISSING.found(photo)
}
