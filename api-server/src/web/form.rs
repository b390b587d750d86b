//! The extractors behind every form of the web app, so a handler receives
//! a form that has already passed its checks and stays a few lines (as
//! realworld-axum-sqlx's `AuthUser` does for its handlers).
//!
//! Each runs the checks in one order, the order the handlers used to spell
//! out: the session (a cross-site post is refused first, a missing or
//! stale session goes to the sign-in page), then the form body, then its
//! CSRF token, then the task the path names.

use axum::extract::{Form, FromRequest, FromRequestParts, Path, Request};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::session::{self, SameOrigin, WorkerSession};
use super::{AppError, OnTask};
use crate::AppState;
use crate::http::error::ApiError;
use crate::http::extract::Json;

/// A form that carries a CSRF token.
pub trait CsrfField {
    /// The submitted token, if the form carried one.
    fn csrf(&self) -> Option<&str>;
}

/// Implements [`CsrfField`] for forms that carry their token in a field
/// `csrf: Option<String>`.
macro_rules! csrf_field {
    ($($form:ty),+) => {$(
        impl $crate::web::form::CsrfField for $form {
            fn csrf(&self) -> Option<&str> {
                self.csrf.as_deref()
            }
        }
    )+};
}
pub(crate) use csrf_field;

/// Reads `P` from the request's head and `B` from its body, then refuses
/// the request unless `check` accepts its CSRF token (given `P`, the
/// request's headers and `B`).
async fn checked<P, B>(
    req: Request,
    state: &AppState,
    check: impl FnOnce(&P, &HeaderMap, &B) -> Result<(), AppError>,
) -> Result<(P, B), Response>
where
    P: FromRequestParts<AppState>,
    P::Rejection: IntoResponse,
    B: FromRequest<AppState>,
    B::Rejection: IntoResponse,
{
    let (mut parts, body) = req.into_parts();
    let head = P::from_request_parts(&mut parts, state)
        .await
        .map_err(IntoResponse::into_response)?;
    let headers = parts.headers.clone();
    let body = B::from_request(Request::from_parts(parts, body), state)
        .await
        .map_err(IntoResponse::into_response)?;
    check(&head, &headers, &body).map_err(IntoResponse::into_response)?;
    Ok((head, body))
}

/// [`checked`] for a form that carries its CSRF token.
async fn checked_form<P, F>(
    req: Request,
    state: &AppState,
    check: impl FnOnce(&P, &HeaderMap, Option<&str>) -> Result<(), AppError>,
) -> Result<(P, F), Response>
where
    P: FromRequestParts<AppState>,
    P::Rejection: IntoResponse,
    F: DeserializeOwned + CsrfField + Send,
{
    let (head, Form(form)) = checked(req, state, |head, headers, Form(form): &Form<F>| {
        check(head, headers, form.csrf())
    })
    .await?;
    Ok((head, form))
}

/// A form posted by a signed-in worker, its CSRF token checked against
/// the session.
#[derive(Debug)]
pub struct SessionForm<F> {
    pub session: WorkerSession,
    pub form: F,
}

impl<F> FromRequest<AppState> for SessionForm<F>
where
    F: DeserializeOwned + CsrfField + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (session, form) = checked_form(req, state, |s: &WorkerSession, _, token| {
            s.check_csrf(token)
        })
        .await?;
        Ok(SessionForm { session, form })
    }
}

/// A form about one task (`/app/tasks/{task_id}/...`): the signed-in
/// worker acting on the task, and the form, read as a [`SessionForm`] is.
#[derive(Debug)]
pub struct TaskForm<F> {
    pub on: OnTask,
    pub form: F,
}

impl<F> FromRequest<AppState> for TaskForm<F>
where
    F: DeserializeOwned + CsrfField + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let ((Path(raw), session), form) = checked_form(
            req,
            state,
            |(_, s): &(Path<String>, WorkerSession), _, token| s.check_csrf(token),
        )
        .await?;
        let id = task_id(&raw).map_err(IntoResponse::into_response)?;
        let on = OnTask {
            state: state.clone(),
            session,
            id,
        };
        Ok(TaskForm { on, form })
    }
}

/// A form posted before signing in (the invite and sign-in forms): the
/// browser must not say it comes from elsewhere, and its CSRF token must
/// derive from the pre-session cookie. The handler gets the state and the
/// headers with it, to start the session or show the page again.
#[derive(Debug)]
pub struct SignInForm<F> {
    pub state: AppState,
    pub headers: HeaderMap,
    pub form: F,
}

impl<F> FromRequest<AppState> for SignInForm<F>
where
    F: DeserializeOwned + CsrfField + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let ((SameOrigin, headers), form) =
            checked_form(req, state, |_: &(SameOrigin, HeaderMap), headers, token| {
                session::check_csrf(session::pre_session_value(state, headers), token)
            })
            .await?;
        Ok(SignInForm {
            state: state.clone(),
            headers,
            form,
        })
    }
}

/// The task a page's path names (`/app/tasks/{task_id}`); anything that
/// is not a task id names no task.
#[derive(Debug, Clone, Copy)]
pub struct TaskId(pub Uuid);

impl FromRequestParts<AppState> for TaskId {
    type Rejection = AppError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| AppError::Api(ApiError::task_not_found()))?;
        task_id(&raw).map(TaskId)
    }
}

fn task_id(raw: &str) -> Result<Uuid, AppError> {
    Uuid::try_parse(raw).map_err(|_| AppError::Api(ApiError::task_not_found()))
}

/// The header in which the app's script sends the CSRF token with its JSON.
const CSRF_HEADER: &str = "x-csrf-token";

/// JSON the app's script posts for the signed-in worker, the session's
/// CSRF token in the `x-csrf-token` header.
#[derive(Debug)]
pub struct ScriptJson<T> {
    pub session: WorkerSession,
    pub body: T,
}

impl<T> FromRequest<AppState> for ScriptJson<T>
where
    T: DeserializeOwned + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (session, Json(body)) =
            checked(req, state, |s: &WorkerSession, headers, _: &Json<T>| {
                s.check_csrf(headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()))
            })
            .await?;
        Ok(ScriptJson { session, body })
    }
}
