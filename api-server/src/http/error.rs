//! The API's one error type. Every error leaves the server as
//! `application/problem+json` (RFC 9457) with a stable `type`, a human
//! `detail` and the status that fits. Internal causes are logged, never
//! shown to the client.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
pub use meatspace_api_types::Problem;
use meatspace_domain::{Refusal, TaskState};
use meatspace_store::StoreError;

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Base of the `type` URIs; the suffix is the stable slug.
const TYPE_BASE: &str = "https://meatspace.dev/problems/";

/// The error responses of the OpenAPI document, one per status, each a
/// [`Problem`] served as `application/problem+json`. Operations name the
/// set of them they can return, one [`utoipa::IntoResponses`] type per set
/// of statuses (`responses((status = 200, ...), TaskReadErrors)`), so the
/// document says exactly what a client receives and each set is written
/// once. These types only describe responses; errors are built by
/// [`ApiError`].
pub mod responses {
    use std::collections::BTreeMap;

    use utoipa::openapi::{RefOr, response::Response};
    use utoipa::{IntoResponses, ToResponse};

    use super::Problem;

    /// The responses of `statuses`, each inlined from its type below.
    fn problems(statuses: &[u16]) -> BTreeMap<String, RefOr<Response>> {
        statuses
            .iter()
            .map(|status| {
                let response = match status {
                    400 => BadRequest::response().1,
                    401 => Unauthorized::response().1,
                    403 => Forbidden::response().1,
                    404 => NotFound::response().1,
                    409 => Conflict::response().1,
                    413 => PayloadTooLarge::response().1,
                    415 => UnsupportedMediaType::response().1,
                    422 => UnprocessableEntity::response().1,
                    503 => ServiceUnavailable::response().1,
                    other => unreachable!("no error response is described for status {other}"),
                };
                (status.to_string(), response)
            })
            .collect()
    }

