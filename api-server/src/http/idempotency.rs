//! `Idempotency-Key` on every state-changing `POST` of the API (IETF
//! httpapi draft "The Idempotency-Key HTTP Header Field"), as one
//! middleware over the API's routes only (not `/mcp`, `/app` or unknown
//! paths), run once the route is matched.
//!
//! - The first request with a key claims it (a row in the store) and runs;
//!   its answer is recorded, sealed with the server key, for
//!   [`Integrations::idempotency_ttl`](crate::agent_integrations::Integrations)
//!   (24 h by default).
//! - The same key with the same request replays that answer: same status,
//!   same body, plus `Idempotency-Replayed: true`.
//! - The same key with a different request (method, path, content type or
//!   body) is refused with 422; while the first is still running, with 409.
//! - Keys are scoped to the authenticated principal ([`Principal`]): an
//!   agent token's task, a worker token's worker, or the development key
//!   together with the client's identity where it sends one
//!   ([`CLIENT_ID`]): every agent shares the development key today, so
//!   without it two agents that pick the same key would see each other's
//!   answers. A request whose credential does not verify is passed on
//!   untouched (it is refused 401): nothing is read or recorded for it,
//!   so an anonymous client cannot make the server buffer bodies or
//!   write rows.
//! - The body is read up to the route's own limit (the photo route's for
//!   photos, 64 KiB for every other route).
//!
//! A create's answer carries the agent token, which the store keeps only as
//! a digest. The record is therefore sealed (ChaCha20-Poly1305 under a key
//! derived from `MEATSPACE_SECRET_KEY`, bound to the record's scope and key)
//! and deleted when its window ends: a retried create hands back the same,
//! working token, and a database dump shows only ciphertext (see
//! [`meatspace_store::secret`]). Since the record lives in the database, a
//! server restart between the first request and the retry changes nothing.
//!
//! Only 2xx answers and the domain's 4xx (400, 404, 409, 410, 422) are
//! recorded; any other (5xx, 401, 408, 413, 415, 429, ...) says nothing
//! lasting about the request: the claim is released and a retry runs
//! again. So is an answer larger than [`MAX_RECORDED_BYTES`], which is
//! still given in full. A claim whose process died mid-request is taken
//! over after a lease of [`LEASE`] rather than blocking the key for its
//! whole window.

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::TimeDelta;
use meatspace_store::{idempotency::IdempotencyBegin, idempotency::IdempotencyClaim};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::auth::{self, Principal};
use crate::http::error::{ApiError, problem};

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
pub const MAX_RECORDED_BYTES: usize = 1024 * 1024;
/// Request header naming the client (any 1-255 visible ASCII characters,
/// e.g. a random id per agent process): part of the scope of keys sent
/// with the development key, which every agent shares.
pub const CLIENT_ID: &str = "x-meatspace-client-id";

