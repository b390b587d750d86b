//! Fan-out benchmark on both backends (not a pass/fail test: a
//! `harness = false` bench target, run by hand with a PostgreSQL server as
//! `scripts/test` starts one):
//!
//! ```text
//! D=$(mktemp -d); scripts/postgres.sh start $D >/dev/null; source $D/env
//! cargo bench -p meatspace-tests --bench notify_bench
//! scripts/postgres.sh stop $D
//! ```
//!
//! For each backend: the real server and the controller in this process,
//! a real SMTP server (aiosmtpd) and the tests' push service (which checks
//! each VAPID signature and decrypts each message). It measures the
//! latency of publishing a task over HTTP with no worker listening, then
//! loads `MEATSPACE_BENCH_WORKERS` (10,000) workers who all asked for new
//! tasks in the task's area, by push and email, publishes one task they
//! all match, and measures: that publish's latency, the latency of
//! publishes made while its fan-out and sending run, how long the fan-out
//! took (notifications made per second), and the messages per second the
//! push service and the SMTP server received, with the CPU time of this
//! process per message (the server, the controller and the push
//! service's decryption; aiosmtpd is another process).
//! `MEATSPACE_BENCH_DBS` (`sqlite` or `postgres`) runs one backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use meatspace_controller::ControllerConfig;
use meatspace_controller::notify::{NotifySettings, SmtpSettings, SmtpTls};
use meatspace_domain::notify::{Area, Preferences};
use meatspace_store::Store;
use meatspace_store::notify::PushSubscription;
use meatspace_store::token::TokenHash;
use meatspace_tests::push::PushService;
use meatspace_tests::server::{TestServer, str_at, uuid_at};
use meatspace_tests::smtp::SmtpServer;
use meatspace_tests::{Db, cpu_time};
use serde_json::json;
use uuid::Uuid;

const HERE: (f64, f64) = (52.5219, 13.4132);
/// Where the tasks nobody is told of are (no worker's area is there).
const ELSEWHERE: (f64, f64) = (-33.86, 151.21);
const SAMPLES: usize = 20;

