//! Server-Sent Events: `GET …/events/stream` for the agent and the worker.
//! A client that disconnects and reconnects with `Last-Event-ID` under
//! concurrent writers receives exactly the committed feed, in order, without
//! duplicates; heartbeats arrive as comments; the stream ends after the
//! terminal event.

use std::time::Duration;

use meatspace_api::agent_integrations::Integrations;
use meatspace_store::secret::ServerKey;
use meatspace_tests::Db;
use meatspace_tests::server::{
    Expect, LapsingClaim, TestServer, header_str, ids, types, web, worker_path,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

meatspace_tests::api_tests!(
    reconnecting_with_last_event_id_misses_nothing_under_concurrent_writers,
    heartbeats_arrive_as_comments_on_an_idle_stream,
    a_stream_of_a_terminal_task_sends_the_rest_and_ends,
    the_worker_stream_is_for_the_assigned_worker_only,
    the_next_worker_never_sees_a_lapsed_workers_conversation,
    bad_cursors_are_refused,
);

/// One parsed SSE frame.
#[derive(Debug, Clone, PartialEq)]
enum Frame {
    Event { id: i64, kind: String, data: Value },
    Comment(String),
}

/// A minimal SSE reader over a streaming reqwest response.
struct SseReader {
    res: reqwest::Response,
    buf: String,
}

impl SseReader {
    async fn open(req: reqwest::RequestBuilder) -> SseReader {
        let res = req.send().await.expect("open the stream");
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            header_str(&res, "content-type").as_deref(),
            Some("text/event-stream")
        );
        SseReader {
            res,
            buf: String::new(),
        }
    }

    /// The next frame, or `None` when the server ended the stream.
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                return Some(parse(&block));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.res.chunk())
                .await
                .expect("a frame within 60 s")
                .expect("read the stream")?;
            self.buf
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// The next event, skipping comments.
    async fn next_event(&mut self) -> Option<(i64, String, Value)> {
        loop {
            match self.next().await? {
                Frame::Event { id, kind, data } => return Some((id, kind, data)),
                Frame::Comment(_) => {}
            }
        }
    }
}

fn parse(block: &str) -> Frame {
    let (mut id, mut kind, mut data) = (None, None, None);
    for line in block.lines().filter(|l| !l.is_empty()) {
        if let Some(c) = line.strip_prefix(':') {
            return Frame::Comment(c.trim().to_owned());
        }
        let (field, value) = line.split_once(':').expect("field: value");
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.parse().expect("numeric id")),
            "event" => kind = Some(value.to_owned()),
            "data" => data = Some(serde_json::from_str(value).expect("JSON data")),
            other => panic!("unexpected field {other}"),
        }
    }
    Frame::Event {
        id: id.expect("id"),
        kind: kind.expect("event"),
        data: data.expect("data"),
    }
}

