//! The worker app's notification settings: where the worker works and
//! what it wants to hear about (a plain form), push in this browser (the
//! app's script and service worker, where the browser has a push
//! service), and the unsubscribe page that every message links to, which
//! works without signing in.

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use meatspace_api_types::NewPushSubscription;
use meatspace_domain::notify::{Area, Channel, Preferences};
use serde::Deserialize;
use uuid::Uuid;

use super::form::{ScriptJson, SessionForm, csrf_field};
use super::session::WorkerSession;
use super::{AppError, Nav, html};
use crate::AppState;
use crate::http::error::ApiError;
use crate::routes::notifications::{add_subscription, save_preferences};

const SERVICE_WORKER: &str = include_str!("../../static/sw.js");

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/app/settings", get(settings).post(save))
        .route("/app/push-subscriptions", post(subscribe))
        .route("/app/push-subscriptions/remove", post(unsubscribe_browser))
        .route("/app/sw.js", get(service_worker))
        .route("/app/unsubscribe", get(unsubscribe_page).post(unsubscribe))
}

#[derive(Template)]
#[template(path = "settings.html")]
struct SettingsPage {
    nav: Option<Nav>,
    csrf: String,
    latitude: String,
    longitude: String,
    radius_km: String,
    new_tasks: bool,
    my_tasks: bool,
    email: String,
    push_key: String,
    saved: bool,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SettingsQuery {
    #[serde(default)]
    saved: Option<String>,
}

async fn settings(
    State(state): State<AppState>,
    s: WorkerSession,
    Query(q): Query<SettingsQuery>,
) -> Result<Response, AppError> {
    let prefs = state
        .store
        .preferences(s.worker.id)
        .await?
        .unwrap_or_default();
    let area = prefs.area;
    Ok(html(&SettingsPage {
        nav: Some(Nav::of(&s)),
        csrf: s.csrf.clone(),
        latitude: area
            .map(|a| format!("{:.5}", a.latitude))
            .unwrap_or_default(),
        longitude: area
            .map(|a| format!("{:.5}", a.longitude))
            .unwrap_or_default(),
        radius_km: area
            .map(|a| trim_km(f64::from(a.radius_m) / 1000.0))
            .unwrap_or_else(|| "5".into()),
        new_tasks: prefs.new_tasks,
        my_tasks: prefs.my_tasks,
        email: prefs.email.unwrap_or_default(),
        push_key: state.integrations.vapid_public_key.clone(),
        saved: q.saved.is_some(),
        error: None,
    }))
}

/// `2.5`, `5`: kilometres as a person writes them.
fn trim_km(km: f64) -> String {
    let s = format!("{km:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[derive(Debug, Deserialize)]
struct SettingsForm {
    csrf: Option<String>,
    #[serde(default)]
    latitude: String,
    #[serde(default)]
    longitude: String,
    #[serde(default)]
    radius_km: String,
    /// A checkbox: present when ticked.
    new_tasks: Option<String>,
    my_tasks: Option<String>,
    #[serde(default)]
    email: String,
}
csrf_field!(SettingsForm);

impl SettingsForm {
    /// The preferences the form states, or what is wrong with it.
    fn preferences(&self) -> Result<Preferences, String> {
        let (lat, lon) = (self.latitude.trim(), self.longitude.trim());
        let area = if lat.is_empty() && lon.is_empty() {
            None
        } else {
            let number = |s: &str, what: &str| {
                s.parse::<f64>()
                    .map_err(|_| format!("The {what} must be a number, like 52.52."))
            };
            let km = self.radius_km.trim();
            let km: f64 = if km.is_empty() {
                5.0
            } else {
                km.parse()
                    .map_err(|_| "The distance must be a number of kilometres.".to_owned())?
            };
            if !km.is_finite() || km <= 0.0 {
                return Err("The distance must be more than 0 km.".into());
            }
            Some(Area {
                latitude: number(lat, "latitude")?,
                longitude: number(lon, "longitude")?,
                radius_m: (km * 1000.0).round().min(f64::from(u32::MAX)) as u32,
            })
        };
        let email = self.email.trim();
        Ok(Preferences {
            area,
            new_tasks: self.new_tasks.is_some(),
            my_tasks: self.my_tasks.is_some(),
            email: (!email.is_empty()).then(|| email.to_owned()),
        })
    }
}

async fn save(
    State(state): State<AppState>,
    SessionForm { session: s, form }: SessionForm<SettingsForm>,
) -> Result<Response, AppError> {
    let refused = |message: String| {
        let page = SettingsPage {
            nav: Some(Nav::of(&s)),
            csrf: s.csrf.clone(),
            latitude: form.latitude.clone(),
            longitude: form.longitude.clone(),
            radius_km: form.radius_km.clone(),
            new_tasks: form.new_tasks.is_some(),
            my_tasks: form.my_tasks.is_some(),
            email: form.email.clone(),
            push_key: state.integrations.vapid_public_key.clone(),
            saved: false,
            error: Some(message),
        };
        Ok((StatusCode::UNPROCESSABLE_ENTITY, html(&page)).into_response())
    };
    let prefs = match form.preferences() {
        Ok(prefs) => prefs,
        Err(message) => return refused(message),
    };
    match save_preferences(&state, s.worker.id, prefs).await {
        Ok(_) => Ok(Redirect::to("/app/settings?saved=1").into_response()),
        Err(ApiError::Invalid(message)) => refused(capitalized(&message)),
        Err(e) => Err(e.into()),
    }
}

fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// This browser's push subscription, from the app's script.
async fn subscribe(
    State(state): State<AppState>,
    ScriptJson { session: s, body }: ScriptJson<NewPushSubscription>,
) -> Result<Response, AppError> {
    let answer = add_subscription(&state, s.worker.id, body).await?;
    Ok(axum::Json(answer).into_response())
}

#[derive(Debug, Deserialize)]
struct Endpoint {
    endpoint: String,
}

/// The browser stopped its push subscription.
async fn unsubscribe_browser(
    State(state): State<AppState>,
    ScriptJson { session: s, body }: ScriptJson<Endpoint>,
) -> Result<Response, AppError> {
    state
        .store
        .remove_push_subscription(Some(s.worker.id), &body.endpoint)
        .await?;
    Ok(axum::Json(meatspace_api_types::PushSubscriptionState {
        endpoint: body.endpoint,
        subscribed: false,
    })
    .into_response())
}

async fn service_worker() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        SERVICE_WORKER,
    )
}

// ------------------------------------------------------------ unsubscribe

#[derive(Debug, Deserialize)]
struct UnsubscribeQuery {
    #[serde(default)]
    worker: String,
    #[serde(default)]
    channel: String,
    #[serde(default)]
    token: String,
}

impl UnsubscribeQuery {
    /// The worker and channel, when the token is this server's for them.
    fn verified(&self, state: &AppState) -> Option<(Uuid, Channel)> {
        let worker = Uuid::try_parse(&self.worker).ok()?;
        let channel = Channel::parse(&self.channel)?;
        state
            .integrations
            .server_key
            .unsubscribe_token_is(worker, channel.as_str(), &self.token)
            .then_some((worker, channel))
    }

