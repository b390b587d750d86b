//! The Rust client (`meatspace-client`) against the real server on both
//! backends: a whole task lifecycle driven only through the client (which
//! also proves its envelopes read real answers), feeds followed while the
//! events are being written, typed problem errors, and retries that reuse
//! one Idempotency-Key, through a fault-injecting proxy on 127.0.0.1.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use meatspace_client::types::{CreateTask, Extend};
use meatspace_client::{
    Client, Error, Event, EventType, Feed, IssueAction, IssueKind, RetryPolicy, TaskState,
    Transport,
};
use meatspace_tests::server::{FULL_STORY, TestServer, ids as json_ids, images};
use meatspace_tests::{Db, api_tests};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

api_tests!(
    client_drives_a_whole_lifecycle,
    problems_are_typed_errors,
    auto_transport_follows_the_whole_feed,
    retries_reuse_one_idempotency_key,
);

fn client(server: &TestServer) -> Client {
    Client::builder(&server.base_url)
        .dev_key(server.dev_key.clone())
        .build()
        .expect("client")
}

/// A client of `base` (with the dev key when given) that makes each call
/// up to `max_attempts` times, backing off from the first to the second
/// of `backoff_ms` milliseconds.
fn retrying(
    base: &str,
    dev_key: Option<&str>,
    max_attempts: u32,
    backoff_ms: (u64, u64),
) -> Client {
    let mut builder = Client::builder(base).retry(RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(backoff_ms.0),
        max_backoff: Duration::from_millis(backoff_ms.1),
    });
    if let Some(key) = dev_key {
        builder = builder.dev_key(key);
    }
    builder.build().expect("client")
}

/// `err` is an answer of HTTP `status` with the problem `slug`.
#[track_caller]
fn assert_problem(err: &Error, status: u16, slug: &str) {
    assert_eq!(
        (err.status(), err.problem_slug()),
        (Some(status), Some(slug)),
        "{err}"
    );
}

/// Reads a feed to its end; returns every event and checks the batches.
async fn drain(feed: Feed) -> Vec<Event> {
    drain_over(feed).await.0
}

/// [`drain`], and the transport the feed ended up using.
async fn drain_over(mut feed: Feed) -> (Vec<Event>, Transport) {
    let mut events: Vec<Event> = Vec::new();
    let mut terminal_batches = 0;
    let read = async {
        while let Some(batch) = feed.next().await.expect("feed batch") {
            assert!(!batch.events.is_empty() || batch.terminal, "an empty batch");
            assert_eq!(
                batch.cursor,
                batch.events.last().map_or(batch.cursor, |e| e.id)
            );
            terminal_batches += usize::from(batch.terminal);
            events.extend(batch.events);
        }
    };
    tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .expect("the feed ends once the task is terminal");
    assert_eq!(terminal_batches, 1, "exactly one terminal batch");
    (events, feed.current_transport())
}

async fn client_drives_a_whole_lifecycle(db: Db) {
    // Long poll: the transport every server has. An SSE variant is the
    // same body with Transport::Sse.
    lifecycle(db, Transport::LongPoll).await;
}