async fn reconnecting_with_last_event_id_misses_nothing_under_concurrent_writers(db: Db) {
    let server = TestServer::start(db).await;
    let t = server.active_task("Count the birds in the park").await;
    let stream_path = format!("/api/v1/tasks/{}/events/stream", t.task_id);

    // Two writers send messages concurrently, then the worker completes.
    const PER_WRITER: usize = 25;
    let writers = {
        let base = server.base_url.clone();
        let token = t.worker_token.clone();
        let id = t.task_id;
        tokio::spawn(async move {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let send = |n: usize, w: usize| {
                let (client, base, token) = (client.clone(), base.clone(), token.clone());
                async move {
                    let r = client
                        .post(format!("{base}/api/v1/worker/tasks/{id}/messages"))
                        .bearer_auth(&token)
                        .json(&json!({ "text": format!("writer {w} message {n}") }))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), StatusCode::OK);
                }
            };
            let a = async {
                for n in 0..PER_WRITER {
                    send(n, 1).await;
                }
            };
            let b = async {
                for n in 0..PER_WRITER {
                    send(n, 2).await;
                }
            };
            tokio::join!(a, b);
            let r = client
                .post(format!("{base}/api/v1/worker/tasks/{id}/complete"))
                .bearer_auth(&token)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
        })
    };

    // The client reads a few events, drops the connection, and reconnects
    // with the last id it saw, until the stream ends by itself.
    let mut received: Vec<(i64, String, Value)> = Vec::new();
    let mut reconnects = 0;
    'outer: loop {
        let mut req = server.agent(&t.agent_token).get(&stream_path);
        if let Some((last, _, _)) = received.last() {
            req = req.header("last-event-id", last.to_string());
        }
        let mut reader = SseReader::open(req).await;
        for _ in 0..7 {
            match reader.next_event().await {
                Some(e) => received.push(e),
                None => break 'outer,
            }
        }
        reconnects += 1;
        drop(reader);
    }
    writers.await.expect("writers");
    assert!(reconnects >= 3, "only {reconnects} reconnects");

    let committed = server.feed(t.task_id, &t.agent_token).await;
    let got_ids: Vec<i64> = received.iter().map(|e| e.0).collect();
    assert_eq!(got_ids, ids(&committed), "delivered = committed, in order");
    for ((id, kind, data), event) in received.iter().zip(&committed) {
        assert_eq!(data, event, "data is the polled event");
        assert_eq!(kind, event["type"].as_str().unwrap());
        assert_eq!(*id, event["id"].as_i64().unwrap());
    }
    assert_eq!(types(&committed).last(), Some(&"task.completed"));
    let messages = types(&committed)
        .iter()
        .filter(|t| **t == "worker.message")
        .count();
    assert_eq!(messages, 2 * PER_WRITER);
    // Worker text stays marked untrusted in the stream.
    assert!(
        received
            .iter()
            .filter(|e| e.1 == "worker.message")
            .all(|e| e.2["untrusted"] == true)
    );
}

async fn heartbeats_arrive_as_comments_on_an_idle_stream(db: Db) {
    let mut integrations = Integrations::new(ServerKey::generate().0);
    integrations.sse_heartbeat = Duration::from_millis(200);
    let server = TestServer::start_configured(db, |o| o.integrations = integrations).await;
    let (id, token) = server.create_task("Water the plants").await;
    let mut reader = SseReader::open(
        server
            .agent(&token)
            .get(&format!("/api/v1/tasks/{id}/events/stream")),
    )
    .await;
    let mut comments = 0;
    while comments < 3 {
        match reader.next().await.expect("the stream stays open") {
            Frame::Comment(c) => {
                assert_eq!(c, "keep-alive");
                comments += 1;
            }
            Frame::Event { .. } => panic!("an idle draft has no events"),
        }
    }
    // An event still arrives on the same stream.
    server.publish(id, &token).await;
    let (_, kind, _) = reader.next_event().await.expect("an event");
    assert_eq!(kind, "task.published");
}

async fn a_stream_of_a_terminal_task_sends_the_rest_and_ends(db: Db) {
    let server = TestServer::start(db).await;
    let (id, token) = server.create_open_task("Feed the cat").await;
    server.agent_post(id, &token, "cancel").await;
    let path = format!("/api/v1/tasks/{id}/events/stream");
    let mut reader = SseReader::open(server.agent(&token).get(&path)).await;
    let mut kinds = Vec::new();
    while let Some((_, kind, _)) = reader.next_event().await {
        kinds.push(kind);
    }
    assert_eq!(kinds, ["task.published", "task.cancelled"]);
    // Resuming after the terminal event: nothing more, the stream ends.
    let last = server.feed(id, &token).await.last().unwrap()["id"]
        .as_i64()
        .unwrap();
    let mut reader =
        SseReader::open(server.agent(&token).get(&format!("{path}?after={last}"))).await;
    assert_eq!(reader.next_event().await, None);
    // `?after=` alone resumes too.
    let first = last - 1;
    let mut reader =
        SseReader::open(server.agent(&token).get(&format!("{path}?after={first}"))).await;
    assert_eq!(reader.next_event().await.unwrap().0, last);
    assert_eq!(reader.next_event().await, None);
}

