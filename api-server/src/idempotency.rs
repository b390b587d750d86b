//! `Idempotency-Key` on every state-changing `POST` (IETF httpapi draft
//! "The Idempotency-Key HTTP Header Field"), as one middleware.
//!
//! - The first request with a key claims it (a row in the store) and runs;
//!   its answer is recorded, sealed with the server key, for
//!   [`Integrations::idempotency_ttl`](crate::integrations::Integrations)
//!   (24 h by default).
//! - The same key with the same request replays that answer: same status,
//!   same body, plus `Idempotency-Replayed: true`.
//! - The same key with a different request (method, path, content type or
//!   body) is refused with 422; while the first is still running, with 409.
//! - Keys are scoped to the credential that sent them (the development key,
//!   an agent token or a worker token, by its SHA-256), so two clients never
//!   see each other's answers.
//!
//! A create's answer carries the agent token, which the store keeps only as
//! a digest. The record is therefore sealed (ChaCha20-Poly1305 under a key
//! derived from `MEATSPACE_SECRET_KEY`, bound to the record's scope and key)
//! and deleted when its window ends: a retried create hands back the same,
//! working token, and a database dump shows only ciphertext (see
//! [`meatspace_core::secret`]). Since the record lives in the database, a
//! server restart between the first request and the retry changes nothing.
//!
//! Answers that say nothing about the request (5xx, 401, 408, 429) are not
//! recorded: the claim is released and a retry runs again. A claim whose
//! process died mid-request is taken over after a lease of
//! [`LEASE`] rather than blocking the key for its whole window.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::TimeDelta;
use meatspace_core::clock;
use meatspace_core::store::{IdempotencyBegin, IdempotencyClaim};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::auth::DEV_KEY_HEADER;
use crate::error::{ApiError, problem};

/// The request header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on a replayed answer.
pub const REPLAYED: &str = "idempotency-replayed";
/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 255;
/// How long a claim holds while its request runs: longer than any request
/// may take (the server's request timeout is 40 s).
pub const LEASE: TimeDelta = TimeDelta::seconds(60);
/// Largest answer recorded (every JSON answer is far smaller).
const MAX_RECORDED_BYTES: usize = 1024 * 1024;

/// What is sealed and stored: enough to replay the answer.
#[derive(Debug, Serialize, Deserialize)]
struct Recorded {
    status: u16,
    content_type: Option<String>,
    location: Option<String>,
    body: String,
}