/// A whole task lifecycle through the client, its feeds followed over
/// `transport` while the events are written.
async fn lifecycle(db: Db, transport: Transport) {
    let server = TestServer::start(db).await;
    let client = client(&server);
    let mut req = CreateTask::new("Photograph the notice board");
    req.expires_in_seconds = Some(3600);
    let (created, task) = client.create_task(&req).await.expect("create");
    assert_eq!(created.task.state, TaskState::Draft);
    assert_eq!(created.task.description, "Photograph the notice board");
    assert!(created.webhook_secret.is_none());

    // Followed from the start while the lifecycle happens: the long polls
    // really wait, and the feed ends on its own at the terminal event.
    let agent_follower = tokio::spawn(drain(task.follow(0).transport(transport)));

    let published = task.publish().await.expect("publish");
    assert_eq!(published.task.state, TaskState::Open);
    assert_eq!(published.events[0].kind, EventType::TaskPublished);

    let (registered, worker) = client.register_worker("Ada").await.expect("register");
    assert_eq!(registered.worker.name, "Ada");
    let open = worker
        .open_tasks(None, Some(100))
        .await
        .expect("open tasks");
    assert!(open.tasks.iter().any(|t| t.task.id == task.id()));
    assert_eq!(
        worker.task(task.id()).await.expect("worker get").state,
        TaskState::Open
    );

    let claimed = worker.claim(task.id()).await.expect("claim");
    assert_eq!(claimed.task.worker_id, Some(registered.worker.id));
    let worker_follower = tokio::spawn(drain(worker.follow(task.id(), 0).transport(transport)));
    worker.start(task.id()).await.expect("start");
    worker
        .message(task.id(), "On my way")
        .await
        .expect("message");
    let photo = worker
        .photo(task.id(), "image/png", images::png(40, 30))
        .await
        .expect("photo");
    let photo_id = photo.events[0].data["photo_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("photo id");
    let issue = worker
        .issue(
            task.id(),
            IssueKind::NeedsMoreTime,
            "The board is behind glass",
        )
        .await
        .expect("issue");
    assert_eq!(issue.task.open_issues, 1);
    let answered = task
        .respond(
            issue.events[0].id,
            IssueAction::Clarify,
            Some("A photo through the glass is fine".into()),
        )
        .await
        .expect("respond");
    assert_eq!(answered.task.open_issues, 0);
    let done = worker
        .complete(task.id(), Some("Done"))
        .await
        .expect("complete");
    assert_eq!(done.task.state, TaskState::Completed);

    let seen = agent_follower.await.expect("agent follower");
    let feed = server
        .feed(task.id(), task.token().expect("a created task has a token"))
        .await;
    let seen_ids: Vec<i64> = seen.iter().map(|e| e.id).collect();
    assert_eq!(
        seen_ids,
        json_ids(&feed),
        "the follower saw the whole feed, in order"
    );
    let kinds: Vec<&str> = seen.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, FULL_STORY);
    assert!(seen[3].untrusted, "worker text is flagged untrusted");
    assert_eq!(seen[3].data["text"], "On my way");
    // Events read through the client's types are the server's JSON, field for field.
    for (typed, raw) in seen.iter().zip(&feed) {
        assert_eq!(&serde_json::to_value(typed).unwrap(), raw);
    }

    // The worker follows the same feed from where it was assigned.
    let worker_seen = worker_follower.await.expect("worker follower");
    assert_eq!(
        worker_seen.iter().map(|e| e.id).collect::<Vec<_>>(),
        seen_ids,
        "the worker's feed is the task's feed"
    );

    // Resuming from a cursor hands out only what follows it.
    let tail = drain(task.follow(seen_ids[4]).transport(transport)).await;
    assert_eq!(tail.iter().map(|e| e.id).collect::<Vec<_>>(), seen_ids[5..]);

    let got = task.get().await.expect("get");
    assert_eq!(got.state, TaskState::Completed);
    assert_eq!(got.last_event_id, *seen_ids.last().unwrap());
    let page = task.events(0, Some(2), 0).await.expect("page");
    assert_eq!(page.events.len(), 2);
    assert!(page.has_more && page.terminal);

    let image = task.photo(photo_id).await.expect("photo");
    assert_eq!(image.content_type, "image/png");
    assert!(image.bytes.starts_with(b"\x89PNG"), "a PNG comes back");
    server.stop().await;
}

