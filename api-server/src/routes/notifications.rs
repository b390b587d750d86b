//! A worker's notification settings: its area and what it wants to hear
//! about, and the browsers it gets Web Push in. Who is told what is
//! decided by the controller ([`meatspace_controller::notify`]).

use axum::extract::State;
use meatspace_api_types::{NewPushSubscription, Preferences, PushKey, PushSubscriptionState};
use meatspace_domain::notify::PreferenceError;
use meatspace_store::notify::PushSubscription;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::AppState;
use crate::auth::WorkerAuth;
use crate::http::error::ApiError;
use crate::http::error::responses::{TaskBodyCommandErrors, TaskReadErrors};
use crate::http::extract::Json;

/// Longest push endpoint accepted.
pub const MAX_ENDPOINT_CHARS: usize = 2048;
/// Most browsers one worker gets push in; a new one beyond it replaces the
/// oldest.
pub const MAX_PUSH_SUBSCRIPTIONS: usize = 10;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(preferences, set_preferences))
        .routes(routes!(push_key))
        .routes(routes!(subscribe, unsubscribe))
}

/// The calling worker's notification preferences.
#[utoipa::path(get, path = "/api/v1/worker/preferences", tag = "worker",
    responses((status = 200, body = Preferences), TaskReadErrors))]
async fn preferences(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
) -> Result<axum::Json<Preferences>, ApiError> {
    let prefs = state
        .store
        .preferences(worker)
        .await?
        .ok_or_else(|| super::no_such("worker"))?;
    Ok(axum::Json(prefs))
}

/// Replaces the calling worker's notification preferences: its area (a
/// point and a distance), whether to hear of new tasks there and of its
/// own tasks, and where email goes (none: no email; removing the address
/// withdraws email not yet sent).
#[utoipa::path(put, path = "/api/v1/worker/preferences", tag = "worker",
    request_body = Preferences,
    responses((status = 200, body = Preferences), TaskBodyCommandErrors))]
async fn set_preferences(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    Json(prefs): Json<Preferences>,
) -> Result<axum::Json<Preferences>, ApiError> {
    let prefs = save_preferences(&state, worker, prefs).await?;
    Ok(axum::Json(prefs))
}

/// Checks and stores a worker's preferences (the API and the app's form).
pub async fn save_preferences(
    state: &AppState,
    worker: Uuid,
    prefs: Preferences,
) -> Result<Preferences, ApiError> {
    let prefs = prefs.checked().map_err(|e| match e {
        PreferenceError::Area(_) | PreferenceError::Email => ApiError::invalid(e.to_string()),
    })?;
    if !state
        .store
        .set_preferences(worker, &prefs, state.clock.now())
        .await?
    {
        return Err(super::no_such("worker"));
    }
    Ok(prefs)
}

/// The server's VAPID public key, which the worker app subscribes to push
/// with.
#[utoipa::path(get, path = "/api/v1/worker/push-key", tag = "worker",
    responses((status = 200, body = PushKey), TaskReadErrors))]
async fn push_key(
    State(state): State<AppState>,
    _worker: WorkerAuth,
) -> Result<axum::Json<PushKey>, ApiError> {
    Ok(axum::Json(PushKey {
        public_key: state.integrations.vapid_public_key.clone(),
    }))
}

/// Adds a browser's push subscription (the Push API's
/// `PushSubscription.toJSON()`); a worker keeps at most ten, the oldest
/// going first.
#[utoipa::path(post, path = "/api/v1/worker/push-subscriptions", tag = "worker",
    request_body = NewPushSubscription,
    responses((status = 200, body = PushSubscriptionState), TaskBodyCommandErrors))]
async fn subscribe(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    Json(body): Json<NewPushSubscription>,
) -> Result<axum::Json<PushSubscriptionState>, ApiError> {
    add_subscription(&state, worker, body).await.map(axum::Json)
}

/// Checks and stores a push subscription (the API and the app's script).
pub async fn add_subscription(
    state: &AppState,
    worker: Uuid,
    body: NewPushSubscription,
) -> Result<PushSubscriptionState, ApiError> {
    let subscription = checked_subscription(body)?;
    let existing = state.store.push_subscriptions(worker).await?;
    if !existing.iter().any(|s| s.endpoint == subscription.endpoint) {
        let over = (existing.len() + 1).saturating_sub(MAX_PUSH_SUBSCRIPTIONS);
        for old in existing.iter().take(over) {
            state
                .store
                .remove_push_subscription(Some(worker), &old.endpoint)
                .await?;
        }
    }
    state
        .store
        .add_push_subscription(worker, &subscription, state.clock.now())
        .await?;
    Ok(PushSubscriptionState {
        endpoint: subscription.endpoint,
        subscribed: true,
    })
}

/// The endpoint an http(s) URL of bounded length, the keys a P-256 point
/// and a 16-byte secret: what a push can be encrypted for.
fn checked_subscription(body: NewPushSubscription) -> Result<PushSubscription, ApiError> {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    if body.endpoint.chars().count() > MAX_ENDPOINT_CHARS {
        return Err(ApiError::invalid(format!(
            "endpoint: at most {MAX_ENDPOINT_CHARS} characters"
        )));
    }
    meatspace_domain::webhook_url::parse_url(&body.endpoint)
        .map_err(|e| ApiError::invalid(format!("endpoint: {e}")))?;
    let decode = |s: &str| URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).ok();
    match decode(&body.keys.p256dh) {
        Some(point) if point.len() == 65 && point[0] == 4 => {}
        _ => {
            return Err(ApiError::invalid(
                "keys.p256dh: an uncompressed P-256 public key (65 bytes), base64url",
            ));
        }
    }
    if decode(&body.keys.auth).is_none_or(|b| b.len() != 16) {
        return Err(ApiError::invalid("keys.auth: a 16-byte secret, base64url"));
    }
    Ok(PushSubscription {
        endpoint: body.endpoint,
        p256dh: body.keys.p256dh,
        auth: body.keys.auth,
    })
}

/// Body of removing a push subscription.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushEndpoint {
    pub endpoint: String,
}

/// Removes one of the calling worker's push subscriptions (the browser
/// unsubscribed).
#[utoipa::path(delete, path = "/api/v1/worker/push-subscriptions", tag = "worker",
    request_body = PushEndpoint,
    responses((status = 200, body = PushSubscriptionState), TaskBodyCommandErrors))]
async fn unsubscribe(
    State(state): State<AppState>,
    WorkerAuth(worker): WorkerAuth,
    Json(body): Json<PushEndpoint>,
) -> Result<axum::Json<PushSubscriptionState>, ApiError> {
    state
        .store
        .remove_push_subscription(Some(worker), &body.endpoint)
        .await?;
    Ok(axum::Json(PushSubscriptionState {
        endpoint: body.endpoint,
        subscribed: false,
    }))
}
