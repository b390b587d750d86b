//! The shared HTTP core: base URL, credentials, retries and error mapping.
//! Every resource handle sends through [`Client::send`].
//!
//! Credentials: a call that acts as a principal (create a task, register a
//! worker, list one's tasks, everything an operator does) carries the API
//! key (`Authorization: Bearer msk_…`) when the client has one, else the
//! development key; a task's own calls carry its agent token, or the API
//! key of the principal that owns it ([`Client::task_owned`]).
//!
//! Retries: a connection that fails, breaks or times out, and an answer of
//! 429 or 503, are retried with exponential backoff and jitter (or after
//! the server's `Retry-After`), up to [`RetryPolicy::max_attempts`]. A POST
//! carries one `Idempotency-Key` for all its attempts: when an attempt
//! reached the server but its answer was lost, the retry replays that
//! answer instead of applying the change a second time.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::error::{Error, Problem};
use crate::types::{
    AuditFilter, AuditPage, BlockList, CreateTask, CreatedTask, RegisterWorker, RegisteredWorker,
    TaskPage,
};
use crate::{
    CLIENT_ID_HEADER, DEV_KEY_HEADER, IDEMPOTENCY_KEY_HEADER, Invites, Keys, TaskHandle, TaskState,
    WorkerHandle, WorkersAdmin,
};

/// How often and how patiently transient failures are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per call, the first one included (1 = no retry).
    pub max_attempts: u32,
    /// Backoff before the first retry; doubles per retry.
    pub initial_backoff: Duration,
    /// Longest backoff, and the cap on a server's `Retry-After`.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// Backoff before retry number `retry` (0-based): exponential with
    /// "equal jitter", so concurrent clients spread out but never retry at
    /// once.
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.min(16)));
        let capped = exp.min(self.max_backoff);
        let half = capped / 2;
        half + rand::thread_rng().gen_range(Duration::ZERO..=half)
    }
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    keys: PrincipalKeys,
    retry: RetryPolicy,
    timeout: Duration,
    stream_idle_timeout: Duration,
}

impl ClientBuilder {
    /// The development key, needed to create tasks and register workers.
    pub fn dev_key(mut self, key: impl Into<String>) -> Self {
        self.keys.dev_key = Some(key.into());
        self
    }

    /// An API key (`msk_…`): the credential of the principal (an agent
    /// or an operator) this client acts as. Used instead of the
    /// development key wherever a call needs a principal, and for the
    /// tasks that principal owns ([`Client::task_owned`]).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.keys.api_key = Some(key.into());
        self
    }

    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Time limit of one ordinary request. A long poll adds its `wait`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long an event stream may stay silent (no event, no heartbeat)
    /// before the client reconnects.
    pub fn stream_idle_timeout(mut self, timeout: Duration) -> Self {
        self.stream_idle_timeout = timeout;
        self
    }

    pub fn build(self) -> Result<Client, Error> {
        let base = self.base_url.trim_end_matches('/').to_owned();
        let parsed = reqwest::Url::parse(&base)
            .map_err(|e| Error::Invalid(format!("the server URL {base:?} is not valid: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Error::Invalid(format!(
                "the server URL {base:?} must start with http:// or https://"
            )));
        }
        let user_agent = concat!("meatspace-client/", env!("CARGO_PKG_VERSION"));
        let http = reqwest::Client::builder()
            .user_agent(user_agent)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(Error::Transport)?;
        // Streams have no overall time limit, only an idle one: the
        // server's heartbeat comments keep a healthy stream busy.
        let stream = reqwest::Client::builder()
            .user_agent(user_agent)
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(self.stream_idle_timeout)
            .build()
            .map_err(Error::Transport)?;
        Ok(Client {
            inner: Arc::new(Inner {
                base,
                http,
                stream,
                keys: self.keys,
                retry: self.retry,
                timeout: self.timeout,
                client_id: Uuid::new_v4().to_string(),
            }),
        })
    }
}