async fn problems_are_typed_errors(db: Db) {
    let server = TestServer::start(db).await;
    let client = client(&server);

    let (_, task) = client
        .create_task(&CreateTask::new("Check the opening hours"))
        .await
        .expect("create");
    task.publish().await.expect("publish");
    let err = task
        .publish()
        .await
        .expect_err("a second publish is refused");
    let p = err.problem().expect("a problem document");
    assert_eq!((p.status, p.slug()), (409, "wrong-state"), "{err}");
    assert_eq!(p.task_state, Some(TaskState::Open));
    assert!(!p.detail.is_empty() && !p.title.is_empty());

    let err = task
        .respond(999, IssueAction::Acknowledge, Some("ok".into()))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");

    let err = client
        .task(task.id(), "mst_not-the-token")
        .get()
        .await
        .unwrap_err();
    assert_problem(&err, 401, "unauthorized");

    let err = client
        .create_task(&CreateTask::new("  "))
        .await
        .unwrap_err();
    assert_problem(&err, 422, "invalid-input");

    let wrong_key = Client::builder(&server.base_url)
        .dev_key("msd_wrong")
        .build()
        .unwrap();
    let err = wrong_key
        .create_task(&CreateTask::new("x"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    let no_key = Client::new(&server.base_url).unwrap();
    let err = no_key.create_task(&CreateTask::new("x")).await.unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");

    task.cancel().await.expect("cancel");
    let err = task.cancel().await.unwrap_err();
    assert_problem(&err, 409, "task-terminal");
    assert_eq!(
        err.problem().unwrap().task_state,
        Some(TaskState::Cancelled)
    );

    // Nobody listens on a closed port: a transport error after the retries.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dead = Client::builder(format!("http://127.0.0.1:{port}"))
        .retry(RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(10),
        })
        .build()
        .unwrap();
    let err = dead.task(task.id(), "mst_x").get().await.unwrap_err();
    assert!(matches!(err, Error::Transport(_)), "{err}");
    server.stop().await;
}

async fn auto_transport_follows_the_whole_feed(db: Db) {
    // Straight to the server, Auto follows by SSE; through a proxy that
    // answers 404 on the stream route (a server without it), by long poll.
    // Either way the follower sees the whole feed.
    let server = TestServer::start(db).await;
    let (no_stream, seen) = flaky_proxy(server.base_url.clone(), |_, request_line| {
        if request_line.contains("/events/stream") {
            Fault::NotFound
        } else {
            Fault::Forward
        }
    })
    .await;
    let direct = client(&server);
    for (base, expected) in [
        (server.base_url.clone(), Transport::Sse),
        (no_stream, Transport::LongPoll),
    ] {
        let follower_client = Client::builder(&base)
            .dev_key(server.dev_key.clone())
            .build()
            .expect("client");
        let (_, task) = follower_client
            .create_task(&CreateTask::new("Count the benches"))
            .await
            .expect("create");
        task.publish().await.expect("publish");
        let follower = tokio::spawn(drain_over(
            task.follow(0).long_poll_wait(Duration::from_secs(5)),
        ));
        // The worker writes to the server directly: the proxy serves one
        // connection at a time, and a long poll holds it.
        let (_, worker) = direct.register_worker("Grace").await.expect("register");
        worker.claim(task.id()).await.expect("claim");
        worker.start(task.id()).await.expect("start");
        for i in 0..5 {
            worker
                .message(task.id(), &format!("bench {i}"))
                .await
                .expect("message");
        }
        worker.stop(task.id(), Some("rain")).await.expect("stop");
        let (seen_events, transport) = follower.await.expect("follower");
        assert_eq!(transport, expected, "the transport Auto chose via {base}");
        let feed = server
            .feed(task.id(), task.token().expect("a created task has a token"))
            .await;
        assert_eq!(
            seen_events.iter().map(|e| e.id).collect::<Vec<_>>(),
            json_ids(&feed)
        );
        assert_eq!(seen_events.last().unwrap().kind, EventType::TaskStopped);
    }
    // Through the proxy: one attempt at the stream, then long polls only.
    let seen = seen.lock().unwrap().clone();
    let lines: Vec<&str> = seen.iter().map(|s| s.request_line.as_str()).collect();
    let streams = lines
        .iter()
        .filter(|l| l.contains("/events/stream"))
        .count();
    let polls = lines
        .iter()
        .filter(|l| l.starts_with("GET ") && l.contains("/events?") && l.contains("wait="))
        .count();
    assert_eq!(streams, 1, "{lines:#?}");
    assert!(polls >= 1, "{lines:#?}");
    server.stop().await;
}

/// What the proxy saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    request_line: String,
    idempotency_key: Option<String>,
    /// The server's answer said `Idempotency-Replayed: true`.
    replayed: bool,
}

/// What the proxy does with one connection.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Close the connection without an answer.
    Drop,
    /// Answer 503 with `Retry-After: 0`.
    Busy,
    /// Pass the request to the server and its answer back.
    Forward,
    /// Pass the request to the server, then close without an answer: the
    /// change happened but the client never hears of it.
    LoseAnswer,
    /// Answer 404, as a server without the route would.
    NotFound,
}