async fn the_worker_stream_is_for_the_assigned_worker_only(db: Db) {
    let server = TestServer::start(db).await;
    let t = server.active_task("Fix the fence").await;
    let path = format!("/api/v1/worker/tasks/{}/events/stream", t.task_id);
    let mut reader = SseReader::open(server.worker(&t.worker_token).get(&path)).await;
    let (_, kind, _) = reader.next_event().await.unwrap();
    assert_eq!(kind, "task.published");
    let (_, other) = server.register_worker("Grace").await;
    server
        .worker(&other)
        .get(&path)
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    server
        .get(&path)
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    // The agent token is not a worker token.
    server
        .worker(&t.agent_token)
        .get(&path)
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
}

async fn the_next_worker_never_sees_a_lapsed_workers_conversation(db: Db) {
    // The review's attack: worker A claims, talks to the agent (who answers
    // with a door code), never starts; the assignment lapses and worker B
    // claims. B's stream, polled feed and web page must start at the
    // reopening.
    let LapsingClaim {
        server,
        task_id: id,
        agent_token: agent,
        second_worker: b,
        claimed,
        issue,
        ..
    } = LapsingClaim::start(
        db,
        "Water the plants",
        "A's private note",
        "the door is locked",
    )
    .await;
    server
        .clarify(id, &agent, issue, "the door code is 4711")
        .expect_json(StatusCode::OK)
        .await;

    // A never starts: once start_by has passed, the task reopens.
    server.lapse_assignment(&claimed).await;
    server.worker_post(id, &b, "claim").await;

    // B's stream from the start: its own assignment, then its own message,
    // and nothing of A's conversation before them.
    let mut stream =
        SseReader::open(server.worker(&b).get(&worker_path(id, "/events/stream"))).await;
    server.message(id, &b, "B is here").await;
    let mut seen = Vec::new();
    loop {
        let (_, kind, data) = stream.next_event().await.expect("the stream goes on");
        let text = data.to_string();
        seen.push(kind.clone());
        assert!(
            !text.contains("4711") && !text.contains("A's private note"),
            "B's stream replays A's conversation: {seen:?} {text}"
        );
        if text.contains("B is here") {
            break;
        }
    }
    assert_eq!(seen, ["task.assigned", "worker.message"]);
    // A reconnect from cursor 0 (Last-Event-ID) is no way around it either.
    let mut again = SseReader::open(
        server
            .worker(&b)
            .get(&worker_path(id, "/events/stream"))
            .header("last-event-id", "0"),
    )
    .await;
    let (_, kind, _) = again.next_event().await.unwrap();
    assert_eq!(kind, "task.assigned");

    // The polled feed and the web page agree.
    let page = server
        .worker(&b)
        .get_json(&worker_path(id, "/events?after=0"))
        .await;
    let events = page["events"].as_array().unwrap().clone();
    assert_eq!(types(&events), ["task.assigned", "worker.message"]);
    let http = web::client();
    let session = web::sign_in(&server, &http, &b, &[]).await;
    let html = web::get_with(&http, &server.url(&format!("/app/tasks/{id}")), &session)
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("B is here"), "B's page shows B's feed");
    assert!(
        !html.contains("4711") && !html.contains("private note"),
        "B's page shows A's conversation"
    );
}

async fn bad_cursors_are_refused(db: Db) {
    let server = TestServer::start(db).await;
    let (id, token) = server.create_task("Sweep the porch").await;
    let path = format!("/api/v1/tasks/{id}/events/stream");
    server
        .agent(&token)
        .get(&path)
        .header("last-event-id", "abc")
        .expect_problem(StatusCode::BAD_REQUEST)
        .await;
    server
        .agent(&token)
        .get(&format!("{path}?after=-1"))
        .expect_problem(StatusCode::BAD_REQUEST)
        .await;
    server
        .agent(&token)
        .get(&format!("{path}?after=x"))
        .expect_problem(StatusCode::BAD_REQUEST)
        .await;
}