/// The middleware. Requests without the header, or not `POST`, pass
/// through untouched.
pub async fn middleware(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let Some(raw) = req.headers().get(IDEMPOTENCY_KEY) else {
        return next.run(req).await;
    };
    let key = match parse_key(raw) {
        Ok(key) => key,
        Err(e) => return e.into_response(),
    };
    // Without a credential the request is refused anyway (401); there is
    // nothing to scope the key to.
    let Some(scope) = scope_of(req.headers()) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let limit = state.photo_limits.max_bytes.max(crate::MAX_JSON_BYTES) + 64 * 1024;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return ApiError::TooLarge("the request body is too large".into()).into_response();
    };
    let fingerprint = fingerprint(&parts.method, &parts.uri, &parts.headers, &bytes);
    let claim = IdempotencyClaim {
        scope,
        key: key.clone(),
        fingerprint,
        now: clock::now(),
        lease: LEASE,
        ttl: state.integrations.idempotency_ttl,
    };
    let context = seal_context(&scope, &key);
    match state.store.idempotency_begin(&claim).await {
        Err(e) => return ApiError::from(e).into_response(),
        Ok(IdempotencyBegin::Started) => {}
        Ok(IdempotencyBegin::InFlight) => {
            let mut res = problem(
                StatusCode::CONFLICT,
                "idempotency-key-in-flight",
                "a request with this Idempotency-Key is still being processed; retry later".into(),
                None,
            );
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return res;
        }
        Ok(IdempotencyBegin::Mismatch) => {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "this Idempotency-Key was used for a different request; use a new key".into(),
                None,
            );
        }
        Ok(IdempotencyBegin::Completed { response, .. }) => {
            return match state
                .integrations
                .server_key
                .open(&context, &response)
                .ok()
                .and_then(|plain| serde_json::from_slice::<Recorded>(&plain).ok())
            {
                Some(recorded) => replay(recorded),
                None => {
                    // Sealed under another server key (it was rotated).
                    tracing::warn!("an idempotent answer cannot be opened with the current key");
                    problem(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "idempotency-key-unreadable",
                        "the answer recorded for this Idempotency-Key can no longer be read; use a new key"
                            .into(),
                        None,
                    )
                }
            };
        }
    }

    let res = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let status = res.status();
    let worth_recording = !(status.is_server_error()
        || matches!(
            status,
            StatusCode::UNAUTHORIZED | StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
        ));
    if !worth_recording {
        release(&state, &scope, &key).await;
        return res;
    }
    let (parts, body) = res.into_parts();
    let recorded = match axum::body::to_bytes(body, MAX_RECORDED_BYTES).await {
        Ok(bytes) => match String::from_utf8(bytes.to_vec()) {
            Ok(body) => Recorded {
                status: status.as_u16(),
                content_type: header_string(&parts.headers, header::CONTENT_TYPE),
                location: header_string(&parts.headers, header::LOCATION),
                body,
            },
            Err(e) => {
                release(&state, &scope, &key).await;
                return Response::from_parts(parts, Body::from(e.into_bytes()));
            }
        },
        Err(e) => {
            release(&state, &scope, &key).await;
            return ApiError::Internal(anyhow::anyhow!("reading an answer to record: {e}"))
                .into_response();
        }
    };
    let plain = serde_json::to_vec(&recorded).unwrap_or_default();
    let sealed = state.integrations.server_key.seal(&context, &plain);
    if let Err(e) = state
        .store
        .idempotency_complete(&scope, &key, recorded.status, &sealed)
        .await
    {
        // The answer is still given; a retry after the lease runs again.
        tracing::warn!(error = %e, "recording an idempotent answer failed");
    }
    Response::from_parts(parts, Body::from(recorded.body))
}

async fn release(state: &AppState, scope: &[u8; 32], key: &str) {
    if let Err(e) = state.store.idempotency_release(scope, key).await {
        tracing::warn!(error = %e, "releasing an idempotency key failed; it frees itself after its lease");
    }
}

fn replay(r: Recorded) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::OK);
    let mut res = (status, r.body).into_response();
    let h = res.headers_mut();
    if let Some(v) = r.content_type.and_then(|v| HeaderValue::from_str(&v).ok()) {
        h.insert(header::CONTENT_TYPE, v);
    }
    if let Some(v) = r.location.and_then(|v| HeaderValue::from_str(&v).ok()) {
        h.insert(header::LOCATION, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(REPLAYED, HeaderValue::from_static("true"));
    res
}

fn header_string(h: &HeaderMap, name: header::HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The key: 1-255 visible ASCII characters. The draft defines the field as
/// a Structured Field string (`"…"`); a bare token is accepted too.
fn parse_key(raw: &HeaderValue) -> Result<String, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "invalid-idempotency-key",
            format!("Idempotency-Key must be 1-{MAX_KEY_LEN} visible ASCII characters"),
        )
    };
    let s = raw.to_str().map_err(|_| bad())?.trim();
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    if s.is_empty()
        || s.len() > MAX_KEY_LEN
        || !s.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
    {
        return Err(bad());
    }
    Ok(s.to_owned())
}

/// SHA-256 of the credential the request presents: the development key or
/// the bearer token. The raw credential is never stored.
pub fn scope_of(h: &HeaderMap) -> Option<[u8; 32]> {
    let (kind, value) = if let Some(v) = h.get(header::AUTHORIZATION) {
        ("bearer", v)
    } else {
        ("dev-key", h.get(DEV_KEY_HEADER)?)
    };
    let mut d = Sha256::new();
    d.update(kind.as_bytes());
    d.update([0]);
    d.update(value.as_bytes());
    Some(d.finalize().into())
}

