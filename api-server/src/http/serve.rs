//! The accept loop: connections, their limits and protocols, and the
//! graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::Request;
use tokio::net::TcpListener;

use crate::http::{connection, protocol};

/// How often an HTTP/2 connection is pinged, and how long the answer may take.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);

/// Limits of the HTTP server's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Time a client has to send a request's headers, counted from the
    /// connection's start or from the end of the previous response: a
    /// client trickling headers (slowloris) or an idle keep-alive
    /// connection is closed after it. An HTTP/2 connection is closed
    /// (gracefully) once it has carried no request for as long.
    pub header_read_timeout: Duration,
    /// Most connections open at once; past it the server stops accepting
    /// (new clients wait in the listen backlog) until one closes.
    pub max_connections: usize,
    /// Requests one HTTP/2 connection may have in flight at once.
    pub http2_max_streams: u32,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 20_000,
            http2_max_streams: 1_000,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then finishes the
/// requests in flight. Close the [`Feed`](crate::feed::Feed) in `shutdown` so that long polls
/// answer at once instead of holding the shutdown up.
///
/// The accept loop is hyper's rather than `axum::serve`, for what
/// `axum::serve` does not offer: a header-read timeout (which hyper also
/// applies to idle HTTP/1.1 keep-alive connections), a cap on concurrent
/// connections, so a slow or idle client cannot hold sockets for ever, and
/// HTTP/2 with prior knowledge next to HTTP/1.1 on the same port (see
/// [`protocol`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper::body::Incoming;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use std::convert::Infallible;
    use tower::ServiceExt;

    // u32: what `acquire_many` takes back at shutdown.
    let max_connections = u32::try_from(options.max_connections)
        .unwrap_or(u32::MAX)
        .max(1);
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections as usize));
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true);
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.http2_max_streams)
        // Pings find peers that went away without closing the connection.
        .keep_alive_interval(Some(HTTP2_PING_INTERVAL))
        .keep_alive_timeout(HTTP2_PING_INTERVAL);
    let (http1, http2) = (Arc::new(http1), Arc::new(http2));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors or similar: pause rather than spin.
                    tracing::error!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let (http1, http2) = (Arc::clone(&http1), Arc::clone(&http2));
        let mut stop = stop.clone();
        let header_read_timeout = options.header_read_timeout;
        tokio::spawn(async move {
            let detected = tokio::select! {
                detected = protocol::detect(stream, header_read_timeout) => detected,
                // No request started: nothing to finish.
                _ = stop.wait_for(|stopping| *stopping) => return,
            };
            let ended = match detected {
                Ok((protocol::Protocol::Http1, io)) => {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        app.clone().oneshot(with_peer(req, peer))
                    });
                    let connection = http1.serve_connection(TokioIo::new(io), service);
                    connection::drive(connection, stop, None)
                        .await
                        .map_err(|e| e.to_string())
                }
                Ok((protocol::Protocol::Http2, io)) => {
                    let activity = connection::Activity::new();
                    let service = hyper::service::service_fn({
                        let activity = Arc::clone(&activity);
                        move |req: Request<Incoming>| {
                            let in_flight = activity.begin();
                            let response = app.clone().oneshot(with_peer(req, peer));
                            async move {
                                let response = response.await?;
                                Ok::<_, Infallible>(response.map(|body| {
                                    axum::body::Body::new(connection::Tracked::new(body, in_flight))
                                }))
                            }
                        }
                    });
                    let connection = http2.serve_connection(TokioIo::new(io), service);
                    connection::drive(connection, stop, Some((activity, header_read_timeout)))
                        .await
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(format!("before its first request: {e}")),
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Every connection shuts down gracefully and returns its permit at its end.
    let _ = stopping.send(true);
    let _ = permits.acquire_many(max_connections).await;
    Ok(())
}

/// The request as the router takes it, with the client's address.
fn with_peer(
    mut req: Request<hyper::body::Incoming>,
    peer: std::net::SocketAddr,
) -> Request<axum::body::Body> {
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    req.map(axum::body::Body::new)
}
