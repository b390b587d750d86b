//! Request extractors whose rejections are problem documents: the JSON body,
//! path ids and query strings. Axum's own rejections are plain text.

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;

/// A JSON body. Malformed JSON is 400, a body of the wrong shape 422, a
/// missing `Content-Type: application/json` 415, a body over the limit 413.
#[derive(Debug, Clone, Copy, Default, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(
                "send the body as JSON with Content-Type: application/json".into(),
            ),
            JsonRejection::JsonSyntaxError(e) => {
                ApiError::bad_request("malformed-json", e.body_text())
            }
            JsonRejection::JsonDataError(e) => ApiError::invalid(e.body_text()),
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::TooLarge("the request body is too large".into())
            }
            other => ApiError::bad_request("unreadable-body", other.body_text()),
        }
    }
}

/// An optional JSON body: empty or `null` (what generated clients send for
/// "no body", as the OpenAPI document allows) is every default; otherwise
/// as [`Json`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OptionalJson<T>(pub T);

impl<T, S> FromRequest<S> for OptionalJson<T>
where
    T: Default + DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge("the request body is too large".into())
            } else {
                ApiError::bad_request("unreadable-body", r.body_text())
            }
        })?;
        optional_json(&headers, &body).map(OptionalJson)
    }
}

/// Reads [`OptionalJson`]'s body.
fn optional_json<T: Default + serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ApiError> {
    if body.is_empty() {
        return Ok(T::default());
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return Err(ApiError::UnsupportedMediaType(
            "send the body as JSON with Content-Type: application/json".into(),
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("malformed-json", e.to_string()))?;
    match value {
        serde_json::Value::Null => Ok(T::default()),
        // serde reads a struct from an array too; the document says object.
        object @ serde_json::Value::Object(_) => {
            serde_json::from_value(object).map_err(|e| ApiError::invalid(e.to_string()))
        }
        _ => Err(ApiError::invalid("the body is a JSON object")),
    }
}

/// Path parameters. A malformed id cannot name anything, so it is a 404.
#[derive(Debug, Clone, Copy, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        match r {
            PathRejection::FailedToDeserializePathParams(e) => {
                ApiError::NotFound(format!("no such resource: {}", e.body_text()))
            }
            other => ApiError::Internal(anyhow::anyhow!(other.body_text())),
        }
    }
}

/// A query string; anything malformed is a 400.
#[derive(Debug, Clone, Copy, Default, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::bad_request("invalid-query", r.body_text())
    }
}