/// The shared HTTP core. Cheap to clone; handles borrow nothing from it.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    base: String,
    http: reqwest::Client,
    stream: reqwest::Client,
    keys: PrincipalKeys,
    retry: RetryPolicy,
    timeout: Duration,
    /// Random per client: sent with the development key (which every
    /// agent shares) so that the server keeps this client's
    /// `Idempotency-Key` answers apart from every other agent's.
    client_id: String,
}

/// The keys of the principal a client acts as, kept out of logs.
#[derive(Clone, Default, derive_more::Debug)]
struct PrincipalKeys {
    #[debug(skip)]
    dev_key: Option<String>,
    #[debug(skip)]
    api_key: Option<String>,
}

/// Which credential a request carries.
#[derive(Clone, Copy)]
pub(crate) enum Auth<'a> {
    /// A public route (the OpenAPI document).
    Public,
    /// The principal the client acts as: its API key, else the
    /// development key.
    Principal,
    Bearer(&'a str),
}

/// A credential a handle keeps for all its calls. The token stays out of
/// logs.
#[derive(Clone, derive_more::Debug)]
pub(crate) enum Credential {
    /// A task's agent token or a worker's token.
    Token(#[debug(skip)] String),
    /// The client's principal ([`Auth::Principal`]).
    Principal,
}

impl Credential {
    pub(crate) fn auth(&self) -> Auth<'_> {
        match self {
            Credential::Token(t) => Auth::Bearer(t),
            Credential::Principal => Auth::Principal,
        }
    }
}

/// A request body, kept as bytes so every retry sends the same one.
#[derive(Clone)]
pub(crate) enum Body {
    Empty,
    Json(Vec<u8>),
    Raw {
        content_type: String,
        bytes: Vec<u8>,
    },
}

impl Body {
    pub(crate) fn json(value: &impl Serialize) -> Result<Body, Error> {
        serde_json::to_vec(value)
            .map(Body::Json)
            .map_err(|e| Error::Invalid(e.to_string()))
    }
}

/// One logical call: all its attempts share these.
pub(crate) struct Call<'a> {
    pub method: Method,
    pub path: String,
    pub auth: Auth<'a>,
    pub query: Vec<(&'static str, String)>,
    pub body: Body,
    /// Added to the client's timeout (a long poll's `wait`).
    pub extra_time: Duration,
    /// Send through the streaming client (no overall time limit).
    pub stream: bool,
    /// Further request headers (`Accept`, `Last-Event-ID`).
    pub headers: Vec<(&'static str, String)>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(method: Method, path: String, auth: Auth<'a>) -> Self {
        Call {
            method,
            path,
            auth,
            query: Vec::new(),
            body: Body::Empty,
            extra_time: Duration::ZERO,
            stream: false,
            headers: Vec::new(),
        }
    }

    pub(crate) fn body(mut self, body: Body) -> Self {
        self.body = body;
        self
    }

    /// `cursor` and `limit` of a paginated listing.
    pub(crate) fn page(&mut self, cursor: Option<&str>, limit: Option<u32>) {
        if let Some(c) = cursor {
            self.query.push(("cursor", c.to_owned()));
        }
        if let Some(l) = limit {
            self.query.push(("limit", l.to_string()));
        }
    }
}

/// A time as the API's query parameters take it.
pub(crate) fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

