//! Following a task's event feed from a cursor, over Server-Sent Events or
//! long poll, resuming where it left off after any break.
//!
//! The feed is the source of truth and its event ids are the cursor: the
//! caller handles a [`FeedBatch`], stores `batch.cursor`, and after a crash
//! builds a new [`Feed`] from the stored cursor. Nothing is missed, and an
//! event is seen twice only if the crash came between handling a batch and
//! storing its cursor (at-least-once).
//!
//! [`Transport::Auto`] tries the stream route first and falls back to long
//! poll for good when the server answers 404 there (a server without SSE).

use std::time::Duration;

use meatspace_domain::Event;
use reqwest::Method;

use crate::error::Error;
use crate::http::{Call, Client, Credential};
use crate::sse::Parser;
use crate::types::EventPage;

/// How a [`Feed`] waits for events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Server-Sent Events; long poll when the server has no stream route.
    #[default]
    Auto,
    /// Server-Sent Events only (a 404 on the stream route is an error).
    Sse,
    /// Long poll only (`GET …/events?after=…&wait=…`).
    LongPoll,
}

/// Events handed over together; store `cursor` once they are handled.
#[derive(Debug, Clone)]
pub struct FeedBatch {
    /// New events, ascending by id, all after the previous cursor.
    pub events: Vec<Event>,
    /// The id of the last event handled so far: resume from it.
    pub cursor: i64,
    /// The task is terminal and the feed is complete: no batch follows.
    pub terminal: bool,
}

/// A resumable reader of one task's event feed (agent or worker side).
#[derive(Debug)]
pub struct Feed {
    client: Client,
    /// `/api/v1/tasks/{id}/events` or `/api/v1/worker/tasks/{id}/events`.
    path: String,
    credential: Credential,
    cursor: i64,
    transport: Transport,
    wait: Duration,
    stream: Option<Stream>,
    done: bool,
    /// Consecutive failures to open or read the stream.
    failures: u32,
}

#[derive(Debug)]
struct Stream {
    res: reqwest::Response,
    parser: Parser,
}

impl Feed {
    pub(crate) fn new(client: Client, path: String, credential: Credential, after: i64) -> Feed {
        Feed {
            client,
            path,
            credential,
            cursor: after,
            transport: Transport::Auto,
            wait: Duration::from_secs(25),
            stream: None,
            done: false,
            failures: 0,
        }
    }

    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Long-poll wait per request (the server allows up to 30 s).
    pub fn long_poll_wait(mut self, wait: Duration) -> Self {
        self.wait = wait.min(Duration::from_secs(30));
        self
    }

    /// The id of the last event handed out (the `after` to resume from).
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    /// The transport in use: `Auto` turns into `Sse` or `LongPoll` once the
    /// server has answered.
    pub fn current_transport(&self) -> Transport {
        self.transport
    }

    /// The next batch of events, waiting as long as it takes; `None` once
    /// the terminal batch has been handed out.
    pub async fn next(&mut self) -> Result<Option<FeedBatch>, Error> {
        loop {
            if self.done {
                return Ok(None);
            }
            let batch = match self.transport {
                Transport::LongPoll => self.poll(self.wait).await?,
                Transport::Auto | Transport::Sse => self.read_stream().await?,
            };
            if let Some(batch) = batch {
                return Ok(Some(batch));
            }
        }
    }

    /// One long-poll request. `None` when it brought nothing new.
    async fn poll(&mut self, wait: Duration) -> Result<Option<FeedBatch>, Error> {
        let mut call = Call::new(Method::GET, self.path.clone(), self.credential.auth());
        call.query = vec![
            ("after", self.cursor.to_string()),
            ("limit", "500".into()),
            ("wait", wait.as_secs().to_string()),
        ];
        call.extra_time = wait;
        let page: EventPage = self.client.json(call).await?;
        let events: Vec<Event> = page
            .events
            .into_iter()
            .filter(|e| e.id > self.cursor)
            .collect();
        if let Some(last) = events.last() {
            self.cursor = last.id;
        }
        let terminal = page.terminal && !page.has_more;
        self.done = terminal;
        Ok((!events.is_empty() || terminal).then_some(FeedBatch {
            events,
            cursor: self.cursor,
            terminal,
        }))
    }

    /// Reads the stream (opening it first if needed). `None` when a read
    /// brought no event (a heartbeat, a reconnect).
    async fn read_stream(&mut self) -> Result<Option<FeedBatch>, Error> {
        if self.stream.is_none() {
            match self.open_stream().await {
                Ok(s) => self.stream = Some(s),
                Err(e) if e.status() == Some(404) && self.transport == Transport::Auto => {
                    tracing::debug!("no event stream on this server; long polling");
                    self.transport = Transport::LongPoll;
                    return Ok(None);
                }
                Err(e) => return self.stream_failed(e).await,
            }
            if self.transport == Transport::Auto {
                self.transport = Transport::Sse;
            }
        }
        let stream = self.stream.as_mut().expect("opened above");
        match stream.res.chunk().await {
            Ok(Some(chunk)) => {
                self.failures = 0;
                let mut events = Vec::new();
                for m in stream.parser.feed(&chunk) {
                    let event: Event = serde_json::from_str(&m.data).map_err(|e| {
                        Error::Decode(format!("event {:?} ({}): {e}", m.id, m.event))
                    })?;
                    // A resumed stream never repeats, but a cursor is a
                    // promise: drop anything at or before it.
                    if event.id > self.cursor {
                        self.cursor = event.id;
                        events.push(event);
                    }
                }
                let terminal = events.iter().any(|e| e.kind.is_terminal());
                if terminal {
                    self.done = true;
                    self.stream = None;
                }
                Ok((!events.is_empty()).then_some(FeedBatch {
                    events,
                    cursor: self.cursor,
                    terminal,
                }))
            }
            Ok(None) => {
                // The server ended the stream before a terminal event
                // (restart, or the task was already over when we
                // connected): one immediate page says which.
                self.stream = None;
                self.poll(Duration::ZERO).await
            }
            Err(e) => {
                self.stream = None;
                self.stream_failed(Error::Transport(e)).await
            }
        }
    }

    async fn open_stream(&self) -> Result<Stream, Error> {
        let mut call = Call::new(
            Method::GET,
            format!("{}/stream", self.path),
            self.credential.auth(),
        );
        call.query = vec![("after", self.cursor.to_string())];
        call.stream = true;
        call.headers = vec![
            ("accept", "text/event-stream".into()),
            ("last-event-id", self.cursor.to_string()),
        ];
        let res = self.client.send(call).await?;
        Ok(Stream {
            res,
            parser: Parser::default(),
        })
    }

    /// Backs off after a broken stream, or gives up after the retry
    /// policy's attempts in a row.
    async fn stream_failed(&mut self, e: Error) -> Result<Option<FeedBatch>, Error> {
        let retry = self.client.retry_policy();
        let transient = match &e {
            Error::Transport(_) => true,
            other => matches!(other.status(), Some(429 | 502 | 503 | 504)),
        };
        self.failures += 1;
        if !transient || self.failures >= retry.max_attempts.max(1) {
            return Err(e);
        }
        tracing::debug!(error = %e, failures = self.failures, "event stream broke; reconnecting");
        tokio::time::sleep(retry.backoff(self.failures - 1)).await;
        Ok(None)
    }
}
