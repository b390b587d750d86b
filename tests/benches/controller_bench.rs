//! Expiry benchmark on PostgreSQL (not a pass/fail test, and not among the
//! test binaries: a `harness = false` bench target, run by hand with a
//! PostgreSQL server as `scripts/test` starts one):
//!
//! ```text
//! D=$(mktemp -d); scripts/postgres.sh start $D >/dev/null; source $D/env
//! cargo bench -p meatspace-tests --bench controller_bench
//! scripts/postgres.sh stop $D
//! ```
//!
//! Loads 990,000 background tasks in every state (open, assigned and active
//! ones with deadlines hours or days away, completed ones with none) plus
//! one event each, then creates 10,000 tasks through the store that fall due
//! within a few seconds, runs the controller library, and prints the lag
//! from each deadline to the expiry, both as written in the event and as
//! seen by a `LISTEN` client (the moment the commit became visible), along
//! with the query plans of the deadline lookups. A second round makes 10,000
//! tasks due at the same instant. `MEATSPACE_BENCH_BACKGROUND` overrides the
//! number of background tasks.

#[path = "../tests/controller_support/mod.rs"]
mod controller_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use meatspace_domain::{Policy, clock};
use meatspace_store::NewTask;
use meatspace_store::Store;
use meatspace_store::token::TokenHash;
use meatspace_tests::{Db, TestDb};
use sqlx::postgres::{PgListener, PgPool};
use uuid::Uuid;

use controller_support::*;

const DUE: usize = 10_000;
const TASK_COLUMNS: &str = "id, description, state, worker_id, created_at, updated_at, \
    published_at, assigned_at, started_at, ended_at, expires_at, start_by, active_until, \
    open_issues, last_event_id";

/// 990,000 tasks whose deadlines are far away or gone, with one event each.
async fn load_background(pool: &PgPool, n: i64) {
    let worker = Uuid::from_u128(1);
    sqlx::query("INSERT INTO workers (id, name, token_hash, created_at) VALUES ($1, 'bench', sha256('w'), now())")
        .bind(worker)
        .execute(pool)
        .await
        .unwrap();
    // Shares: 50 % open, 9 % assigned, 20 % active, 21 % completed.
    let statements = [
        (
            n * 50 / 100,
            "'open', NULL, now() - interval '1 hour', NULL, NULL, NULL, \
            now() + interval '1 day' + i * interval '1 second', NULL, NULL, \
            now() + interval '1 day' + i * interval '1 second'",
        ),
        (
            n * 9 / 100,
            "'assigned', $1, now() - interval '1 hour', now() - interval '10 minutes', NULL, NULL, \
            now() + interval '7 days', now() + interval '1 hour' + i * interval '10 ms', NULL, \
            now() + interval '1 hour' + i * interval '10 ms'",
        ),
        (
            n * 20 / 100,
            "'active', $1, now() - interval '1 hour', now() - interval '50 minutes', now() - interval '40 minutes', NULL, \
            now() + interval '7 days', NULL, now() + interval '2 hours' + i * interval '10 ms', \
            now() + interval '2 hours' + i * interval '10 ms'",
        ),
        (
            n - n * 79 / 100,
            "'completed', $1, now() - interval '2 days', now() - interval '2 days', now() - interval '2 days', \
            now() - (i % 1000) * interval '1 minute', now() + interval '5 days', NULL, NULL, NULL",
        ),
    ];
    for (count, values) in statements {
        let sql = format!(
            "INSERT INTO tasks (id, description, state, worker_id, published_at, assigned_at, started_at, \
             ended_at, expires_at, start_by, active_until, next_deadline, agent_token_hash, created_at, updated_at) \
             SELECT gen_random_uuid(), 'Background task number ' || i, {values}, \
             sha256(i::text::bytea), now() - interval '2 hours', now() - interval '1 hour' \
             FROM generate_series(1, {count}) AS i"
        );
        sqlx::query(&sql).bind(worker).execute(pool).await.unwrap();
    }
    for statement in [
        "INSERT INTO events (task_id, type, actor, created_at, data) \
         SELECT id, 'task.published', 'agent', published_at, '{}'::jsonb FROM tasks",
        "UPDATE tasks t SET last_event_id = e.id FROM events e WHERE e.task_id = t.id",
        "VACUUM ANALYZE tasks",
        "VACUUM ANALYZE events",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
}

/// The plan of a query, with run-time figures; rolled back.
async fn explain(pool: &PgPool, sql: &str) -> String {
    let mut tx = pool.begin().await.unwrap();
    let rows: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    rows.join("\n")
}

/// When each task's last change became visible to a LISTEN client.
fn watch_changes(mut listener: PgListener) -> Arc<Mutex<HashMap<Uuid, DateTime<Utc>>>> {
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        loop {
            match listener.recv().await {
                Ok(n) => {
                    let at = Utc::now();
                    if let Ok(id) = n.payload().parse() {
                        out.lock().unwrap().insert(id, at);
                    }
                }
                Err(e) => panic!("listener: {e}"),
            }
        }
    });
    seen
}

