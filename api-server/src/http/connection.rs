//! Driving one accepted connection to its end: a graceful shutdown when the
//! server stops, and for HTTP/2 a graceful close once the connection has
//! carried no request for a while.
//!
//! hyper closes an idle HTTP/1.1 keep-alive connection after the
//! header-read timeout. Its HTTP/2 server has no such timeout (pings only
//! find peers that went away), so a client could hold a connection, and one
//! of the server's connection slots, for ever without using it. [`Activity`]
//! counts an HTTP/2 connection's requests in flight. A request is in flight
//! until its response body is finished or dropped, so a long poll that is
//! waiting or an open event stream keeps its connection busy. [`drive`]
//! starts the connection's graceful shutdown (GOAWAY; streams already
//! started still finish) after `idle_timeout` with none in flight, counted
//! from the connection's start or from the end of its last request, as for
//! HTTP/1.1.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::watch;
use tokio::time::Instant;

/// The requests in flight on one connection.
#[derive(Debug)]
pub struct Activity {
    in_flight: AtomicUsize,
    /// When the last request ended (at first: when the connection started).
    last_ended: Mutex<Instant>,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            last_ended: Mutex::new(Instant::now()),
        })
    }

    /// Marks a request in flight until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// Since when the connection has carried no request; `None` while one
    /// is in flight.
    fn idle_since(&self) -> Option<Instant> {
        let last_ended = self
            .last_ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (self.in_flight.load(Ordering::SeqCst) == 0).then_some(*last_ended)
    }

    /// Resolves once the connection has carried no request for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        while let Some(wake) = next_look(self.idle_since(), Instant::now(), timeout) {
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// When to look again at a connection idle since `idle_since` (`None`:
/// busy), or `None` if it has been idle for `timeout` already. A busy
/// connection is looked at again a timeout later: its request may end any
/// time, so the close comes between one and two timeouts after it.
fn next_look(idle_since: Option<Instant>, now: Instant, timeout: Duration) -> Option<Instant> {
    match idle_since {
        Some(since) if since + timeout <= now => None,
        Some(since) => Some(since + timeout),
        None => Some(now + timeout),
    }
}

/// One request in flight; dropping it ends the request.
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // Under the lock, so `idle_since` never pairs the count after this
        // end with the time before it.
        let mut last_ended = self
            .0
            .last_ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *last_ended = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request in flight until the body is
/// finished (hyper drops it then) or dropped.
#[derive(Debug)]
pub struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl Tracked {
    pub fn new(body: Body, in_flight: InFlight) -> Self {
        Tracked {
            body,
            _in_flight: in_flight,
        }
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Drives `connection` until it ends. It is shut down gracefully (requests
/// in flight finish, no new ones start) when `shutdown` turns true or its
/// sender is dropped, or when `idle` is given and the connection has
/// carried no request for its timeout.
pub async fn drive<C>(
    connection: C,
    mut shutdown: watch::Receiver<bool>,
    idle: Option<(Arc<Activity>, Duration)>,
) -> Result<(), C::Error>
where
    C: GracefulConnection,
{
    tokio::pin!(connection);
    let closing = async {
        let idle = async {
            match &idle {
                Some((activity, timeout)) => activity.idle_for(*timeout).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.wait_for(|stopping| *stopping) => {}
            () = idle => {}
        }
    };
    tokio::select! {
        ended = connection.as_mut() => return ended,
        () = closing => {}
    }
    connection.as_mut().graceful_shutdown();
    connection.await
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(10);

    #[test]
    fn an_idle_connection_is_looked_at_again_when_its_timeout_is_up() {
        let start = Instant::now();
        let now = start + Duration::from_secs(4);
        assert_eq!(next_look(Some(start), now, TIMEOUT), Some(start + TIMEOUT));
    }

    #[test]
    fn a_connection_idle_for_the_timeout_is_closed() {
        let start = Instant::now();
        assert_eq!(next_look(Some(start), start + TIMEOUT, TIMEOUT), None);
        assert_eq!(next_look(Some(start), start + 3 * TIMEOUT, TIMEOUT), None);
    }

    #[test]
    fn a_busy_connection_is_not_closed_however_long_its_request_takes() {
        let now = Instant::now() + 100 * TIMEOUT;
        assert_eq!(next_look(None, now, TIMEOUT), Some(now + TIMEOUT));
    }

    #[test]
    fn requests_in_flight_are_counted_until_their_guards_drop() {
        let activity = Activity::new();
        assert!(activity.idle_since().is_some());
        let first = activity.begin();
        let second = activity.begin();
        drop(first);
        assert_eq!(activity.idle_since(), None, "one request still in flight");
        let before = Instant::now();
        drop(second);
        let since = activity.idle_since().expect("idle once both ended");
        assert!(since >= before, "the idle time counts from the last end");
    }
}