    /// One set of error statuses, as an [`IntoResponses`] type.
    macro_rules! error_set {
        ($(#[$doc:meta])* $name:ident = [$($status:literal),+]) => {
            $(#[$doc])*
            #[derive(Debug)]
            pub struct $name;

            impl IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<Response>> {
                    problems(&[$($status),+])
                }
            }
        };
    }

    error_set!(
        /// Creating something from a JSON body (not on an existing task).
        CreateErrors = [400, 401, 413, 415, 422, 503]
    );
    error_set!(
        /// Reading a list near a point (422: a `near` that is not a point,
        /// or `within_m` without one).
        NearbyListErrors = [400, 401, 422, 503]
    );
    error_set!(
        /// Creating something that needs a scope of the caller's key.
        ScopedCreateErrors = [400, 401, 403, 413, 415, 422, 503]
    );
    error_set!(
        /// An operator's read of a list.
        AdminListErrors = [400, 401, 403, 503]
    );
    error_set!(
        /// An operator's action on one record.
        AdminActionErrors = [400, 401, 403, 404, 409, 413, 415, 422, 503]
    );
    error_set!(
        /// Reading a task or something on it.
        TaskReadErrors = [401, 404, 503]
    );
    error_set!(
        /// Reading a task's events with a query string (a page or a stream).
        TaskFeedErrors = [400, 401, 404, 503]
    );
    error_set!(
        /// A command on a task that takes no body.
        TaskCommandErrors = [401, 404, 409, 503]
    );
    error_set!(
        /// A command on a task with a body.
        TaskBodyCommandErrors = [400, 401, 404, 409, 413, 415, 422, 503]
    );

    /// Error responses of the document: each a [`Problem`] served as
    /// `application/problem+json`, with the headers given after its name.
    /// They describe the document and are never constructed.
    macro_rules! problem_responses {
        ($($(#[doc = $doc:literal])* $name:ident $(headers($($header:tt)*))?;)+) => {$(
            $(#[doc = $doc])*
            #[derive(Debug, utoipa::ToResponse)]
            #[response(
                content_type = "application/problem+json"
                $(, headers($($header)*))?
            )]
            #[allow(dead_code)]
            pub struct $name(Problem);
        )+};
    }

    problem_responses! {
        /// Malformed request: JSON syntax, an unreadable body or a bad query string.
        BadRequest;
        /// No credential, or one that is not valid.
        Unauthorized headers(("WWW-Authenticate" = String, description = "Always `Bearer`"));
        /// The API key lacks the scope this operation needs.
        Forbidden;
        /// No such task (or not the caller's), or no such resource on it.
        NotFound;
        /// The task's state does not allow this; `task_state` says what it is.
        /// Or (`task-event-limit`) the task's feed holds its limit of events
        /// (`limits.events_per_task` of the capabilities document).
        Conflict;
        /// The request body is over the limit.
        PayloadTooLarge;
        /// The body's `Content-Type` is not one this operation takes.
        UnsupportedMediaType;
        /// Well-formed but invalid input (a missing or out-of-range field).
        UnprocessableEntity;
        /// The database is unavailable; retry after the given seconds.
        ServiceUnavailable headers(("Retry-After" = u64, description = "Seconds to wait before retrying"));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{detail}")]
    BadRequest { slug: &'static str, detail: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    /// Well-formed input the request cannot be done with, for a reason
    /// with a slug of its own.
    #[error("{detail}")]
    Unprocessable { slug: &'static str, detail: String },
    /// A result schema or a result refused, with each error at its JSON
    /// pointer (the problem's `errors`).
    #[error("{detail}")]
    InvalidFields {
        slug: &'static str,
        detail: String,
        errors: Vec<meatspace_domain::result::FieldError>,
    },
    #[error("{detail}")]
    Conflict {
        slug: &'static str,
        detail: String,
        task_state: Option<TaskState>,
    },
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    TooManyRequests(String),
    /// The task holds as many photo bytes as one task may.
    #[error("{0}")]
    PhotoQuota(String),
    /// The credential or address holds as many event streams and long
    /// polls open as it may.
    #[error("{0}")]
    TooManyStreams(String),
    /// The credential is good but lacks the scope the request needs.
    #[error("{0}")]
    Forbidden(String),
    /// The development key was sent while it is turned off.
    #[error(
        "the development key is turned off on this server: ask an operator for an API key \
         (`meatspace key create`) and send it as Authorization: Bearer msk_..."
    )]
    DevKeyDisabled,
    #[error("the database is unavailable")]
    Unavailable,
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn bad_request(slug: &'static str, detail: impl Into<String>) -> Self {
        ApiError::BadRequest {
            slug,
            detail: detail.into(),
        }
    }

    pub fn invalid(detail: impl Into<String>) -> Self {
        ApiError::Invalid(detail.into())
    }

    pub fn task_not_found() -> Self {
        ApiError::NotFound("no such task, or it is not yours".into())
    }

    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest { slug, .. } => (StatusCode::BAD_REQUEST, slug),
            ApiError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid-input"),
            ApiError::Unprocessable { slug, .. } | ApiError::InvalidFields { slug, .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, slug)
            }
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "insufficient-scope"),
            ApiError::DevKeyDisabled => (StatusCode::UNAUTHORIZED, "dev-key-disabled"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed"),
            ApiError::Conflict { slug, .. } => (StatusCode::CONFLICT, slug),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type")
            }
            ApiError::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "rate-limited"),
            ApiError::PhotoQuota(_) => (StatusCode::PAYLOAD_TOO_LARGE, "photo-quota-exceeded"),
            ApiError::TooManyStreams(_) => (StatusCode::TOO_MANY_REQUESTS, "too-many-streams"),
            ApiError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "database-unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let detail = r.to_string();
        match r {
            Refusal::Terminal { state } => ApiError::Conflict {
                slug: "task-terminal",
                detail,
                task_state: Some(state),
            },
            Refusal::WrongState { state, .. } => ApiError::Conflict {
                slug: "wrong-state",
                detail,
                task_state: Some(state),
            },
            Refusal::DeadlinePassed => ApiError::Conflict {
                slug: "deadline-passed",
                detail,
                task_state: None,
            },
            Refusal::IssueNotOpen(..) => ApiError::Conflict {
                slug: "issue-not-open",
                detail,
                task_state: None,
            },
            Refusal::NotYourTask => ApiError::task_not_found(),
            Refusal::IssueNotFound(_) => ApiError::NotFound(detail),
            Refusal::TextRequired(_) => ApiError::Invalid(detail),
            Refusal::NothingDue => ApiError::Internal(anyhow::anyhow!(r)),
            Refusal::NotAnExtension { .. } | Refusal::BeyondMaxLifetime { .. } => {
                ApiError::Invalid(detail)
            }
            Refusal::EventLimit { .. } => ApiError::Conflict {
                slug: "task-event-limit",
                detail,
                task_state: None,
            },
            Refusal::PositionRequired => ApiError::Unprocessable {
                slug: "position-required",
                detail,
            },
            Refusal::OffSite { .. } => ApiError::Unprocessable {
                slug: "off-site",
                detail,
            },
            Refusal::ResultRequired | Refusal::ResultNotAsked => ApiError::Unprocessable {
                slug: "invalid-result",
                detail,
            },
            Refusal::VerdictTextRequired(_) => ApiError::Invalid(detail),
            Refusal::AlreadySubmitted => ApiError::Conflict {
                slug: "already-submitted",
                detail,
                task_state: None,
            },
            Refusal::NothingToReview { .. } | Refusal::NotReviewed => ApiError::Conflict {
                slug: "nothing-to-review",
                detail,
                task_state: None,
            },
            Refusal::RevisionLimit { .. } => ApiError::Conflict {
                slug: "revision-limit",
                detail,
                task_state: None,
            },
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::task_not_found(),
            StoreError::Refused(r) => r.into(),
            e if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                ApiError::Unavailable
            }
            e => ApiError::Internal(e.into()),
        }
    }
}