impl Client {
    /// A client of the server at `base_url` (`http://127.0.0.1:8080`).
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            keys: PrincipalKeys::default(),
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            stream_idle_timeout: Duration::from_secs(45),
        }
    }

    pub fn new(base_url: impl Into<String>) -> Result<Client, Error> {
        Client::builder(base_url).build()
    }

    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.retry
    }

    /// Whether the client has an API key (else principal calls use the
    /// development key).
    pub fn has_api_key(&self) -> bool {
        self.inner.keys.api_key.is_some()
    }

    /// Creates a task (API key with scope `tasks`, or the development
    /// key), owned by the caller's principal; the handle carries its token.
    pub async fn create_task(&self, req: &CreateTask) -> Result<(CreatedTask, TaskHandle), Error> {
        let call =
            Call::new(Method::POST, "/api/v1/tasks".into(), Auth::Principal).body(Body::json(req)?);
        let created: CreatedTask = self.json(call).await?;
        let handle = self.task(created.task.id, created.agent_token.clone());
        Ok((created, handle))
    }

    /// The server's OpenAPI document (public), e.g. to learn which
    /// optional routes it serves.
    pub async fn openapi(&self) -> Result<serde_json::Value, Error> {
        self.json(Call::new(
            Method::GET,
            "/api/v1/openapi.json".into(),
            Auth::Public,
        ))
        .await
    }

    /// The handle of an existing task, from its id and agent token.
    pub fn task(&self, id: Uuid, agent_token: impl Into<String>) -> TaskHandle {
        TaskHandle::new(self.clone(), id, Credential::Token(agent_token.into()))
    }

    /// The handle of a task the client's principal owns, authorised by the
    /// API key (or the development key) instead of the task's token: what
    /// an agent that lost its tokens uses, after [`Client::tasks`] found
    /// its tasks again. Another principal's task answers 404.
    pub fn task_owned(&self, id: Uuid) -> TaskHandle {
        TaskHandle::new(self.clone(), id, Credential::Principal)
    }

    /// One page of the caller's own tasks, newest first, optionally only
    /// those in `state` (`cursor`: the previous page's `next_cursor`).
    pub async fn tasks(
        &self,
        state: Option<TaskState>,
        cursor: Option<&str>,
    ) -> Result<TaskPage, Error> {
        self.tasks_page(state, cursor, None).await
    }

    /// [`Client::tasks`] with a page size (1-100; the server's default
    /// otherwise).
    pub async fn tasks_page(
        &self,
        state: Option<TaskState>,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<TaskPage, Error> {
        let mut call = Call::new(Method::GET, "/api/v1/tasks".into(), Auth::Principal);
        if let Some(state) = state {
            call.query.push(("state", state.as_str().to_owned()));
        }
        call.page(cursor, limit);
        self.json(call).await
    }

    /// API keys (operator).
    pub fn keys(&self) -> Keys {
        Keys::new(self.clone())
    }

    /// Registered workers, as an operator manages them.
    pub fn workers_admin(&self) -> WorkersAdmin {
        WorkersAdmin::new(self.clone())
    }

    /// Worker invites (operator).
    pub fn invites(&self) -> Invites {
        Invites::new(self.clone())
    }

    /// One page of the audit trail, newest first (operator).
    pub async fn audit(&self, filter: &AuditFilter) -> Result<AuditPage, Error> {
        let mut call = Call::new(Method::GET, "/api/v1/audit".into(), Auth::Principal);
        if let Some(p) = filter.principal {
            call.query.push(("principal", p.to_string()));
        }
        if let Some(t) = filter.since {
            call.query.push(("since", rfc3339(t)));
        }
        if let Some(t) = filter.until {
            call.query.push(("until", rfc3339(t)));
        }
        call.page(filter.cursor.as_deref(), filter.limit);
        self.json(call).await
    }

    /// The workers the caller's principal has blocked from its tasks.
    pub async fn blocks(&self) -> Result<BlockList, Error> {
        self.json(Call::new(
            Method::GET,
            "/api/v1/blocks".into(),
            Auth::Principal,
        ))
        .await
    }

    /// Blocks a worker from every task of the caller's principal
    /// (`block: true`), or lifts the block.
    /// Answers the principal's blocks as they are now.
    pub async fn block(&self, worker: Uuid, block: bool) -> Result<BlockList, Error> {
        let method = if block { Method::PUT } else { Method::DELETE };
        let call = Call::new(method, format!("/api/v1/blocks/{worker}"), Auth::Principal);
        self.json(call).await
    }

    /// Registers a worker (API key with scope `workers:register`, or the
    /// development key); the handle carries its token.
    pub async fn register_worker(
        &self,
        name: &str,
    ) -> Result<(RegisteredWorker, WorkerHandle), Error> {
        let call = Call::new(Method::POST, "/api/v1/workers".into(), Auth::Principal).body(
            Body::json(&RegisterWorker {
                name: name.to_owned(),
            })?,
        );
        let registered: RegisteredWorker = self.json(call).await?;
        let handle = self.worker(registered.worker_token.clone());
        Ok((registered, handle))
    }

    /// The handle of a registered worker, from its token.
    pub fn worker(&self, worker_token: impl Into<String>) -> WorkerHandle {
        WorkerHandle::new(self.clone(), worker_token.into())
    }

    /// Sends a call and decodes a JSON answer.
    pub(crate) async fn json<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<T, Error> {
        let res = self.send(call).await?;
        let bytes = res.bytes().await.map_err(Error::Transport)?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode(e.to_string()))
    }

    /// Sends a call with retries and returns the first success answer, or
    /// the error of the last attempt.
    pub(crate) async fn send(&self, call: Call<'_>) -> Result<reqwest::Response, Error> {
        let retry = self.inner.retry;
        // One key for every attempt of this call: the server replays the
        // first answer rather than apply the change again.
        let idempotency_key = (call.method == Method::POST).then(|| Uuid::new_v4().to_string());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= retry.max_attempts.max(1);
            let req = self.request(&call, idempotency_key.as_deref())?;
            match req.send().await {
                Ok(res) if res.status().is_success() => return Ok(res),
                Ok(res) => {
                    let status = res.status();
                    if !last && retriable_status(status) {
                        let delay = retry_after(res.headers())
                            .map(|d| d.min(retry.max_backoff))
                            .unwrap_or_else(|| retry.backoff(attempt - 1));
                        tracing::debug!(%status, ?delay, attempt, path = %call.path, "retrying");
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    return Err(error_from(res).await);
                }
                Err(e) => {
                    if !last && transient(&e) {
                        let delay = retry.backoff(attempt - 1);
                        tracing::debug!(error = %e, ?delay, attempt, path = %call.path, "retrying");
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    return Err(Error::Transport(e));
                }
            }
        }
    }

    fn request(
        &self,
        call: &Call<'_>,
        idempotency_key: Option<&str>,
    ) -> Result<reqwest::RequestBuilder, Error> {
        let url = format!("{}{}", self.inner.base, call.path);
        let mut req = if call.stream {
            self.inner.stream.request(call.method.clone(), url)
        } else {
            self.inner
                .http
                .request(call.method.clone(), url)
                .timeout(self.inner.timeout + call.extra_time)
        };
        if !call.query.is_empty() {
            req = req.query(&call.query);
        }
        req = match call.auth {
            Auth::Public => req,
            Auth::Principal => match (&self.inner.keys.api_key, &self.inner.keys.dev_key) {
                (Some(key), _) => req.header(AUTHORIZATION, format!("Bearer {key}")),
                (None, Some(key)) => req
                    .header(DEV_KEY_HEADER, key)
                    .header(CLIENT_ID_HEADER, &self.inner.client_id),
                (None, None) => {
                    return Err(Error::Invalid(
                        "this call needs an API key (msk_…) or the development key; none was \
                         given"
                            .into(),
                    ));
                }
            },
            Auth::Bearer(token) => req.header(AUTHORIZATION, format!("Bearer {token}")),
        };
        for (name, value) in &call.headers {
            req = req.header(*name, value.as_str());
        }
        if let Some(key) = idempotency_key {
            req = req.header(IDEMPOTENCY_KEY_HEADER, key);
        }
        req = match &call.body {
            Body::Empty => req,
            Body::Json(bytes) => req
                .header(CONTENT_TYPE, "application/json")
                .body(bytes.clone()),
            Body::Raw {
                content_type,
                bytes,
            } => req
                .header(CONTENT_TYPE, content_type.as_str())
                .body(bytes.clone()),
        };
        Ok(req)
    }
}

