//! Fault: PostgreSQL killed with SIGKILL under write load, then restarted.
//!
//! Eight workers send messages as fast as the server answers while the
//! database server of the test's own is crashed and, once the API reports
//! it unavailable, restarted. The promises checked:
//!
//! - nothing acknowledged is lost: every message answered 200 is in its
//!   task's feed exactly once, and nothing appears twice;
//! - every feed is gap-free and in order (ids strictly ascending, the
//!   agent's cursor walk sees all of them);
//! - the only 5xx a client sees is 503 (with `Retry-After`), never a 500;
//! - the API answers 503 soon after the crash (the design target is within
//!   a second) and 200 soon after the restart (within two seconds).
//!
//! The timings are printed; the assertions on them are generous bounds so
//! that a busy CI machine does not fail the run, while a server that hangs
//! for its acquire timeout or never recovers still does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use meatspace_tests::pg::PgServer;
use meatspace_tests::server::{ServerOptions, TestServer, ids, types};
use meatspace_tests::{Db, TestDb};
use reqwest::StatusCode;
use serde_json::json;

const WRITERS: usize = 8;

/// What the writers saw, shared with the test.
#[derive(Debug, Default)]
struct Seen {
    /// Texts answered 200, per task index.
    acked: HashMap<usize, Vec<String>>,
    /// Every text sent, per task index (acknowledged or not).
    sent: HashMap<usize, Vec<String>>,
    /// Statuses other than 200 and 503, with their bodies.
    unexpected: Vec<String>,
    /// When each answer came, and whether it was a 503 or a 200.
    answers: Vec<(Instant, StatusCode)>,
}

