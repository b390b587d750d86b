//! The worker web app: server-rendered pages under `/app` for people doing
//! tasks from a phone. Every action is a plain form posted and answered
//! with a redirect (POST-redirect-GET), so it works without JavaScript; the
//! small script the app serves itself only adds the live feed and upload
//! progress. Templates (askama) escape everything, so text an agent wrote
//! is shown as text. Every action runs the same domain commands as the JSON
//! worker API, through [`AppState::act`]-style calls on the store.

pub mod console;
mod form;
mod notifications;
mod result_form;
pub mod session;

use askama::Template;
use axum::Router;
use axum::extract::multipart::MultipartError;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use meatspace_domain::result::ResultSchema;
use meatspace_domain::{
    Command, Event, EventType, IssueKind, MAX_TEXT_CHARS, Position, Presence, ReviewState, Task,
    TaskState,
};
use meatspace_store::StoreError;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::AppState;
use crate::auth::{credential_subject, verify_worker_token};
use crate::http::error::ApiError;
use crate::http::rate_limit::ClientAddress;
use crate::routes::eligibility::Eligibility;
use crate::routes::events::{EventsQuery, Reader, event_feed};
use crate::routes::invites::INVITE_PREFIX;
use crate::routes::{checked_optional_text, checked_text, worker_tasks};
use form::{SessionForm, SignInForm, TaskForm, TaskId};
use session::{APP_COOKIES, WorkerSession, csrf_token};

/// The Content-Security-Policy of every page: only the app's own script,
/// style and images, no inline code, forms post only here, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Longest display name (as the worker API).
const MAX_NAME_CHARS: usize = 200;
/// Tasks shown on a list page.
const LIST_LIMIT: u32 = 100;
/// How long the page's live feed waits for news per request (long poll).
const FEED_WAIT_SECONDS: u32 = 25;

const APP_CSS: &str = include_str!("../../static/app.css");
const APP_JS: &str = include_str!("../../static/app.js");
const CONSOLE_JS: &str = include_str!("../../static/console.js");

/// The app's routes. `max_photo_bytes` bounds the upload form's body.
pub fn router(max_photo_bytes: usize) -> Router<AppState> {
    let photo = Router::new()
        .route("/app/tasks/{task_id}/photos", post(send_photo))
        .route("/app/tasks/{task_id}/photos/{photo_id}", get(own_photo))
        // Room for the multipart framing and the CSRF field around the photo.
        .layer(DefaultBodyLimit::max(max_photo_bytes + 64 * 1024));
    Router::new()
        .route("/app", get(|| async { Redirect::to("/app/tasks") }))
        .route("/app/", get(|| async { Redirect::to("/app/tasks") }))
        .route("/app/static/app.css", get(css))
        .route("/app/static/app.js", get(js))
        .route("/app/static/console.js", get(console_js))
        .route("/app/invite/{code}", get(invite_form).post(accept_invite))
        .route("/app/login", get(login_form).post(login))
        .route("/app/logout", post(logout))
        .route("/app/tasks", get(open_tasks))
        .route("/app/my", get(my_tasks))
        .route("/app/tasks/{task_id}", get(task_page))
        .route("/app/tasks/{task_id}/feed", get(feed))
        .route("/app/tasks/{task_id}/claim", post(claim))
        .route("/app/tasks/{task_id}/start", post(start))
        .route("/app/tasks/{task_id}/messages", post(send_message))
        .route("/app/tasks/{task_id}/issues", post(raise_issue))
        .route("/app/tasks/{task_id}/complete", post(complete))
        .route("/app/tasks/{task_id}/stop", post(stop))
        .merge(photo)
        .merge(notifications::router())
        .merge(console::router())
        .layer(axum::middleware::map_response(page_headers))
}

/// Security headers of every app response.
async fn page_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Invite links carry a credential in the URL: never leak it onwards.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        APP_CSS,
    )
}

async fn console_js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        CONSOLE_JS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        APP_JS,
    )
}

// ---------------------------------------------------------------- errors