/// 429 and 503 say "try again later"; 502 and 504 come from a proxy whose
/// upstream is restarting.
fn retriable_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::BAD_GATEWAY
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// Failures worth another attempt: the server was not reached, or the
/// connection broke before the answer. A POST is still safe to repeat
/// because its Idempotency-Key makes the server replay the first answer.
fn transient(e: &reqwest::Error) -> bool {
    e.is_connect() || e.is_timeout() || e.is_request()
}

/// `Retry-After` as seconds or as an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    (at.to_utc() - chrono::Utc::now()).to_std().ok()
}

/// The typed error of a failed answer.
pub(crate) async fn error_from(res: reqwest::Response) -> Error {
    let status = res.status().as_u16();
    let is_problem = res
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/problem+json"));
    let body = match res.bytes().await {
        Ok(b) => b,
        Err(e) => return Error::Transport(e),
    };
    if is_problem && let Ok(mut problem) = serde_json::from_slice::<Problem>(&body) {
        problem.status = status;
        return Error::Problem(problem);
    }
    let mut text = String::from_utf8_lossy(&body).into_owned();
    if text.len() > 500 {
        let mut cut = 500;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    Error::Http { status, body: text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let first = p.backoff(0);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = p.backoff(2);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            assert!(p.backoff(30) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn reads_retry_after_seconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("5"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(5)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        // A date in the past means "now": no usable delay.
        assert_eq!(retry_after(&h), None);
        let later = (chrono::Utc::now() + chrono::TimeDelta::seconds(120)).to_rfc2822();
        h.insert(RETRY_AFTER, HeaderValue::from_str(&later).unwrap());
        let d = retry_after(&h).unwrap();
        assert!(d > Duration::from_secs(100) && d <= Duration::from_secs(120));
    }

    /// The credential headers a principal call carries.
    fn principal_headers(b: ClientBuilder) -> Result<HeaderMap, Error> {
        let client = b.build().unwrap();
        let call = Call::new(Method::POST, "/api/v1/tasks".into(), Auth::Principal);
        Ok(client
            .request(&call, None)?
            .build()
            .unwrap()
            .headers()
            .clone())
    }

    #[test]
    fn principal_calls_carry_the_api_key_else_the_dev_key() {
        let base = Client::builder("http://127.0.0.1:1");
        let h = principal_headers(base.clone().dev_key("msd_dev").api_key("msk_a_b")).unwrap();
        assert_eq!(h[AUTHORIZATION], "Bearer msk_a_b");
        assert!(
            h.get(DEV_KEY_HEADER).is_none(),
            "the dev key is not sent beside an API key"
        );
        let h = principal_headers(base.clone().dev_key("msd_dev")).unwrap();
        assert_eq!(h[DEV_KEY_HEADER], "msd_dev");
        assert!(h.get(CLIENT_ID_HEADER).is_some() && h.get(AUTHORIZATION).is_none());
        let e = principal_headers(base).unwrap_err();
        assert!(e.to_string().contains("API key"), "{e}");
    }

    #[test]
    fn an_owned_task_handle_authenticates_with_the_api_key() {
        let client = Client::builder("http://127.0.0.1:1")
            .api_key("msk_a_b")
            .build()
            .unwrap();
        let id = Uuid::new_v4();
        let owned = client.task_owned(id);
        assert_eq!(owned.token(), None);
        let with_token = client.task(id, "mst_t");
        assert_eq!(with_token.token(), Some("mst_t"));
        assert!(!format!("{client:?}{owned:?}").contains("msk_a_b"));
    }

    #[test]
    fn only_temporary_statuses_are_retried() {
        assert!(retriable_status(StatusCode::SERVICE_UNAVAILABLE));
        assert!(retriable_status(StatusCode::TOO_MANY_REQUESTS));
        assert!(!retriable_status(StatusCode::CONFLICT));
        assert!(!retriable_status(StatusCode::UNPROCESSABLE_ENTITY));
        assert!(!retriable_status(StatusCode::INTERNAL_SERVER_ERROR));
    }
}
