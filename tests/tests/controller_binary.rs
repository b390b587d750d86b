//! The `meatspace-controller` binary as an operator meets it: `--help`
//! documents every setting with its environment variable, the probes and
//! metrics answer, readiness follows the database through an outage (and
//! expiry resumes after it), and SIGTERM shuts it down cleanly.

mod controller_support;

use std::time::Duration;

use chrono::TimeDelta;
use meatspace_controller::metrics::{RECONCILE_ERRORS, TASKS_EXPIRED};
use meatspace_domain::{EventType, Policy, TaskState};
use meatspace_tests::{Db, POSTGRES_ENV, TestDb};
use sqlx::Connection;

use controller_support::*;
use meatspace_tests::eventually;

on_both_backends!(probes_metrics_and_graceful_shutdown);

#[test]
fn help_documents_every_setting_with_its_environment_variable() {
    let out = std::process::Command::new(controller_bin())
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).expect("utf-8");
    for var in [
        "DATABASE_URL",
        "MEATSPACE_CONTROLLER_LISTEN_ADDR",
        "MEATSPACE_CONTROLLER_DB_MAX_CONNECTIONS",
        "MEATSPACE_RETENTION_SECONDS",
        "MEATSPACE_RETENTION_INTERVAL_SECONDS",
        "MEATSPACE_CONTROLLER_BATCH_SIZE",
        "MEATSPACE_CONTROLLER_MAX_SLEEP_SECONDS",
        "RUST_LOG",
        "MEATSPACE_LOG_FORMAT",
        "MEATSPACE_DEFAULT_LIFETIME_SECONDS",
        "MEATSPACE_START_TIMEOUT_SECONDS",
        "MEATSPACE_ACTIVE_TIME_LIMIT_SECONDS",
    ] {
        assert!(
            help.contains(&format!("[env: {var}")),
            "--help does not mention {var}:\n{help}"
        );
    }
    assert!(
        help.contains("[default: 2592000]"),
        "the 30-day retention default is documented"
    );
}

#[test]
fn a_missing_database_url_is_a_clear_error() {
    let out = std::process::Command::new(controller_bin())
        .env_clear()
        .output()
        .expect("run without configuration");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--database-url"), "{err}");
}

#[test]
fn without_the_secret_key_it_refuses_to_start() {
    // Webhooks can always exist (the API server accepts webhook_url), and
    // one this process cannot sign would silently never fire. The check
    // comes before the store is opened: no database is needed to see it.
    for key in [None, Some("")] {
        let mut cmd = std::process::Command::new(controller_bin());
        cmd.env_clear()
            .env("DATABASE_URL", "sqlite:///nonexistent/never-opened.db")
            .env("MEATSPACE_CONTROLLER_LISTEN_ADDR", "127.0.0.1:0");
        if let Some(k) = key {
            cmd.env("MEATSPACE_SECRET_KEY", k);
        }
        let out = cmd.output().expect("run without a secret key");
        assert!(!out.status.success(), "it started without a key ({key:?})");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("MEATSPACE_SECRET_KEY is not set") && err.contains("webhook"),
            "{err}"
        );
    }
}