fn percentiles(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "median {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, worst {:.1} ms (n = {})",
        at(0.5),
        at(0.9),
        at(0.99),
        v[v.len() - 1],
        v.len()
    )
}

async fn create_due(
    store: &Arc<dyn Store>,
    deadlines: Vec<DateTime<Utc>>,
) -> Vec<(Uuid, DateTime<Utc>)> {
    futures::stream::iter(deadlines)
        .map(|expires_at| {
            let store = store.clone();
            async move {
                let t = store
                    .create_task(NewTask::development(
                        Uuid::new_v4(),
                        "Due soon",
                        TokenHash::of("x"),
                        clock::now(),
                        clock::truncate(expires_at),
                    ))
                    .await
                    .unwrap();
                (t.id, t.expires_at)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

async fn measure(
    pool: &PgPool,
    seen: &Arc<Mutex<HashMap<Uuid, DateTime<Utc>>>>,
    due: &[(Uuid, DateTime<Utc>)],
    title: &str,
) {
    let ids: Vec<Uuid> = due.iter().map(|d| d.0).collect();
    let give_up = Instant::now() + Duration::from_secs(300);
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM tasks WHERE id = ANY($1) AND state <> 'expired'",
        )
        .bind(&ids)
        .fetch_one(pool)
        .await
        .unwrap();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < give_up, "{left} tasks not expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written: Vec<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM e.created_at - t.expires_at) * 1000)::float8 FROM events e \
         JOIN tasks t ON t.id = e.task_id WHERE e.type = 'task.expired' AND t.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(written.len(), DUE, "one task.expired per due task");
    let seen = seen.lock().unwrap();
    let visible: Vec<f64> = due
        .iter()
        .map(|(id, deadline)| (seen[id] - *deadline).num_microseconds().unwrap() as f64 / 1000.0)
        .collect();
    println!("\n== {title}");
    println!(
        "lag, deadline → event created_at (the controller's clock): {}",
        percentiles(written)
    );
    println!(
        "lag, deadline → commit visible to a LISTEN client:          {}",
        percentiles(visible)
    );
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(expiry_lag_with_10k_due_among_1m_tasks());
}

async fn expiry_lag_with_10k_due_among_1m_tasks() {
    let background: i64 = std::env::var("MEATSPACE_BENCH_BACKGROUND")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(990_000);
    if let Ok(filter) = std::env::var("MEATSPACE_BENCH_LOG") {
        meatspace_controller::telemetry::init(
            &filter,
            meatspace_controller::telemetry::LogFormat::Text,
        )
        .unwrap();
    }
    let db = TestDb::new(Db::Postgres).await;
    let store = db.store(Policy::default()).await;
    let pool = PgPool::connect(&db.url).await.unwrap();
    let started = Instant::now();
    load_background(&pool, background).await;
    println!(
        "loaded {background} background tasks with one event each in {:.1?}",
        started.elapsed()
    );

    let mut listener = PgListener::connect(&db.url).await.unwrap();
    listener.listen("meatspace_tasks").await.unwrap();
    let seen = watch_changes(listener);

    // Round 1: 10,000 deadlines spread evenly over 10 s.
    let t0 = clock::now() + TimeDelta::seconds(40);
    let spread: Vec<_> = (0..DUE)
        .map(|i| t0 + TimeDelta::milliseconds(i as i64))
        .collect();
    let created = Instant::now();
    let round1 = create_due(&store, spread).await;
    println!(
        "created {DUE} due tasks through the store in {:.1?}",
        created.elapsed()
    );
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&pool)
        .await
        .unwrap();
    println!("tasks stored: {total}");
    sqlx::query("ANALYZE tasks").execute(&pool).await.unwrap();

    let at = (t0 + TimeDelta::seconds(10)).to_rfc3339();
    println!("\n== plan: due-task lookup (one sweep, at the end of the window: all {DUE} due)");
    println!(
        "{}",
        explain(
            &pool,
            &format!(
                "SELECT {TASK_COLUMNS} FROM tasks WHERE next_deadline <= '{at}'::timestamptz \
             ORDER BY next_deadline LIMIT 500 FOR UPDATE SKIP LOCKED"
            )
        )
        .await
    );
    println!("\n== plan: earliest deadline");
    println!(
        "{}",
        explain(
            &pool,
            "SELECT min(next_deadline) FROM tasks WHERE next_deadline IS NOT NULL"
        )
        .await
    );

    assert!(
        clock::now() < t0,
        "set-up overran the first deadline; raise the 40 s margin"
    );
    let controller = InProcess::start(&store, meatspace_controller::ControllerConfig::default());
    measure(
        &pool,
        &seen,
        &round1,
        "10,000 deadlines spread over 10 s, 1,000,000 tasks stored",
    )
    .await;

    // Round 2: 10,000 tasks due at the same instant.
    let t1 = clock::now() + TimeDelta::seconds(30);
    let round2 = create_due(&store, vec![t1; DUE]).await;
    assert!(clock::now() < t1, "set-up overran the deadline");
    measure(
        &pool,
        &seen,
        &round2,
        "10,000 tasks due at the same instant, 1,010,000 tasks stored",
    )
    .await;
    controller.stop().await;
}