/// What can go wrong in the app, answered as a page (or a redirect).
#[derive(Debug)]
pub enum AppError {
    /// No valid session: go to the sign-in page.
    SignIn,
    /// A form without its CSRF token (or with another session's).
    Csrf,
    /// A page with a status, a title and a sentence.
    Page(StatusCode, &'static str, String),
    /// Elsewhere: the console's sign-in page, when its session is gone.
    Redirect(&'static str),
    Api(ApiError),
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        AppError::Api(e.into())
    }
}

impl From<ApiError> for AppError {
    fn from(e: ApiError) -> Self {
        AppError::Api(e)
    }
}

/// The status of an API error and a sentence a person understands.
fn human(e: &ApiError) -> (StatusCode, String) {
    match e {
        ApiError::NotFound(_) => (
            StatusCode::NOT_FOUND,
            "This task is not available to you: another worker may have claimed it, or it ended."
                .into(),
        ),
        ApiError::Conflict {
            slug,
            task_state,
            detail,
        } => {
            let state = task_state.map(|s| s.as_str()).unwrap_or("changed");
            let text = match *slug {
                "task-event-limit" => sentence(detail),
                "task-terminal" => {
                    format!("This task has ended ({state}); nothing more can be done on it.")
                }
                "deadline-passed" => {
                    "The time for this task has run out; it is being closed.".to_owned()
                }
                _ => format!("This task is {state} now, so that cannot be done any more."),
            };
            (StatusCode::CONFLICT, text)
        }
        ApiError::Invalid(detail)
        | ApiError::BadRequest { detail, .. }
        | ApiError::Unprocessable { detail, .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, sentence(detail))
        }
        // Each error is shown next to its field; what belongs to none is
        // said here.
        ApiError::InvalidFields { errors, .. } => {
            let mut text = "Some answers need another look: see the marked fields.".to_owned();
            for e in errors.iter().filter(|e| e.pointer.is_empty()) {
                text.push(' ');
                text.push_str(&sentence(&e.message));
            }
            (StatusCode::UNPROCESSABLE_ENTITY, text)
        }
        ApiError::TooLarge(detail) | ApiError::UnsupportedMediaType(detail) => {
            (StatusCode::UNPROCESSABLE_ENTITY, sentence(detail))
        }
        ApiError::Unauthorized(_) | ApiError::DevKeyDisabled => (
            StatusCode::UNAUTHORIZED,
            "That worker token is not valid.".into(),
        ),
        ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "You may not do that.".into()),
        ApiError::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The service is briefly unavailable. Please try again in a moment.".into(),
        ),
        ApiError::TooManyRequests(_) | ApiError::TooManyStreams(_) => (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests. Please wait a moment and try again.".into(),
        ),
        ApiError::PhotoQuota(_) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "This task holds as many photos as it may; no more can be added.".into(),
        ),
        ApiError::MethodNotAllowed(_) => (
            StatusCode::METHOD_NOT_ALLOWED,
            "That page does not take this kind of request.".into(),
        ),
        ApiError::Internal(cause) => {
            tracing::error!(error = ?cause, "internal error in the web app");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong on our side. Please try again.".into(),
            )
        }
    }
}

/// `detail` as a sentence: capital first letter, final full stop.
fn sentence(detail: &str) -> String {
    let mut chars = detail.chars();
    let mut out: String = match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => return String::new(),
    };
    if !out.ends_with('.') {
        out.push('.');
    }
    out
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, title, message) = match self {
            AppError::SignIn => return Redirect::to("/app/login").into_response(),
            AppError::Redirect(to) => return Redirect::to(to).into_response(),
            AppError::Csrf => (
                StatusCode::FORBIDDEN,
                "Form refused",
                "This form did not carry a valid security token, so it was refused. \
                 Go back, reload the page and try again."
                    .to_owned(),
            ),
            AppError::Page(status, title, message) => (status, title, message),
            AppError::Api(e) => {
                let (status, message) = human(&e);
                (status, "Something is not right", message)
            }
        };
        let page = ErrorPage {
            nav: None,
            title,
            message,
        };
        (status, html(&page)).into_response()
    }
}

/// Renders a template as an HTML response body.
fn html(t: &impl Template) -> Response {
    match t.render() {
        Ok(body) => ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering a page failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                "<!doctype html><title>Error</title><p>Something went wrong on our side.",
            )
                .into_response()
        }
    }
}

// ------------------------------------------------------------- templates

/// The signed-in header: the worker's name and the sign-out form.
#[derive(Debug, Clone)]
struct Nav {
    /// Who is signed in, as the sign-out button's title says it.
    signed_in: String,
    csrf: String,
}