impl Seen {
    /// How long after `since` the first answer with `status` came, if one
    /// did.
    fn first_after(&self, since: Instant, status: StatusCode) -> Option<Duration> {
        self.answers
            .iter()
            .find(|(at, s)| *at > since && *s == status)
            .map(|(at, _)| *at - since)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_crash_under_write_load_loses_nothing_acknowledged() {
    // The server runs in this process: its errors (the cause of an
    // unexpected 500) are printed with the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("error,tower_http=off")
        .with_test_writer()
        .try_init();
    let pg = tokio::task::spawn_blocking(PgServer::start_new)
        .await
        .unwrap();
    let db = TestDb::postgres_on(&pg.admin_url).await;
    let srv = Arc::new(TestServer::start_on(Db::Postgres, db, ServerOptions::default()).await);
    let tasks = join_all((0..WRITERS).map(|i| {
        let srv = Arc::clone(&srv);
        async move { srv.active_task(&format!("Keep writing {i}")).await }
    }))
    .await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (srv, seen, stop, t) = (
                Arc::clone(&srv),
                Arc::clone(&seen),
                Arc::clone(&stop),
                t.clone(),
            );
            tokio::spawn(async move {
                let path = format!("/api/v1/worker/tasks/{}/messages", t.task_id);
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let text = format!("w{i}-{n}");
                    seen.lock()
                        .unwrap()
                        .sent
                        .entry(i)
                        .or_default()
                        .push(text.clone());
                    let res = srv
                        .worker(&t.worker_token)
                        .post(&path)
                        .json(&json!({ "text": text }))
                        .send()
                        .await;
                    let res = res.expect("the server always answers");
                    let status = res.status();
                    let retry_after = res.headers().contains_key("retry-after");
                    let body = res.text().await.unwrap_or_default();
                    {
                        let mut s = seen.lock().unwrap();
                        s.answers.push((Instant::now(), status));
                        match status {
                            StatusCode::OK => s.acked.entry(i).or_default().push(text),
                            StatusCode::SERVICE_UNAVAILABLE if retry_after => {}
                            _ => s.unexpected.push(format!("{status}: {body}")),
                        }
                    }
                    if status != StatusCode::OK {
                        // A client that honours Retry-After would wait longer;
                        // a short pause keeps the outage well sampled.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
        })
        .collect();

    let acked_total =
        |seen: &Mutex<Seen>| -> usize { seen.lock().unwrap().acked.values().map(Vec::len).sum() };
    wait_for("writes before the crash", Duration::from_secs(60), || {
        acked_total(&seen) >= WRITERS * 20
    })
    .await;

    let crashed = Instant::now();
    tokio::task::block_in_place(|| pg.crash());
    let readyz = |srv: Arc<TestServer>| async move {
        srv.get("/readyz").send().await.map(|r| r.status()).ok()
    };
    let not_ready_after = poll_until(Duration::from_secs(30), || {
        let srv = Arc::clone(&srv);
        async move { readyz(srv).await == Some(StatusCode::SERVICE_UNAVAILABLE) }
    })
    .await
        - crashed;
    let first_503 = || {
        seen.lock()
            .unwrap()
            .first_after(crashed, StatusCode::SERVICE_UNAVAILABLE)
    };
    wait_for("a 503 after the crash", Duration::from_secs(30), || {
        first_503().is_some()
    })
    .await;
    let first_503_after = first_503().expect("a 503 after the crash");

    tokio::task::block_in_place(|| pg.restart_after_crash());
    let restarted = Instant::now();
    let before_restart = acked_total(&seen);
    let ready_after = poll_until(Duration::from_secs(30), || {
        let srv = Arc::clone(&srv);
        async move { readyz(srv).await == Some(StatusCode::OK) }
    })
    .await
        - restarted;
    wait_for("writes after the restart", Duration::from_secs(60), || {
        acked_total(&seen) >= before_restart + WRITERS * 20
    })
    .await;
    let first_200_after = seen
        .lock()
        .unwrap()
        .first_after(restarted, StatusCode::OK)
        .expect("a 200 after the restart");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let count_503 = seen
        .answers
        .iter()
        .filter(|(_, s)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    println!(
        "postgres crash: {} acknowledged writes, {count_503} answered 503; \
         first 503 {:.0} ms after the crash, /readyz 503 after {:.0} ms; \
         first 200 {:.0} ms after the restart, /readyz 200 after {:.0} ms",
        acked_total_of(&seen),
        first_503_after.as_secs_f64() * 1e3,
        not_ready_after.as_secs_f64() * 1e3,
        first_200_after.as_secs_f64() * 1e3,
        ready_after.as_secs_f64() * 1e3,
    );
    assert!(
        seen.unexpected.is_empty(),
        "answers other than 200 and 503 + Retry-After: {:?}",
        seen.unexpected
    );
    assert!(count_503 > 0, "the outage was never seen");
    // Generous bounds: a server waiting out a 5 s acquire timeout per
    // request, or one that never notices the recovery, still fails here.
    assert!(
        not_ready_after < Duration::from_secs(5),
        "{not_ready_after:?}"
    );
    assert!(ready_after < Duration::from_secs(10), "{ready_after:?}");

    for (i, t) in tasks.iter().enumerate() {
        let feed = srv.feed(t.task_id, &t.agent_token).await;
        let event_ids = ids(&feed);
        assert!(
            event_ids.windows(2).all(|w| w[0] < w[1]),
            "task {i}: feed out of order or duplicated: {event_ids:?}"
        );
        assert_eq!(
            types(&feed)[..3],
            ["task.published", "task.assigned", "task.started"]
        );
        let texts: Vec<&str> = feed
            .iter()
            .filter(|e| e["type"] == "worker.message")
            .map(|e| e["data"]["text"].as_str().expect("text"))
            .collect();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for text in &texts {
            *counts.entry(text).or_default() += 1;
        }
        assert!(
            counts.values().all(|&n| n == 1),
            "task {i}: a message appears twice"
        );
        for text in seen.acked.get(&i).into_iter().flatten() {
            assert_eq!(
                counts.get(text.as_str()),
                Some(&1),
                "task {i}: acknowledged message {text} is missing"
            );
        }
        let sent = seen.sent.get(&i).map_or(0, Vec::len);
        assert!(
            texts.len() <= sent,
            "task {i}: more messages than were sent"
        );
    }
}

fn acked_total_of(seen: &Seen) -> usize {
    seen.acked.values().map(Vec::len).sum()
}

/// Polls `done` until it holds; returns how long that took.
async fn wait_for(what: &str, bound: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let ((), took) = meatspace_tests::eventually_timed(bound, what, || {
        let held = done();
        async move { held.then_some(()) }
    })
    .await;
    took
}

/// Polls the async `check` until it holds; returns when it did.
async fn poll_until<F, Fut>(bound: Duration, mut check: F) -> Instant
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    meatspace_tests::eventually(bound, "the condition holds", || {
        let held = check();
        async move { held.await.then(Instant::now) }
    })
    .await
}