    fn query_string(&self) -> String {
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("worker", &self.worker)
            .append_pair("channel", &self.channel)
            .append_pair("token", &self.token)
            .finish()
    }
}

#[derive(Template)]
#[template(path = "unsubscribe.html")]
struct UnsubscribePage {
    nav: Option<Nav>,
    channel: &'static str,
    action: String,
    done: bool,
}

fn channel_words(channel: Channel) -> &'static str {
    match channel {
        Channel::Email => "email",
        Channel::Push => "push notifications",
    }
}

fn bad_link() -> AppError {
    AppError::Page(
        StatusCode::NOT_FOUND,
        "Link not valid",
        "This unsubscribe link is not one of ours, or it was cut short. Copy the whole link \
         from the message, or change what you are told in the app's settings."
            .into(),
    )
}

/// Asks before unsubscribing: a GET changes nothing, so a mail scanner
/// that opens links does not unsubscribe anyone.
async fn unsubscribe_page(
    State(state): State<AppState>,
    Query(q): Query<UnsubscribeQuery>,
) -> Result<Response, AppError> {
    let (_, channel) = q.verified(&state).ok_or_else(bad_link)?;
    Ok(html(&UnsubscribePage {
        nav: None,
        channel: channel_words(channel),
        action: format!("/app/unsubscribe?{}", q.query_string()),
        done: false,
    }))
}

/// Stops the channel. The link's token is the credential, so this works
/// without signing in, from the page's button or as the one-click POST of
/// a mail client (RFC 8058).
async fn unsubscribe(
    State(state): State<AppState>,
    Query(q): Query<UnsubscribeQuery>,
) -> Result<Response, AppError> {
    let (worker, channel) = q.verified(&state).ok_or_else(bad_link)?;
    state
        .store
        .unsubscribe(worker, channel, state.clock.now())
        .await?;
    Ok(html(&UnsubscribePage {
        nav: None,
        channel: channel_words(channel),
        action: String::new(),
        done: true,
    }))
}