async fn probes_metrics_and_graceful_shutdown(db: Db) {
    let db = TestDb::new(db).await;
    let store = db.store(Policy::default()).await;
    // Created before the process starts: a SQLite database signals changes
    // only within the process that makes them.
    let t = open(&store, TimeDelta::milliseconds(1500)).await;
    let mut p = controller_process(&db.url, &[]);
    p.ready().await;
    assert_eq!(p.get("/livez").await.unwrap().0, 200);
    let (status, body) = p.get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains("meatspace_tasks_expired_total{reason=\"active_time_limit\"} 0"),
        "{body}"
    );

    eventually(Duration::from_secs(60), "the task to expire", || async {
        (task(&store, t.id).await.state == TaskState::Expired).then_some(())
    })
    .await;
    // The controller counts an expiry (and times its pass) after the
    // transaction commits, so the store shows it a moment before /metrics.
    let expected = [
        "meatspace_tasks_expired_total{reason=\"lifetime\"} 1",
        "meatspace_expiry_lag_seconds_count 1",
        "meatspace_expiry_lag_seconds_bucket{le=\"60\"} 1",
        "meatspace_reconcile_duration_seconds_bucket{reconciler=\"expiry\"",
        "meatspace_reconcile_duration_seconds_count{reconciler=\"retention\"}",
        "# HELP meatspace_expiry_lag_seconds",
    ];
    let body = eventually(
        Duration::from_secs(10),
        "/metrics to count the expiry, its lag and the reconcilers' passes",
        || async {
            let (_, body) = p.get("/metrics").await.ok()?;
            expected.iter().all(|e| body.contains(e)).then_some(body)
        },
    )
    .await;
    // The lag itself is a figure (printed here, measured at scale by the
    // controller_bench benchmark); the test asks only that the histogram
    // recorded this one expiry, within its last bucket.
    let lag = body
        .lines()
        .find_map(|l| l.strip_prefix("meatspace_expiry_lag_seconds_sum "))
        .unwrap_or("(missing)");
    println!("expiry lag of the one task: {lag} s");
    assert!(
        p.terminate().await,
        "SIGTERM did not end it cleanly:\n{}",
        p.logs()
    );
}

/// Blocks or re-allows connections to a database and, when blocking, ends
/// the ones already open: to its clients the database is down.
async fn set_database_up(url: &str, up: bool) {
    let name = url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let admin = std::env::var(POSTGRES_ENV).expect("test PostgreSQL server");
    let mut c = sqlx::PgConnection::connect(&admin)
        .await
        .expect("connect as admin");
    sqlx::query(&format!(
        "ALTER DATABASE {name} WITH ALLOW_CONNECTIONS {up}"
    ))
    .execute(&mut c)
    .await
    .expect("alter database");
    if !up {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(&name)
            .execute(&mut c)
            .await
            .expect("end connections");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_database_and_expiry_resumes_after_an_outage() {
    let db = TestDb::new(Db::Postgres).await;
    let store = db.store(Policy::default()).await;
    let mut p = controller_process(&db.url, &[]);
    p.ready().await;
    let t = open(&store, TimeDelta::seconds(2)).await;

    set_database_up(&db.url, false).await;
    eventually(
        Duration::from_secs(10),
        "/readyz to report the outage",
        || async { matches!(p.get("/readyz").await, Ok((503, _))).then_some(()) },
    )
    .await;
    assert_eq!(
        p.get("/livez").await.unwrap().0,
        200,
        "an outage is no reason to restart the process"
    );
    // The deadline passes while the database is down.
    let past_deadline = (t.expires_at + TimeDelta::seconds(1) - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    // Real time is the behaviour: the controller is a process of its
    // own on the system's clock, and the deadline must pass while the
    // database is down.
    tokio::time::sleep(past_deadline).await;
    assert_eq!(
        store.next_deadline().await.ok(),
        None,
        "the database is still down"
    );
    assert!(
        p.counter(RECONCILE_ERRORS).await > 0.0,
        "failed passes are counted"
    );

    set_database_up(&db.url, true).await;
    p.ready().await;
    let expired = eventually(
        Duration::from_secs(15),
        "the task to expire after the outage",
        || async {
            store
                .events(t.id, 0, 100)
                .await
                .ok()?
                .into_iter()
                .find(|e| e.kind == EventType::TaskExpired)
        },
    )
    .await;
    assert_eq!(expired.data["reason"], "lifetime");
    check_consistent(&store, t.id).await;
    assert_eq!(p.counter(TASKS_EXPIRED).await, 1.0);
    assert!(
        p.terminate().await,
        "SIGTERM did not end it cleanly:\n{}",
        p.logs()
    );
}