/// Creates and publishes a task at `at`; the publish's latency.
async fn publish(srv: &TestServer, description: &str, at: (f64, f64)) -> Duration {
    let created = srv
        .create_task_with(json!({
            "description": description,
            "location": { "latitude": at.0, "longitude": at.1, "radius_m": 100 },
        }))
        .await;
    let (id, token) = (
        uuid_at(&created, "/task/id"),
        str_at(&created, "/agent_token"),
    );
    let started = Instant::now();
    srv.publish(id, &token).await;
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

async fn load(store: &Arc<dyn Store>, push: &PushService, n: usize) {
    let prefs = Preferences {
        area: Some(Area {
            latitude: HERE.0,
            longitude: HERE.1,
            radius_m: 5_000,
        }),
        new_tasks: true,
        my_tasks: true,
        email: Some("worker@example.org".into()),
    };
    let now = chrono::Utc::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let (store, prefs, sub) = (Arc::clone(store), prefs.clone(), push.subscribe());
            async move {
                let id = Uuid::new_v4();
                store
                    .create_worker(id, &format!("W{i}"), TokenHash::of(&id.to_string()), now)
                    .await
                    .expect("a worker");
                store
                    .set_preferences(id, &prefs, now)
                    .await
                    .expect("preferences");
                let sub = PushSubscription {
                    endpoint: sub.endpoint,
                    p256dh: sub.p256dh,
                    auth: sub.auth,
                };
                store
                    .add_push_subscription(id, &sub, now)
                    .await
                    .expect("a subscription");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

async fn run(db: Db, n: usize) {
    let srv = TestServer::start(db).await;
    let smtp = SmtpServer::start().await;
    let push = PushService::start(&srv.options.integrations.vapid_public_key).await;
    let config = ControllerConfig {
        notify: NotifySettings {
            smtp: Some(SmtpSettings {
                host: "127.0.0.1".into(),
                port: smtp.port,
                tls: SmtpTls::None,
                username: None,
                password: None,
                from: "meatspace <notify@meatspace.test>".into(),
            }),
            push_allow: "127.0.0.0/8".parse().expect("allow loopback"),
            links_origin: srv.base_url.clone(),
            server_key: Some(srv.options.integrations.server_key.clone()),
            ..NotifySettings::default()
        },
        clock: srv.options.clock.clone(),
        ..ControllerConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(meatspace_controller::run(
        Arc::clone(&srv.store),
        config,
        async move {
            let _ = stopped.await;
        },
    ));

    let mut alone = Vec::new();
    for i in 0..SAMPLES {
        alone.push(publish(&srv, &format!("Nobody listens {i}"), ELSEWHERE).await);
    }
    let loading = Instant::now();
    load(&srv.store, &push, n).await;
    let loaded = loading.elapsed();

    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let big = publish(&srv, "Read the water meter", HERE).await;
    // Publishes (of tasks nobody is told of) while the fan-out and the
    // sending run.
    let mut during = Vec::new();
    for i in 0..SAMPLES {
        during.push(publish(&srv, &format!("Meanwhile {i}"), ELSEWHERE).await);
    }
    // When each was first seen done, polled every 50 ms.
    let marks: std::cell::Cell<[Option<Duration>; 3]> = Default::default();
    meatspace_tests::eventually_every(
        Duration::from_millis(50),
        Duration::from_secs(1800),
        "the fan-out and every message",
        || async {
            let fanned_now = srv
                .store
                .notification_backlog()
                .await
                .expect("backlog")
                .causes
                == 0;
            let done = [fanned_now, push.total() >= n, smtp.messages().len() >= n];
            let mut m = marks.get();
            for (mark, done) in m.iter_mut().zip(done) {
                if done && mark.is_none() {
                    *mark = Some(t0.elapsed());
                }
            }
            marks.set(m);
            m.iter().all(Option::is_some).then_some(())
        },
    )
    .await;
    let cpu = cpu_time() - cpu0;
    let [fanned, pushed, mailed] = marks.get().map(|m| m.expect("seen done"));
    let total_made = n * 2;
    println!(
        "{db:?}: {n} workers loaded in {:.1} s; publish latency p50 with nobody listening {}, \
         with {n} matching {}, while fanning out p50 {} (ratio {:.2}); \
         fan-out to {n} workers x 2 channels done after {:.1} s ({:.0} notifications/s); \
         {n} pushes after {:.1} s ({:.0}/s), {n} emails after {:.1} s ({:.0}/s); \
         CPU of this process {:.2} ms per message sent",
        loaded.as_secs_f64(),
        ms(median(alone.clone())),
        ms(big),
        ms(median(during.clone())),
        median(during).as_secs_f64() / median(alone).as_secs_f64(),
        fanned.as_secs_f64(),
        total_made as f64 / fanned.as_secs_f64(),
        pushed.as_secs_f64(),
        n as f64 / pushed.as_secs_f64(),
        mailed.as_secs_f64(),
        n as f64 / mailed.as_secs_f64(),
        cpu.as_secs_f64() * 1e3 / (2 * n) as f64,
    );
    let refused = push.refused();
    assert!(
        refused.is_empty(),
        "pushes refused: {:?}",
        &refused[..refused.len().min(3)]
    );
    let _ = stop.send(());
    let _ = controller.await;
    srv.stop().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("MEATSPACE_BENCH_WORKERS")
        .ok()
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(10_000);
    let backends: Vec<Db> = match std::env::var("MEATSPACE_BENCH_DBS").as_deref() {
        Ok("sqlite") => vec![Db::Sqlite],
        Ok("postgres") => vec![Db::Postgres],
        _ => vec![Db::Sqlite, Db::Postgres],
    };
    for db in backends {
        run(db, n).await;
    }
}