pub fn fingerprint(method: &Method, uri: &axum::http::Uri, h: &HeaderMap, body: &[u8]) -> [u8; 32] {
    let mut d = Sha256::new();
    for part in [
        method.as_str().as_bytes(),
        uri.path().as_bytes(),
        uri.query().unwrap_or_default().as_bytes(),
        h.get(header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes)
            .unwrap_or_default(),
    ] {
        d.update((part.len() as u64).to_be_bytes());
        d.update(part);
    }
    d.update(body);
    d.finalize().into()
}

/// Associated data of a sealed answer: it opens only under its own record.
fn seal_context(scope: &[u8; 32], key: &str) -> Vec<u8> {
    let mut c = scope.to_vec();
    c.extend(key.as_bytes());
    c
}

/// Documents the header on every `POST` of the OpenAPI document, and the
/// 409 and 422 it may cause.
pub fn document(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::{ObjectBuilder, Required, Type};
    for item in openapi.paths.paths.values_mut() {
        let Some(op) = item.post.as_mut() else {
            continue;
        };
        let param = ParameterBuilder::new()
            .name("Idempotency-Key")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "Makes the request safe to retry: the same key with the same request within the replay \
                 window returns the first answer (with `Idempotency-Replayed: true`); with another \
                 request 422; while the first is in flight 409. Scoped to the credential.",
            ))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .max_length(Some(MAX_KEY_LEN)),
            ))
            .build();
        op.parameters.get_or_insert_with(Vec::new).push(param);
        // What the key itself can cause, on every POST (an operation that
        // already lists the status keeps its own description).
        for (status, what) in [
            (
                "400",
                "Malformed request, or an Idempotency-Key that is not 1-255 visible ASCII characters",
            ),
            (
                "409",
                "A state conflict, or a request with this Idempotency-Key still in flight",
            ),
            (
                "422",
                "Invalid input, or an Idempotency-Key already used for a different request",
            ),
        ] {
            op.responses
                .responses
                .entry(status.to_owned())
                .or_insert_with(|| problem_response(what));
        }
    }
}

/// A problem+json response with this description.
fn problem_response(
    description: &str,
) -> utoipa::openapi::RefOr<utoipa::openapi::response::Response> {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr};
    RefOr::T(
        utoipa::openapi::ResponseBuilder::new()
            .description(description)
            .content(
                crate::error::PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_visible_ascii() {
        let ok = |s: &str| parse_key(&HeaderValue::from_str(s).unwrap()).ok();
        assert_eq!(ok("abc-123").as_deref(), Some("abc-123"));
        assert_eq!(ok("\"8e03978e\"").as_deref(), Some("8e03978e"));
        assert_eq!(ok(""), None);
        assert_eq!(ok("\"\""), None);
        assert_eq!(ok(&"k".repeat(256)), None);
        assert!(ok(&"k".repeat(255)).is_some());
    }

    #[test]
    fn fingerprints_tell_requests_apart() {
        let h = HeaderMap::new();
        let uri: axum::http::Uri = "/api/v1/tasks".parse().unwrap();
        let other: axum::http::Uri = "/api/v1/workers".parse().unwrap();
        let a = fingerprint(&Method::POST, &uri, &h, b"{}");
        assert_eq!(a, fingerprint(&Method::POST, &uri, &h, b"{}"));
        assert_ne!(a, fingerprint(&Method::POST, &uri, &h, b"{ }"));
        assert_ne!(a, fingerprint(&Method::POST, &other, &h, b"{}"));
    }

    #[test]
    fn scopes_follow_the_credential() {
        let mut a = HeaderMap::new();
        a.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        let mut b = HeaderMap::new();
        b.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer y"));
        let mut dev = HeaderMap::new();
        dev.insert(DEV_KEY_HEADER, HeaderValue::from_static("Bearer x"));
        assert_ne!(scope_of(&a), scope_of(&b));
        assert_ne!(scope_of(&a), scope_of(&dev));
        assert_eq!(scope_of(&HeaderMap::new()), None);
    }
}