/// Builds a problem response; also used for errors raised outside handlers.
pub fn problem(
    status: StatusCode,
    slug: &str,
    detail: String,
    task_state: Option<TaskState>,
) -> Response {
    problem_with(status, slug, detail, task_state, Vec::new())
}

/// [`problem`] with errors at JSON pointers.
fn problem_with(
    status: StatusCode,
    slug: &str,
    detail: String,
    task_state: Option<TaskState>,
    errors: Vec<meatspace_domain::result::FieldError>,
) -> Response {
    let body = Problem {
        kind: format!("{TYPE_BASE}{slug}"),
        title: status.canonical_reason().unwrap_or("Error").to_owned(),
        status: status.as_u16(),
        detail,
        task_state,
        errors,
    };
    let mut res = (status, axum::Json(body)).into_response();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res
}

impl IntoResponse for ApiError {
    fn into_response(mut self) -> Response {
        let (status, slug) = self.parts();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(error = ?cause, "internal error");
        }
        let task_state = match &self {
            ApiError::Conflict { task_state, .. } => *task_state,
            _ => None,
        };
        let errors = match &mut self {
            ApiError::InvalidFields { errors, .. } => std::mem::take(errors),
            _ => Vec::new(),
        };
        let mut res = problem_with(status, slug, self.to_string(), task_state, errors);
        match self {
            ApiError::Unauthorized(_) | ApiError::DevKeyDisabled => {
                res.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Unavailable => {
                // The availability monitor sees a recovery within a second.
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        res
    }
}

/// Middleware: turns any error response not already a problem document
/// (the router's 404 and 405, a layer's 408 or 413, a panic's 500) into one,
/// so clients see a single error format.
pub async fn problem_for_every_error(res: Response) -> Response {
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    // The web app's pages carry their own human error page.
    let is_html = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    if is_problem || is_html {
        return res;
    }
    let (slug, detail) = match status {
        StatusCode::NOT_FOUND => ("not-found", "no such route"),
        StatusCode::METHOD_NOT_ALLOWED => {
            ("method-not-allowed", "this route does not take that method")
        }
        StatusCode::PAYLOAD_TOO_LARGE => ("payload-too-large", "the request body is too large"),
        StatusCode::REQUEST_TIMEOUT => ("timeout", "the request took too long"),
        s if s.is_server_error() => ("internal", "internal error"),
        _ => ("bad-request", "the request was not understood"),
    };
    let mut out = problem(status, slug, detail.to_owned(), None);
    for (name, value) in res.headers() {
        if name == header::ALLOW || name == header::RETRY_AFTER {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}