/// Every third connection fails with a broken connection, then 503, then
/// goes through: each call succeeds on its third attempt.
fn drop_busy_forward(n: usize, _request_line: &str) -> Fault {
    match n % 3 {
        1 => Fault::Drop,
        2 => Fault::Busy,
        _ => Fault::Forward,
    }
}

/// A proxy on 127.0.0.1 in front of the real server that treats the n-th
/// connection (from 1), whose request line is `line`, as `plan(n, line)`
/// says.
async fn flaky_proxy(
    upstream: String,
    plan: fn(usize, &str) -> Fault,
) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut n = 0usize;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            n += 1;
            let (head, body) = read_request(&mut sock).await;
            let mut lines = head.split("\r\n");
            let request_line = lines.next().unwrap_or_default().to_owned();
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            let key = headers
                .iter()
                .find(|(k, _)| k == "idempotency-key")
                .map(|(_, v)| v.clone());
            let index = {
                let mut log = log.lock().unwrap();
                log.push(Seen {
                    request_line: request_line.clone(),
                    idempotency_key: key,
                    replayed: false,
                });
                log.len() - 1
            };
            let fault = plan(n, &request_line);
            match fault {
                Fault::Drop => drop(sock),
                Fault::NotFound => {
                    let body = r#"{"type":"about:blank","title":"Not Found","status":404}"#;
                    let res = format!(
                        "HTTP/1.1 404 Not Found\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(res.as_bytes()).await;
                }
                Fault::Busy => {
                    let body = r#"{"type":"https://meatspace.dev/problems/database-unavailable","title":"Service Unavailable","status":503,"detail":"busy"}"#;
                    let res = format!(
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(res.as_bytes()).await;
                }
                Fault::Forward | Fault::LoseAnswer => {
                    let mut parts = request_line.split(' ');
                    let method = parts.next().unwrap_or("GET").parse().unwrap();
                    let path = parts.next().unwrap_or("/");
                    let mut req = http.request(method, format!("{upstream}{path}"));
                    for (k, v) in &headers {
                        if !matches!(k.as_str(), "host" | "content-length" | "connection") {
                            req = req.header(k.as_str(), v.as_str());
                        }
                    }
                    let res = req.body(body).send().await.unwrap();
                    let status = res.status();
                    log.lock().unwrap()[index].replayed = res
                        .headers()
                        .get("idempotency-replayed")
                        .is_some_and(|v| v == "true");
                    if matches!(fault, Fault::LoseAnswer) {
                        drop(sock);
                        continue;
                    }
                    let ct = res
                        .headers()
                        .get("content-type")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    let bytes = res.bytes().await.unwrap();
                    let head = format!(
                        "HTTP/1.1 {} {}\r\ncontent-type: {ct}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        status.as_u16(),
                        status.canonical_reason().unwrap_or(""),
                        bytes.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(&bytes).await;
                }
            }
        }
    });
    (format!("http://{addr}"), seen)
}

/// Reads one HTTP/1.1 request (head and Content-Length body).
async fn read_request(sock: &mut tokio::net::TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = sock.read(&mut chunk).await.unwrap();
        assert!(n > 0, "request ended early");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut chunk).await.unwrap();
        assert!(n > 0, "body ended early");
        body.extend_from_slice(&chunk[..n]);
    }
    (head, body)
}