impl Nav {
    fn of(s: &WorkerSession) -> Self {
        Nav {
            signed_in: format!("Signed in as {}", s.worker.name),
            csrf: s.csrf.clone(),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    nav: Option<Nav>,
    title: &'static str,
    message: String,
}

#[derive(Template)]
#[template(path = "invite.html")]
struct InvitePage {
    nav: Option<Nav>,
    csrf: String,
    code: String,
    name: String,
    error: Option<String>,
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    nav: Option<Nav>,
    csrf: String,
    notice: Option<&'static str>,
    error: Option<String>,
}

/// One task in a list.
#[derive(Debug)]
struct TaskCard {
    id: Uuid,
    description: String,
    state: &'static str,
    time_left: String,
    /// "350 m away", in a nearby list.
    distance: Option<String>,
    address: Option<String>,
}

#[derive(Template)]
#[template(path = "tasks.html")]
struct TasksPage {
    nav: Option<Nav>,
    heading: &'static str,
    empty: &'static str,
    tasks: Vec<TaskCard>,
    /// The open-task list offers a search near a point; `near` is the
    /// point searched, as typed.
    search: bool,
    near: String,
    error: Option<String>,
    /// My tasks: the worker's qualifications, in words.
    qualifications: Option<Vec<String>>,
}

/// One line of a task's feed, already in words.
#[derive(Debug, Serialize)]
struct FeedItem {
    id: i64,
    /// The event's type: the page reloads when the agent asks for a
    /// revision, so the form comes back.
    kind: &'static str,
    who: &'static str,
    text: String,
    time: String,
    class: &'static str,
}

/// Which form an error belongs to, and what the person had typed.
#[derive(Debug, Default)]
struct TypedInput {
    form: &'static str,
    error: Option<String>,
    message: String,
    issue_kind: String,
    issue_text: String,
    note: String,
    reason: String,
    /// The result form's fields as posted (`r.<name>`, value).
    result: Vec<(String, String)>,
    /// What was wrong with them, at their pointers.
    result_errors: Vec<meatspace_domain::result::FieldError>,
}

impl TypedInput {
    /// A submission of `form` that carried no text worth showing again.
    fn of(form: &'static str) -> Self {
        TypedInput {
            form,
            ..TypedInput::default()
        }
    }
}

#[derive(Template)]
#[template(path = "task.html")]
struct TaskPage {
    nav: Option<Nav>,
    csrf: String,
    task: Task,
    state: &'static str,
    time_left: String,
    mine: bool,
    can_claim: bool,
    can_start: bool,
    can_send: bool,
    can_complete: bool,
    can_stop: bool,
    /// The inputs of the task's result form (none without a schema).
    result_fields: Vec<result_form::FormField>,
    /// With review: the submission waits for the agent, until this time.
    awaiting_review: Option<String>,
    /// With review: what the agent asked to change.
    feedback: Option<String>,
    banner: Option<String>,
    feed: Vec<FeedItem>,
    cursor: i64,
    issue_kinds: Vec<(&'static str, &'static str)>,
    max_photo_bytes: usize,
    max_photo_mb: String,
    typed: TypedInput,
    /// What the agent asks of the worker's position, in words.
    presence_note: &'static str,
}

impl TaskPage {
    /// The error of `form`, if the last submission of that form failed.
    fn error_of(&self, form: &str) -> Option<&str> {
        if self.typed.form == form {
            self.typed.error.as_deref()
        } else {
            None
        }
    }
}

fn issue_label(kind: IssueKind) -> &'static str {
    match kind {
        IssueKind::UnclearInstructions => "The instructions are unclear",
        IssueKind::AccessBlocked => "I cannot reach or enter the place",
        IssueKind::ItemUnavailable => "The thing is missing, closed or sold out",
        IssueKind::SafetyConcern => "Doing this would be unsafe",
        IssueKind::NeedsMoreTime => "I need more time",
        IssueKind::Other => "Something else",
    }
}

fn time_left(until: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (until - now).num_seconds();
    match secs {
        s if s <= 0 => "time is up".to_owned(),
        s if s < 60 => "less than a minute left".to_owned(),
        s if s < 120 * 60 => format!("{} min left", s / 60),
        s if s < 48 * 3600 => format!("{} h left", s / 3600),
        s => format!("{} days left", s / 86400),
    }
}

/// The deadline that matters to the worker in this state.
fn task_deadline(t: &Task) -> Option<DateTime<Utc>> {
    match t.state {
        TaskState::Open | TaskState::Draft => Some(t.expires_at),
        TaskState::Assigned => t.start_by.or(Some(t.expires_at)),
        TaskState::Active => t.active_until,
        _ => None,
    }
}

fn card(t: Task, now: DateTime<Utc>) -> TaskCard {
    TaskCard {
        id: t.id,
        state: t.state.as_str(),
        time_left: task_deadline(&t)
            .map(|d| time_left(d, now))
            .unwrap_or_else(|| "ended".to_owned()),
        address: t.location.as_ref().and_then(|l| l.address.clone()),
        description: t.description,
        distance: None,
    }
}

/// A distance for people: metres up to a kilometre, then kilometres.
fn distance_text(metres: f64) -> String {
    if metres < 1000.0 {
        format!("{} m away", metres.round())
    } else {
        format!("{:.1} km away", metres / 1000.0)
    }
}

/// An event in words, from the worker's point of view.
fn feed_item(e: &Event) -> FeedItem {
    let d = &e.data;
    let s = |k: &str| d.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let with = |base: &str, extra: Option<String>| match extra {
        Some(x) if !x.is_empty() => format!("{base}: {x}"),
        _ => base.to_owned(),
    };
    let (who, class, text) = match e.kind {
        EventType::TaskPublished => ("meatspace", "system", "The task was published.".to_owned()),
        EventType::TaskAssigned => ("You", "worker", "You claimed the task.".to_owned()),
        EventType::TaskUnassigned => (
            "meatspace",
            "system",
            "The assignment lapsed: the task was not started in time.".to_owned(),
        ),
        EventType::TaskStarted => ("You", "worker", "You started the task.".to_owned()),
        EventType::WorkerMessage => ("You", "worker", s("text").unwrap_or_default()),
        EventType::WorkerPhoto => {
            let dim = |k: &str| d.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
            (
                "You",
                "worker",
                format!("Photo sent ({} × {} pixels).", dim("width"), dim("height")),
            )
        }
        EventType::WorkerIssue => {
            let kind = s("kind")
                .and_then(|k| IssueKind::parse(&k))
                .map(issue_label)
                .unwrap_or("Issue");
            (
                "You",
                "worker",
                with(&format!("Issue raised — {kind}"), s("text")),
            )
        }
        EventType::AgentIssueResponse => {
            let verb = match s("action").as_deref() {
                Some("clarify") => "Clarification",
                Some("acknowledge") => "Acknowledged",
                Some("cancel") => "Cancelled the task",
                _ => "Answer",
            };
            ("Agent", "agent", with(verb, s("text")))
        }
        EventType::TaskCompleted => match s("review").as_deref() {
            Some("accepted") => (
                "Agent",
                "agent",
                "The agent accepted your work: the task is completed.".to_owned(),
            ),
            Some(_) => (
                "meatspace",
                "system",
                "Your work was accepted (the review time ran out): the task is completed."
                    .to_owned(),
            ),
            None => ("You", "worker", with("You completed the task", s("note"))),
        },
        EventType::TaskSubmitted => (
            "You",
            "worker",
            with("You submitted your work for review", s("note")),
        ),
        EventType::TaskRevisionRequested => (
            "Agent",
            "agent",
            with("The agent asked for a revision", s("text")),
        ),
        EventType::TaskStopped => ("You", "worker", with("You stopped the task", s("reason"))),
        EventType::TaskCancelled => (
            "Agent",
            "agent",
            match s("review") {
                Some(_) => with("The agent rejected your work", s("reason")),
                None => with("The agent cancelled the task", s("reason")),
            },
        ),
        EventType::TaskExpired => ("meatspace", "system", "The task expired.".to_owned()),
        EventType::TaskExtended => (
            "Agent",
            "agent",
            with("The agent gave the task more time, until", s("expires_at")),
        ),
    };
    FeedItem {
        id: e.id,
        kind: e.kind.as_str(),
        who,
        text,
        time: e.created_at.format("%H:%M:%S UTC").to_string(),
        class,
    }
}

// ----------------------------------------------------------- sign in/out

form::csrf_field!(NameForm, TokenForm, CsrfForm, PositionForm, TextForm);

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NameForm {
    csrf: Option<String>,
    name: String,
}

fn invite_gone() -> AppError {
    AppError::Page(
        StatusCode::GONE,
        "Invite not valid",
        "This invite link is not valid: it was already used, it expired, it was revoked, or it \
         was copied incompletely. Ask for a new one."
            .into(),
    )
}

/// The invite, if the code is genuine, unused, unrevoked and unexpired: the
/// page and its form answer alike, so a link that cannot sign anyone up
/// never shows the form.
async fn live_invite(state: &AppState, code: &str) -> Result<Uuid, AppError> {
    let gone = invite_gone;
    let id = credential_subject(code, INVITE_PREFIX).ok_or_else(gone)?;
    let invite = state.store.invite(id).await?.ok_or_else(gone)?;
    if !invite.code_hash.verify(code)
        || invite.invite.state(state.clock.now()) != meatspace_domain::identity::InviteState::Open
    {
        return Err(gone());
    }
    Ok(id)
}

async fn invite_form(
    State(state): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    live_invite(&state, &code).await?;
    Ok(signed_out_page(&state, &headers, |csrf| InvitePage {
        nav: None,
        csrf,
        code,
        name: String::new(),
        error: None,
    }))
}

async fn accept_invite(
    Path(code): Path<String>,
    SignInForm {
        state,
        headers,
        form,
    }: SignInForm<NameForm>,
) -> Result<Response, AppError> {
    let invite_id = live_invite(&state, &code).await?;
    let name = match checked_text("name", &form.name, MAX_NAME_CHARS) {
        Ok(n) => n.trim().to_owned(),
        Err(e) => {
            let page = signed_out_page(&state, &headers, |csrf| InvitePage {
                nav: None,
                csrf,
                code,
                error: Some(match e {
                    ApiError::Invalid(d) if d.contains("empty") => {
                        "Please choose a display name.".to_owned()
                    }
                    other => human(&other).1,
                }),
                name: form.name,
            });
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
        }
    };
    let worker_id = Uuid::new_v4();
    // The person never sees this token: the session is their credential.
    // They can still be given one later by an operator if they need the API.
    let (_, token_hash) = crate::auth::issue_worker_token(worker_id);
    let worker = state
        .store
        .redeem_invite(invite_id, worker_id, &name, token_hash, state.clock.now())
        .await?;
    if worker.is_none() {
        // Someone else redeemed it (or it expired) since the check above.
        return Err(invite_gone());
    }
    signed_in(&state, &headers, worker_id).await
}

/// Starts the worker's session and goes to the open tasks.
async fn signed_in(
    state: &AppState,
    headers: &HeaderMap,
    worker_id: Uuid,
) -> Result<Response, AppError> {
    let cookie = session::start(state, headers, worker_id).await?;
    Ok(with_cookie(
        Redirect::to("/app/tasks").into_response(),
        Some(cookie),
    ))
}

fn with_cookie(mut res: Response, cookie: Option<HeaderValue>) -> Response {
    if let Some(c) = cookie {
        res.headers_mut().append(header::SET_COOKIE, c);
    }
    res
}

/// A page with a form posted before signing in (an invite, the sign-in):
/// `page` receives the CSRF token of the pre-session, whose cookie is set
/// when the browser has none yet.
fn signed_out_page<T: Template>(
    state: &AppState,
    headers: &HeaderMap,
    page: impl FnOnce(String) -> T,
) -> Response {
    let (pre, set) = APP_COOKIES.pre_session(state, headers);
    with_cookie(html(&page(csrf_token(&pre))), set)
}

#[derive(Debug, Default, Deserialize)]
struct LoginQuery {
    signed_out: Option<String>,
}

async fn login_form(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<LoginQuery>,
) -> Response {
    signed_out_page(&state, &headers, |csrf| LoginPage {
        nav: None,
        csrf,
        notice: q
            .signed_out
            .map(|_| "You are signed out. Your session has ended on the server."),
        error: None,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenForm {
    csrf: Option<String>,
    token: String,
}

async fn login(
    SignInForm {
        state,
        headers,
        form,
    }: SignInForm<TokenForm>,
) -> Result<Response, AppError> {
    match verify_worker_token(&state, form.token.trim()).await {
        Ok(worker_id) => signed_in(&state, &headers, worker_id).await,
        Err(ApiError::Unauthorized(_)) => {
            let page = signed_out_page(&state, &headers, |csrf| LoginPage {
                nav: None,
                csrf,
                notice: None,
                // The token is a secret: it is not sent back into the page.
                error: Some(
                    "That worker token is not valid. Check that you pasted all of it.".into(),
                ),
            });
            Ok((StatusCode::UNAUTHORIZED, page).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionForm { session: s, .. }: SessionForm<CsrfForm>,
) -> Result<Response, AppError> {
    state.store.delete_session(s.session_id).await?;
    let clear = APP_COOKIES.set(
        state.public_origin.secure(&headers),
        session::SESSION_COOKIE,
        "",
        0,
    );
    Ok(with_cookie(
        Redirect::to("/app/login?signed_out=1").into_response(),
        Some(clear),
    ))
}

// ---------------------------------------------------------------- lists

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NearQuery {
    /// `LATITUDE,LONGITUDE`, from the device or typed.
    near: String,
}

/// The open tasks: the newest, or with `near` those with a place nearest
/// to it (with their distance) and then those without.
async fn open_tasks(
    State(state): State<AppState>,
    s: WorkerSession,
    Query(q): Query<NearQuery>,
) -> Result<Response, AppError> {
    let now = state.clock.now();
    let eligible = Eligibility::of(&state, s.worker.id);
    let near = q.near.trim().to_owned();
    let mut error = None;
    let tasks = match near.is_empty() {
        true => None,
        false => match worker_tasks::near_point(&near, None) {
            Ok(point) => Some(worker_tasks::nearby_page(&state, point, None, LIST_LIMIT).await?),
            Err(e) => {
                error = Some(format!(
                    "{} Type the place as latitude,longitude, for example 52.5200,13.4050.",
                    sentence(&e.to_string())
                ));
                None
            }
        },
    };
    let tasks = match tasks {
        Some(page) => eligible
            .keep(&state, page.tasks, |l| &l.task)
            .await?
            .into_iter()
            .map(|listed| {
                let mut c = card(listed.task, now);
                c.distance = listed.distance_m.map(distance_text);
                c
            })
            .collect(),
        None => eligible
            .keep(
                &state,
                state.store.newest_open_tasks(LIST_LIMIT).await?,
                |t| t,
            )
            .await?
            .into_iter()
            .map(|t| card(t, now))
            .collect(),
    };
    let page = TasksPage {
        nav: Some(Nav::of(&s)),
        heading: if near.is_empty() || error.is_some() {
            "Open tasks"
        } else {
            "Open tasks near you"
        },
        empty: "No open tasks right now. Check again later.",
        tasks,
        search: true,
        qualifications: None,
        near,
        error,
    };
    Ok(html(&page))
}

async fn my_tasks(State(state): State<AppState>, s: WorkerSession) -> Result<Response, AppError> {
    let now = state.clock.now();
    let tasks = state.store.worker_tasks(s.worker.id, LIST_LIMIT).await?;
    let qualifications = state
        .store
        .qualifications(s.worker.id)
        .await?
        .into_iter()
        .filter(|q| q.holds(now))
        .map(|q| qualification_text(&q))
        .collect();
    let page = TasksPage {
        nav: Some(Nav::of(&s)),
        heading: "My tasks",
        empty: "You have no tasks yet. Claim one from the open tasks.",
        tasks: tasks.into_iter().map(|t| card(t, now)).collect(),
        search: false,
        near: String::new(),
        error: None,
        qualifications: Some(qualifications),
    };
    Ok(html(&page))
}

/// A qualification in words: `vehicle: car (until 2030-01-01)`.
fn qualification_text(q: &meatspace_domain::qualification::Qualification) -> String {
    use meatspace_domain::qualification::QualificationValue;
    let mut s = q.name.clone();
    match &q.value {
        Some(QualificationValue::Text(t)) => s.push_str(&format!(": {t}")),
        Some(QualificationValue::Integer(n)) => s.push_str(&format!(": {n}")),
        None => {}
    }
    if let Some(until) = q.expires_at {
        s.push_str(&format!(" (until {})", until.format("%Y-%m-%d")));
    }
    s
}

// ------------------------------------------------------------- the task

/// The events the worker may read (from its own assignment on), in words.
async fn worker_feed(
    state: &AppState,
    worker: Uuid,
    id: Uuid,
    after: i64,
    wait: u32,
) -> Result<(Vec<FeedItem>, i64, TaskState), ApiError> {
    let view = crate::routes::events::worker_view(state.store.as_ref(), worker, id).await?;
    let q = EventsQuery {
        after,
        limit: Some(crate::routes::events::MAX_EVENTS_PAGE),
        wait: Some(wait),
    };
    let page = event_feed(state, id, &q, view.floor(), Reader::Worker(worker)).await?;
    Ok((
        page.events.iter().map(feed_item).collect(),
        page.next_cursor,
        page.task_state,
    ))
}

/// Renders the task page, with `typed` holding a failed form's error and text.
async fn render_task(
    state: &AppState,
    s: &WorkerSession,
    id: Uuid,
    typed: TypedInput,
    status: StatusCode,
) -> Result<Response, AppError> {
    let me = s.worker.id;
    let task = worker_tasks::visible_task(state, me, id).await?;
    let mine = task.worker_id == Some(me);
    let (feed, cursor) = if mine {
        let (items, cursor, _) = worker_feed(state, me, id, 0, 0).await?;
        (items, cursor)
    } else {
        (Vec::new(), 0)
    };
    let now = state.clock.now();
    let st = task.state;
    let review = task.review.as_ref();
    let waiting = review.is_some_and(|r| r.is_waiting());
    let can_complete = mine && st == TaskState::Active && !waiting;
    let result_fields = match &task.result_schema {
        Some(schema) if can_complete => {
            let schema = ResultSchema::parse(schema)
                .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored result schema: {e:?}")))?;
            let photos = crate::routes::results::assignment_photos(state, me, id).await?;
            // A revision starts from the answers sent before.
            let previous = match (&task.result, typed.form) {
                (Some(result), form) if form != "complete" => result_form::pairs_of(result),
                _ => typed.result.clone(),
            };
            result_form::fields(&schema, &photos, &previous, &typed.result_errors)
        }
        _ => Vec::new(),
    };
    let awaiting_review = review
        .filter(|_| waiting && st == TaskState::Active)
        .and_then(|r| r.auto_accept_at)
        .map(|at| at.format("%Y-%m-%d %H:%M UTC").to_string());
    let feedback = review
        .filter(|r| r.state == ReviewState::RevisionRequested && can_complete)
        .and_then(|r| r.feedback.clone());
    let banner = st.is_terminal().then(|| {
        let how = match st {
            TaskState::Completed => "completed",
            TaskState::Stopped => "stopped",
            TaskState::Cancelled => "cancelled by the agent",
            TaskState::Expired => "expired",
            _ => "ended",
        };
        format!("This task has ended: it was {how}. It is read-only now.")
    });
    let page = TaskPage {
        nav: Some(Nav::of(s)),
        csrf: s.csrf.clone(),
        state: st.as_str(),
        time_left: task_deadline(&task)
            .map(|d| time_left(d, now))
            .unwrap_or_else(|| "ended".to_owned()),
        mine,
        can_claim: st == TaskState::Open && !mine,
        can_start: mine && st == TaskState::Assigned,
        can_send: mine && matches!(st, TaskState::Assigned | TaskState::Active),
        can_complete,
        result_fields,
        awaiting_review,
        feedback,
        can_stop: mine && matches!(st, TaskState::Assigned | TaskState::Active),
        banner,
        feed,
        cursor,
        issue_kinds: IssueKind::ALL
            .into_iter()
            .map(|k| (k.as_str(), issue_label(k)))
            .collect(),
        max_photo_bytes: state.photo_limits.max_bytes,
        max_photo_mb: format!("{:.0}", state.photo_limits.max_bytes as f64 / 1_048_576.0),
        typed,
        presence_note: match (task.location.is_some(), task.presence) {
            (true, Presence::Require) => {
                "Starting and sending photos need your phone's position at the place: allow \
                 location when your browser asks."
            }
            (true, Presence::Flag) => {
                "Your phone's position is sent when you start and with each photo; the agent \
                 sees whether you were at the place."
            }
            _ => "",
        },
        task,
    };
    Ok((status, html(&page)).into_response())
}

async fn task_page(
    State(state): State<AppState>,
    s: WorkerSession,
    TaskId(id): TaskId,
) -> Result<Response, AppError> {
    render_task(&state, &s, id, TypedInput::default(), StatusCode::OK).await
}

#[derive(Debug, Deserialize)]
struct FeedQuery {
    #[serde(default)]
    after: i64,
}

#[derive(Debug, Serialize)]
struct FeedPage {
    items: Vec<FeedItem>,
    next_cursor: i64,
    task_state: &'static str,
    terminal: bool,
}

/// The page's live feed: the next events in words, as JSON, long-polled
/// with the durable cursor. Each wait takes one of the worker's capped
/// places, as a long poll of the worker API does.
async fn feed(
    State(state): State<AppState>,
    s: WorkerSession,
    Path(raw): Path<String>,
    Query(q): Query<FeedQuery>,
    ClientAddress(address): ClientAddress,
) -> Result<Response, ApiError> {
    let id = Uuid::try_parse(&raw).map_err(|_| ApiError::task_not_found())?;
    let _slot = state
        .rate_limit
        .streams()
        .open(crate::auth::Principal::Worker(s.worker.id), address)?;
    let (items, next_cursor, st) =
        worker_feed(&state, s.worker.id, id, q.after.max(0), FEED_WAIT_SECONDS).await?;
    Ok(axum::Json(FeedPage {
        items,
        next_cursor,
        task_state: st.as_str(),
        terminal: st.is_terminal(),
    })
    .into_response())
}

/// A signed-in worker acting on one task from a form of its page (the
/// [`TaskForm`] extractor reads it): runs the action and answers.
#[derive(Debug)]
pub struct OnTask {
    state: AppState,
    session: WorkerSession,
    id: Uuid,
}

impl OnTask {
    fn worker(&self) -> Uuid {
        self.session.worker.id
    }

    /// Runs `command` on the task when the form gave one, and answers as
    /// [`OnTask::answer`] does.
    async fn act(
        self,
        typed: TypedInput,
        command: Result<Command, ApiError>,
    ) -> Result<Response, AppError> {
        let result = match command {
            Ok(command) => self.state.act(self.id, command).await.map(drop),
            Err(e) => Err(e),
        };
        self.answer(typed, result).await
    }

    /// After a successful action: back to the task page
    /// (POST-redirect-GET). On a refusal: the task page again with the
    /// error next to the form and the text as typed.
    async fn answer(
        self,
        mut typed: TypedInput,
        result: Result<(), ApiError>,
    ) -> Result<Response, AppError> {
        let id = self.id;
        match result {
            Ok(()) => Ok(Redirect::to(&format!("/app/tasks/{id}")).into_response()),
            Err(ApiError::Unavailable) => Err(AppError::Api(ApiError::Unavailable)),
            Err(e) => {
                let (status, message) = human(&e);
                typed.error = Some(message);
                match render_task(&self.state, &self.session, id, typed, status).await {
                    Ok(page) => Ok(page),
                    // The task is no longer visible at all: say so plainly.
                    Err(_) => Err(AppError::Api(e)),
                }
            }
        }
    }
}

async fn claim(TaskForm { on, .. }: TaskForm<CsrfForm>) -> Result<Response, AppError> {
    match worker_tasks::claim_task(&on.state, on.worker(), on.id).await {
        Err(ApiError::NotFound(_)) => Err(AppError::Page(
            StatusCode::CONFLICT,
            "Task taken",
            "Sorry, another worker claimed this task first (or it has ended). \
             Pick another one from the open tasks."
                .into(),
        )),
        result => on.answer(TypedInput::of("claim"), result.map(drop)).await,
    }
}

/// The device position a form carries (filled in by the page's script
/// from the browser's geolocation): all three fields, or none.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PositionForm {
    csrf: Option<String>,
    latitude: String,
    longitude: String,
    accuracy_m: String,
}

/// The position of a form's fields; 422 for a partial or bad one.
fn form_position(lat: &str, lon: &str, accuracy: &str) -> Result<Option<Position>, ApiError> {
    let (lat, lon, accuracy) = (lat.trim(), lon.trim(), accuracy.trim());
    if lat.is_empty() && lon.is_empty() && accuracy.is_empty() {
        return Ok(None);
    }
    let number = |s: &str| s.parse::<f64>().ok();
    match (number(lat), number(lon), number(accuracy)) {
        (Some(latitude), Some(longitude), Some(accuracy_m)) => {
            Position::new(latitude, longitude, accuracy_m)
                .map(Some)
                .map_err(|e| ApiError::invalid(format!("your position: {e}")))
        }
        _ => Err(ApiError::invalid("your position could not be read")),
    }
}

async fn start(TaskForm { on, form }: TaskForm<PositionForm>) -> Result<Response, AppError> {
    let worker = on.worker();
    let command = form_position(&form.latitude, &form.longitude, &form.accuracy_m)
        .map(|position| Command::Start { worker, position });
    on.act(TypedInput::of("start"), command).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TextForm {
    csrf: Option<String>,
    text: String,
    kind: String,
    confirm: Option<String>,
}

async fn send_message(TaskForm { on, form }: TaskForm<TextForm>) -> Result<Response, AppError> {
    let worker = on.worker();
    let command = checked_text("message", &form.text, MAX_TEXT_CHARS)
        .map(|text| Command::Message { worker, text });
    let typed = TypedInput {
        form: "message",
        message: form.text,
        ..TypedInput::default()
    };
    on.act(typed, command).await
}

async fn raise_issue(TaskForm { on, form }: TaskForm<TextForm>) -> Result<Response, AppError> {
    let worker = on.worker();
    let command = match (
        IssueKind::parse(&form.kind),
        checked_text("the description of the issue", &form.text, MAX_TEXT_CHARS),
    ) {
        (None, _) => Err(ApiError::invalid("choose what kind of issue this is")),
        (_, Err(e)) => Err(e),
        (Some(kind), Ok(text)) => Ok(Command::RaiseIssue { worker, kind, text }),
    };
    let typed = TypedInput {
        form: "issue",
        issue_kind: form.kind,
        issue_text: form.text,
        ..TypedInput::default()
    };
    on.act(typed, command).await
}

/// The complete form: a note and, for a task with a result schema, the
/// result form's fields (`r.<name>`, repeated for lists), in the order
/// posted.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
struct CompleteForm(Vec<(String, String)>);

impl form::CsrfField for CompleteForm {
    fn csrf(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == "csrf")
            .map(|(_, v)| v.as_str())
    }
}

async fn complete(
    TaskForm {
        on,
        form: CompleteForm(pairs),
    }: TaskForm<CompleteForm>,
) -> Result<Response, AppError> {
    let text = pairs
        .iter()
        .find(|(k, _)| k == "text")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let result = submit(&on.state, on.worker(), on.id, &text, &pairs).await;
    let mut typed = TypedInput {
        form: "complete",
        note: text,
        result: pairs
            .into_iter()
            .filter(|(k, _)| k.starts_with(result_form::PREFIX))
            .collect(),
        ..TypedInput::default()
    };
    if let Err(ApiError::InvalidFields { errors, .. }) = &result {
        typed.result_errors = errors.clone();
    }
    on.answer(typed, result).await
}

/// The worker's complete from the form: the note, and the typed result
/// read from the form's fields when the task has a result schema.
async fn submit(
    state: &AppState,
    worker: Uuid,
    id: Uuid,
    text: &str,
    pairs: &[(String, String)],
) -> Result<(), ApiError> {
    let note = Some(text).filter(|t| !t.trim().is_empty());
    let note = checked_optional_text("the note", note, MAX_TEXT_CHARS)?;
    let schema = state
        .store
        .task(id)
        .await?
        .filter(|t| t.worker_id == Some(worker))
        .ok_or_else(ApiError::task_not_found)?
        .result_schema;
    let result = match schema {
        None => None,
        Some(schema) => {
            let schema = ResultSchema::parse(&schema)
                .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored result schema: {e:?}")))?;
            let result = result_form::result_of(&schema, pairs).map_err(|errors| {
                ApiError::InvalidFields {
                    slug: "invalid-result",
                    detail: "some answers need another look".into(),
                    errors,
                }
            })?;
            Some(result)
        }
    };
    state.complete(id, worker, note, result).await.map(|_| ())
}

async fn stop(TaskForm { on, form }: TaskForm<TextForm>) -> Result<Response, AppError> {
    let worker = on.worker();
    let reason = Some(form.text.as_str()).filter(|t| !t.trim().is_empty());
    let command = if form.confirm.as_deref() != Some("yes") {
        Err(ApiError::invalid(
            "tick the box to confirm: stopping ends the task for the agent",
        ))
    } else {
        checked_optional_text("the reason", reason, MAX_TEXT_CHARS)
            .map(|reason| Command::Stop { worker, reason })
    };
    let typed = TypedInput {
        form: "stop",
        reason: form.text,
        ..TypedInput::default()
    };
    on.act(typed, command).await
}

/// A photo the signed-in worker sent for the task it holds (the result
/// form shows them to pick from); any other answers 404.
async fn own_photo(
    State(state): State<AppState>,
    s: WorkerSession,
    Path((task, photo)): Path<(String, String)>,
) -> Result<Response, AppError> {
    let not_found = || AppError::Api(ApiError::NotFound("no such photo".into()));
    let (Ok(task), Ok(photo)) = (Uuid::try_parse(&task), Uuid::try_parse(&photo)) else {
        return Err(not_found());
    };
    let holds = state
        .store
        .task(task)
        .await?
        .is_some_and(|t| t.worker_id == Some(s.worker.id));
    if !holds
        || !crate::routes::results::assignment_photos(&state, s.worker.id, task)
            .await?
            .contains(&photo)
    {
        return Err(not_found());
    }
    let stored = crate::routes::tasks::photo_answer(&state, task, photo).await?;
    stored.ok_or_else(not_found)
}

/// The upload form: a multipart body with `csrf` and `photo`. The photo
/// goes through the same checks and cleaning as the API's photo route.
async fn send_photo(
    State(state): State<AppState>,
    s: WorkerSession,
    TaskId(id): TaskId,
    mut multipart: Multipart,
) -> Result<Response, AppError> {
    let too_large = || {
        ApiError::TooLarge(format!(
            "the photo is too large: photos are limited to {} MB",
            state.photo_limits.max_bytes / 1_048_576
        ))
    };
    let unreadable = |e: MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::bad_request("unreadable-body", e.body_text())
        }
    };
    let mut csrf = None;
    let mut photo = None;
    let mut failure = None;
    let (mut lat, mut lon, mut accuracy) = (String::new(), String::new(), String::new());
    loop {
        match multipart.next_field().await {
            Ok(Some(field)) => match field.name() {
                Some("csrf") => csrf = field.text().await.ok(),
                Some("latitude") => lat = field.text().await.unwrap_or_default(),
                Some("longitude") => lon = field.text().await.unwrap_or_default(),
                Some("accuracy_m") => accuracy = field.text().await.unwrap_or_default(),
                Some("photo") => match field.bytes().await {
                    Ok(b) => photo = Some(b),
                    Err(e) => {
                        failure = Some(unreadable(e));
                        break;
                    }
                },
                _ => {}
            },
            Ok(None) => break,
            Err(e) => {
                failure = Some(unreadable(e));
                break;
            }
        }
    }
    // The token comes first in the form, so it is read even when the photo
    // is too large.
    s.check_csrf(csrf.as_deref())?;
    let result = match (failure, photo) {
        (Some(e), _) => Err(e),
        (None, Some(bytes)) if bytes.len() > state.photo_limits.max_bytes => Err(too_large()),
        (None, Some(bytes)) if !bytes.is_empty() => match form_position(&lat, &lon, &accuracy) {
            Ok(position) => {
                worker_tasks::send_photo_bytes(&state, s.worker.id, id, bytes, position)
                    .await
                    .map(|_| ())
            }
            Err(e) => Err(e),
        },
        (None, _) => Err(ApiError::invalid("choose a photo first")),
    };
    let on = OnTask {
        state,
        session: s,
        id,
    };
    on.answer(TypedInput::of("photo"), result).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_reads_like_a_person_would_say_it() {
        let now = DateTime::from_timestamp(1_000_000, 0).expect("time");
        let after = |s| now + chrono::TimeDelta::seconds(s);
        assert_eq!(time_left(after(-5), now), "time is up");
        assert_eq!(time_left(after(30), now), "less than a minute left");
        assert_eq!(time_left(after(59 * 60), now), "59 min left");
        assert_eq!(time_left(after(5 * 3600), now), "5 h left");
        assert_eq!(time_left(after(3 * 86400), now), "3 days left");
    }

    #[test]
    fn api_details_become_sentences() {
        assert_eq!(
            sentence("message must not be empty"),
            "Message must not be empty."
        );
        assert_eq!(sentence("Done."), "Done.");
        let (status, text) = human(&ApiError::task_not_found());
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(text.starts_with("This task is not available to you"));
    }
}