/// Statuses whose answers are recorded and replayed: success, and the
/// domain's refusals of the request itself.
fn worth_recording(status: StatusCode) -> bool {
    status.is_success()
        || matches!(
            status,
            StatusCode::BAD_REQUEST
                | StatusCode::NOT_FOUND
                | StatusCode::CONFLICT
                | StatusCode::GONE
                | StatusCode::UNPROCESSABLE_ENTITY
        )
}

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
    // A credential that does not verify gets its 401 from the route, with
    // nothing buffered or recorded here.
    let principal = match auth::principal(&state, req.headers()).await {
        Ok(Some(principal)) => principal,
        Ok(None) => return next.run(req).await,
        Err(e) => return e.into_response(),
    };
    let scope = scope_of(principal, req.headers());
    let limit = match req.extensions().get::<MatchedPath>() {
        Some(path) if path.as_str() == crate::routes::worker_tasks::PHOTO_PATH => {
            state.photo_limits.max_bytes
        }
        _ => crate::MAX_JSON_BYTES,
    };
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return ApiError::TooLarge(format!(
            "the request body is larger than this route's limit of {limit} bytes"
        ))
        .into_response();
    };
    let fingerprint = fingerprint(&parts.method, &parts.uri, &parts.headers, &bytes);
    let claim = IdempotencyClaim {
        scope,
        key: key.clone(),
        fingerprint,
        now: state.clock.now(),
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
    if !worth_recording(status) {
        release(&state, &scope, &key).await;
        return res;
    }
    let (parts, body) = res.into_parts();
    let bytes = match read_up_to(body, MAX_RECORDED_BYTES).await {
        Ok(Ok(bytes)) => bytes,
        // Too large to record: given whole, not recorded.
        Ok(Err(whole)) => {
            release(&state, &scope, &key).await;
            return Response::from_parts(parts, whole);
        }
        Err(e) => {
            release(&state, &scope, &key).await;
            return ApiError::Internal(anyhow::anyhow!("reading an answer to record: {e}"))
                .into_response();
        }
    };
    let recorded = match String::from_utf8(bytes) {
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

/// The body of an answer: `Ok(bytes)` when it holds at most `max` bytes,
/// else `Err` with a body that streams the whole answer (what was read,
/// then the rest).
async fn read_up_to(body: Body, max: usize) -> Result<Result<Vec<u8>, Body>, axum::Error> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut read = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        read.extend_from_slice(&chunk);
        if read.len() > max {
            let head =
                futures::stream::once(async move { Ok::<_, axum::Error>(Bytes::from(read)) });
            return Ok(Err(Body::from_stream(head.chain(stream))));
        }
    }
    Ok(Ok(read))
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
/// a Structured Field string (`"…"`); a bare token is accepted too. The
/// limit is on the field as sent, quotes included, as the OpenAPI document
/// states it: a quoted 255-character key is 257 characters and refused.
fn parse_key(raw: &HeaderValue) -> Result<String, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "invalid-idempotency-key",
            format!(
                "Idempotency-Key must be 1-{MAX_KEY_LEN} visible ASCII characters, quotes included"
            ),
        )
    };
    let sent = raw.to_str().map_err(|_| bad())?;
    if sent.len() > MAX_KEY_LEN {
        return Err(bad());
    }
    let sent = sent.trim();
    let s = sent
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(sent);
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(bad());
    }
    Ok(s.to_owned())
}

/// The scope of a key: SHA-256 of the principal, and for the development
/// key of the client id the request sends, if any. No credential is part
/// of it, so none is stored.
pub fn scope_of(principal: Principal, h: &HeaderMap) -> [u8; 32] {
    let mut d = Sha256::new();
    match principal {
        Principal::DevKey => {
            d.update(b"dev-key\0");
            if let Some(client) = h.get(CLIENT_ID) {
                d.update(b"client\0");
                d.update(client.as_bytes());
            }
        }
        Principal::Key(principal) => {
            d.update(b"principal\0");
            d.update(principal.as_bytes());
        }
        Principal::Agent(task) => {
            d.update(b"agent\0");
            d.update(task.as_bytes());
        }
        Principal::Worker(worker) => {
            d.update(b"worker\0");
            d.update(worker.as_bytes());
        }
    }
    d.finalize().into()
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
                 request 422; while the first is in flight 409. Scoped to the authenticated principal \
                 (the task of an agent token, the worker of a worker token; the development key \
                 together with the X-Meatspace-Client-Id header when sent).",
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
                "Malformed request, or an Idempotency-Key that is not 1-255 visible ASCII characters (quotes included)",
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
                crate::http::error::PROBLEM_JSON,
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
        // The quotes count: what the document's maxLength measures.
        assert_eq!(ok(&format!("\"{}\"", "k".repeat(254))), None);
        assert!(ok(&format!("\"{}\"", "k".repeat(253))).is_some());
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
    fn scopes_follow_the_principal_and_the_dev_key_clients_identity() {
        let id = uuid::Uuid::new_v4();
        let none = HeaderMap::new();
        let client = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CLIENT_ID, HeaderValue::from_static(v));
            h
        };
        assert_ne!(
            scope_of(Principal::Agent(id), &none),
            scope_of(Principal::Worker(id), &none)
        );
        assert_ne!(
            scope_of(Principal::DevKey, &client("a")),
            scope_of(Principal::DevKey, &client("b"))
        );
        assert_ne!(
            scope_of(Principal::DevKey, &client("a")),
            scope_of(Principal::DevKey, &none)
        );
        assert_eq!(
            scope_of(Principal::DevKey, &client("a")),
            scope_of(Principal::DevKey, &client("a"))
        );
        // The client id scopes only the shared development key.
        assert_eq!(
            scope_of(Principal::Agent(id), &client("a")),
            scope_of(Principal::Agent(id), &none)
        );
    }
}