async fn retries_reuse_one_idempotency_key(db: Db) {
    let server = TestServer::start(db).await;
    let (proxy, seen) = flaky_proxy(server.base_url.clone(), drop_busy_forward).await;
    let client = retrying(&proxy, Some(&server.dev_key), 3, (20, 50));
    // Each call fails twice (a broken connection, then 503) and succeeds on
    // the third attempt.
    let (created, task) = client
        .create_task(&CreateTask::new("Water the plants"))
        .await
        .expect("create succeeds after two transient failures");
    task.publish().await.expect("publish after retries");
    let got = task.get().await.expect("get after retries");
    assert_eq!(got.state, TaskState::Open);
    assert_eq!(
        server.counts().await.tasks,
        1,
        "one task despite three attempts"
    );
    assert_eq!(created.task.id, got.id);

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 9, "three attempts per call: {seen:#?}");
    for call in seen.chunks(3) {
        assert!(
            call.iter().all(|s| s.request_line == call[0].request_line),
            "{call:#?}"
        );
    }
    let create_keys: Vec<_> = seen[0..3]
        .iter()
        .map(|s| s.idempotency_key.clone())
        .collect();
    let publish_keys: Vec<_> = seen[3..6]
        .iter()
        .map(|s| s.idempotency_key.clone())
        .collect();
    assert!(create_keys[0].is_some() && create_keys.iter().all(|k| *k == create_keys[0]));
    assert!(publish_keys[0].is_some() && publish_keys.iter().all(|k| *k == publish_keys[0]));
    assert_ne!(
        create_keys[0], publish_keys[0],
        "a new key per logical call"
    );
    assert!(
        seen[6..].iter().all(|s| s.idempotency_key.is_none()),
        "a GET carries no key"
    );

    // With fewer attempts than failures, the last failure is the answer.
    let impatient = retrying(&proxy, None, 2, (10, 10));
    let err = impatient
        .task(task.id(), task.token().expect("a created task has a token"))
        .get()
        .await
        .unwrap_err();
    assert_problem(&err, 503, "database-unavailable");
    server.stop().await;
}

// ---- agent integrations: SSE, Idempotency-Key replays, POST /extend ----

meatspace_tests::api_tests!(integrations:
    lifecycle_over_sse,
    a_lost_answer_is_replayed_not_repeated,
    extend_gives_a_task_more_time,
);

async fn lifecycle_over_sse(db: Db) {
    lifecycle(db, Transport::Sse).await;
}

async fn a_lost_answer_is_replayed_not_repeated(db: Db) {
    let server = TestServer::start(db).await;
    // Each logical call: the first attempt reaches the server but its
    // answer is lost; the retry carries the same key and gets the replay.
    let (proxy, seen) = flaky_proxy(server.base_url.clone(), |n, _| {
        if n % 2 == 1 {
            Fault::LoseAnswer
        } else {
            Fault::Forward
        }
    })
    .await;
    let client = retrying(&proxy, Some(&server.dev_key), 2, (20, 50));
    let (created, task) = client
        .create_task(&CreateTask::new("Post the letter"))
        .await
        .expect("create");
    assert_eq!(
        server.counts().await.tasks,
        1,
        "one task for one logical create"
    );
    // The replayed create hands back a working token.
    let direct = Client::new(&server.base_url).unwrap();
    assert_eq!(
        direct
            .task(
                created.task.id,
                task.token().expect("a created task has a token")
            )
            .get()
            .await
            .expect("token works")
            .id,
        created.task.id
    );
    let published = task.publish().await.expect("publish");
    assert_eq!(published.task.state, TaskState::Open);
    let feed = server
        .feed(task.id(), task.token().expect("a created task has a token"))
        .await;
    assert_eq!(feed.len(), 1, "published once: {feed:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:#?}");
    assert_eq!(seen[0].idempotency_key, seen[1].idempotency_key);
    assert_eq!(seen[2].idempotency_key, seen[3].idempotency_key);
    assert!(seen[1].replayed && seen[3].replayed, "{seen:#?}");
    server.stop().await;
}

async fn extend_gives_a_task_more_time(db: Db) {
    let server = TestServer::start(db).await;
    let client = client(&server);
    let mut req = CreateTask::new("Wait for the parcel");
    req.expires_in_seconds = Some(600);
    let (created, task) = client.create_task(&req).await.expect("create");
    let before = created.task.expires_at;
    let change = task
        .extend(Extend::add_seconds(300))
        .await
        .expect("extend by seconds");
    assert_eq!(
        change.task.expires_at,
        before + chrono::TimeDelta::seconds(300)
    );
    assert_eq!(
        serde_json::to_value(change.events[0].kind).unwrap(),
        "task.extended"
    );
    let later = change.task.expires_at + chrono::TimeDelta::seconds(60);
    let change = task
        .extend(Extend::until(later))
        .await
        .expect("extend to a time");
    assert_eq!(change.task.expires_at, later);
    task.cancel().await.expect("cancel");
    let err = task.extend(Extend::add_seconds(60)).await.unwrap_err();
    assert_eq!(
        err.status(),
        Some(409),
        "a terminal task is not extended: {err}"
    );
    server.stop().await;
}
