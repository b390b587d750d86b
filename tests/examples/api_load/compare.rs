//! Comparison mode of the load benchmark (`scripts/bench.sh --compare`):
//! the real server driven by `wrk` side by side with `pgbench` running the
//! SQL the server issues for the same request. Figures, not assertions.
//!
//! For each backend (SQLite, then PostgreSQL) it starts the release server
//! on a fresh database, optionally preloads a large store (`--large`: 1M
//! tasks and 10M events written with one SQL statement per table), sets up
//! one active task per client over the API, and measures with `wrk`
//! (`-c <clients>`, one keep-alive connection each):
//!
//! - `empty poll`: `GET /api/v1/tasks/{id}/events?after=<last id>` of the
//!   clients' tasks, round robin: the request every monitored task makes,
//!   forever;
//! - `empty poll after a restart` (last): the same after the server was
//!   restarted on the same database, over the tasks polled before and as
//!   many created after the restart (the server's count of polls answered
//!   from memory is printed after each run);
//! - `create`: `POST /api/v1/tasks`;
//! - `lifecycle`: each connection runs tasks through create, publish,
//!   claim, start and complete, one request after the other (reported as
//!   tasks/s; `wrk` runs one thread per connection here, so that each
//!   thread's script follows exactly one connection's answers).
//!
//! On PostgreSQL it also captures the statements the server issues for one
//! request of the first two kinds from the server's own statement log
//! (`log_statement = 'all'` switched on with `ALTER SYSTEM` and
//! `pg_reload_conf()` around a single request, parameters taken from the
//! log's `DETAIL: parameters:` lines), binds the parameters as typed
//! literals (types from `PREPARE` + `pg_prepared_statements`), turns them
//! into a pgbench script (the created task's id is replaced by a fresh
//! random UUID per transaction, so every create inserts a new row) and runs
//! `pgbench -M prepared` with as many clients for as long, with the server
//! stopped. An empty poll answered from the server's memory issues no SQL;
//! the script captured is that of a poll the server answers from the
//! database (the first poll of a task), so the ratio says how the HTTP path
//! compares with the database doing that request's work.
//!
//! The same pgbench capture runs a whole lifecycle (create, publish,
//! claim, start, complete: the statements of all five, one pgbench
//! transaction per lifecycle). On SQLite, with the server stopped, the
//! create's row is inserted again natively (`limits.rs`: one per
//! transaction, and 64 per transaction for what grouping could buy). Last,
//! the empty poll's answer (the same bytes) is served by a bare hyper
//! service and by nginx under the same wrk: the HTTP limit of this machine,
//! which the summary sets both polls (before and after the restart) beside.
//!
//! Every row gives requests (transactions) per second, latency percentiles,
//! errors (non-2xx answers and socket errors; must be 0) and the CPU used
//! by the server, by the load generator (`wrk` or `pgbench`) and by the
//! rest of the machine (PostgreSQL, the kernel's network work). The
//! server's peak resident memory closes each backend.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use meatspace_tests::{POSTGRES_ENV, fresh_postgres_database};
use reqwest::Client;
use reqwest::header::AUTHORIZATION;
use sqlx::{Connection, Executor, Row as _};

use super::limits;
use super::{
    Backend, CREATE_BODY, CpuSnapshot, DEV_KEY_HEADER, Server, Settings, call,
    clock_ticks_per_second, create_task, drop_postgres_database, http_client, machine_busy_ticks,
    mib, post_with_dev_key, process_ticks, publish_and_work, register_worker, send_message,
    text_at,
};

/// Events on each polled task: published, assigned, started and messages.
const POLL_FEED_EVENTS: usize = 8;
/// The large store of `--large`.
const LARGE_TASKS: u64 = 1_000_000;
const EVENTS_PER_LARGE_TASK: u64 = 10;

pub async fn run(settings: &Settings) -> Result<()> {
    let wrk = which("wrk").context(
        "wrk is not installed: run scripts/bench.sh --compare (it installs it), or apt-get install wrk",
    )?;
    let pg_bin = std::env::var("MEATSPACE_TEST_PG_BIN").ok();
    preamble(settings, &wrk);
    let mut failed = 0;
    let mut summary = Vec::new();
    let mut poll_answer = None;
    for backend in &settings.backends {
        let (rows, answer) = bench_backend(settings, *backend, &wrk, pg_bin.as_deref())
            .await
            .with_context(|| format!("comparison on {}", backend.name()))?;
        failed += rows.iter().map(|r| r.errors).sum::<u64>();
        summary.push((*backend, rows));
        poll_answer.get_or_insert(answer);
    }
    let answer = poll_answer.context("no backend was measured")?;
    let limit_rows = http_limits(settings, &wrk, &answer).await?;
    failed += limit_rows.iter().map(|r| r.errors).sum::<u64>();
    print_summary(settings, &summary, &limit_rows);
    if failed > 0 {
        bail!("{failed} requests failed; the figures above are not valid");
    }
    Ok(())
}

pub(super) fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

fn preamble(s: &Settings, wrk: &Path) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("meatspace comparison benchmark: the server under wrk, the database under pgbench");
    println!("  server:   {}", s.server.display());
    println!("  wrk:      {}", wrk.display());
    println!(
        "  load:     {} connections, {} s per scenario after {} s of warm-up; store: {}",
        s.clients,
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64(),
        if s.large {
            format!(
                "preloaded with {LARGE_TASKS} tasks and {} events",
                LARGE_TASKS * EVENTS_PER_LARGE_TASK
            )
        } else {
            "empty".into()
        }
    );
    println!(
        "  machine:  {cpus} CPUs, load average {} before the run; generator, server and database share them",
        load.join(" ")
    );
    println!(
        "  CPU:      average cores busy: server / generator (wrk or pgbench) / rest (PostgreSQL, kernel, other)"
    );
}

/// One measured row.
#[derive(Debug, Clone)]
struct Figures {
    name: String,
    /// Requests (or pgbench transactions, or tasks) per second.
    rate: f64,
    unit: &'static str,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    errors: u64,
    cpu: super::CpuUse,
}

fn header() {
    println!(
        "  {:<34} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7}   CPU server/generator/rest",
        "scenario", "rate", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"
    );
}

fn print_row(r: &Figures) {
    println!(
        "  {:<34} {:>10} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7}   {:.2} / {:.2} / {:.2}",
        r.name,
        format!("{:.0} {}", r.rate, r.unit),
        r.p50_ms,
        r.p90_ms,
        r.p99_ms,
        r.max_ms,
        r.errors,
        r.cpu.server,
        r.cpu.load_generator,
        r.cpu.rest
    );
}

fn print_summary(settings: &Settings, all: &[(Backend, Vec<Figures>)], limits: &[Figures]) {
    println!();
    println!(
        "== summary ({} store, {} connections)",
        if settings.large { "large" } else { "empty" },
        settings.clients
    );
    // The HTTP limit: the faster of the minimal servers.
    let limit = limits
        .iter()
        .max_by(|a, b| a.rate.total_cmp(&b.rate))
        .map(|l| (l.name.as_str(), l.rate));
    let pair = |backend: Backend, what: &str, h: &Figures, against: &str, rate: f64, unit: &str| {
        println!(
            "  {:<10} {:<26}: {:>7.0} {} (p99 {:.2} ms) ÷ {against} {rate:>7.0} {unit} = {:.2}",
            backend.name(),
            what,
            h.rate,
            h.unit,
            h.p99_ms,
            h.rate / rate
        );
    };
    for (backend, rows) in all {
        let find = |name: &str| rows.iter().find(|r| r.name == name);
        let starts = |name: &str| rows.iter().find(|r| r.name.starts_with(name));
        for poll in ["empty poll", "empty poll after a restart"] {
            if let (Some(h), Some((name, rate))) = (find(poll), limit) {
                pair(*backend, poll, h, name, rate, "req/s");
            }
        }
        if let (Some(h), Some(p)) = (find("empty poll"), starts("pgbench: empty poll")) {
            pair(*backend, "empty poll", h, "pgbench", p.rate, "tx/s");
        }
        // What checking an owner's API key (instead of the task's token) costs.
        if let (Some(k), Some(t)) = (find("empty poll, API key"), find("empty poll")) {
            pair(
                *backend,
                "empty poll, API key",
                k,
                "token poll",
                t.rate,
                "req/s",
            );
        }
        if let Some(h) = find("create") {
            if let Some(p) = starts("pgbench: create") {
                pair(*backend, "create", h, "pgbench", p.rate, "tx/s");
            }
            if let Some(p) = starts("sqlite (native): create, 1/tx") {
                pair(*backend, "create", h, "native SQLite", p.rate, "rows/s");
            }
        }
        if let Some(l) = find("lifecycle") {
            match starts("pgbench: lifecycle") {
                Some(p) => pair(*backend, "lifecycle", l, "pgbench", p.rate, "tx/s"),
                None => println!(
                    "  {:<10} {:<26}: {:>7.0} tasks/s (5 requests each, p99 {:.2} ms per request)",
                    backend.name(),
                    "lifecycle",
                    l.rate,
                    l.p99_ms
                ),
            }
        }
    }
}

// ---- one backend -----------------------------------------------------------------

async fn bench_backend(
    settings: &Settings,
    backend: Backend,
    wrk: &Path,
    pg_bin: Option<&str>,
) -> Result<(Vec<Figures>, limits::Answer)> {
    let dir = tempfile::tempdir()?;
    let database_url = match backend {
        Backend::Sqlite => format!("sqlite://{}/b.db", dir.path().display()),
        Backend::Postgres => fresh_postgres_database().await,
    };
    println!();
    println!(
        "== {} ({})",
        backend.name(),
        meatspace_store::redact_url(&database_url)
    );
    if settings.large {
        let started = Instant::now();
        preload(backend, &database_url).await?;
        println!(
            "  preloaded {LARGE_TASKS} tasks and {} events in {:.0} s",
            LARGE_TASKS * EVENTS_PER_LARGE_TASK,
            started.elapsed().as_secs_f64()
        );
    }
    let server = Server::start(&settings.server, &database_url, dir.path()).await?;
    // A benchmark, not a test: the server is ready (Server::start waited for
    // it); this pause only lets its start-up work settle before the idle RSS.
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "  server ready; RSS at idle: {}",
        mib(server.memory_kib("VmRSS"))
    );
    let http = http_client()?;
    let tasks = futures::future::try_join_all(
        (0..settings.clients).map(|_| active_task(&server, &http, POLL_FEED_EVENTS - 3)),
    )
    .await?;
    // The same, created by an agent's API key and polled with it.
    let key = agent_key(&server, &http).await?;
    let keyed = futures::future::try_join_all(
        (0..settings.clients)
            .map(|_| active_task_as(&server, &http, POLL_FEED_EVENTS - 3, Some(&key))),
    )
    .await?
    .into_iter()
    .map(|t| PolledTask {
        bearer: format!("Bearer {key}"),
        ..t
    })
    .collect::<Vec<_>>();

    // Capture the SQL of one request of each kind (PostgreSQL only), with
    // a task the server has not answered a poll of yet.
    let mut scripts: Vec<(&str, String)> = Vec::new();
    if backend == Backend::Postgres {
        let capture_task = active_task(&server, &http, 1).await?;
        let poll = capture(&database_url, || async {
            call(
                http.get(server.url(&format!(
                    "/api/v1/tasks/{}/events?after={}",
                    capture_task.id, capture_task.last_event
                )))
                .header(AUTHORIZATION, &capture_task.bearer),
            )
            .await
            .map(|_| None)
        })
        .await
        .context("capturing the SQL of an empty poll")?;
        scripts.push(("pgbench: empty poll (its SQL)", poll));
        let create = capture(&database_url, || async {
            let created = create_task(&http, &server, None).await?;
            Ok(Some(text_at(&created, "/task/id")?))
        })
        .await
        .context("capturing the SQL of a create")?;
        scripts.push(("pgbench: create (its SQL)", create));
        let worker_bearer = register_worker(&http, &server).await?;
        let lifecycle = capture(&database_url, || async {
            let created = create_task(&http, &server, None).await?;
            let id = text_at(&created, "/task/id")?;
            let agent = format!("Bearer {}", text_at(&created, "/agent_token")?);
            publish_and_work(
                &http,
                &server,
                &id,
                &agent,
                &worker_bearer,
                &["claim", "start", "complete"],
            )
            .await?;
            Ok(Some(id))
        })
        .await
        .context("capturing the SQL of a lifecycle")?;
        scripts.push(("pgbench: lifecycle (its SQL)", lifecycle));
    }

    // The bytes of an empty poll's answer, for the bare HTTP servers.
    let first = &tasks[0];
    let poll_answer = limits::Answer::record(
        http.get(server.url(&format!(
            "/api/v1/tasks/{}/events?after={}",
            first.id, first.last_event
        )))
        .header(AUTHORIZATION, &first.bearer)
        .send()
        .await?,
    )
    .await?;

    let work = tempfile::tempdir()?;
    let mut rows = Vec::new();
    header();
    let wrk = Wrk {
        settings,
        program: wrk,
        work: work.path(),
    };
    let target = Target::server(&server);
    for (name, script, thread_per_connection) in [
        ("empty poll", lua_poll(&tasks), false),
        ("empty poll, API key", lua_poll(&keyed), false),
        ("create", lua_create(&server.dev_key), false),
        ("lifecycle", lua_lifecycle(&server.dev_key), true),
    ] {
        rows.push(
            wrk.run(&target, name, &script, thread_per_connection)
                .await?,
        );
    }
    print_memory(&server, &http, "").await?;
    let commits = metric(&server, &http, "meatspace_sqlite_commits_total").await?;
    if commits > 0 {
        let writes = metric(&server, &http, "meatspace_sqlite_writes_total").await?;
        println!(
            "  SQLite writer: {writes} writes in {commits} commits ({:.1} per commit)",
            writes as f64 / commits as f64
        );
    }
    server.stop().await?;

    // Every production server restarts: poll again after a restart on the
    // same database, the tasks polled before it and as many created after.
    let server = Server::start(&settings.server, &database_url, dir.path()).await?;
    let mut restarted = futures::future::try_join_all(
        (0..settings.clients).map(|_| active_task(&server, &http, POLL_FEED_EVENTS - 3)),
    )
    .await?;
    restarted.extend(tasks);
    let script = lua_poll(&restarted);
    let target = Target::server(&server);
    rows.push(
        wrk.run(&target, "empty poll after a restart", &script, false)
            .await?,
    );
    print_memory(&server, &http, "after the restart: ").await?;
    server.stop().await?;
    let logged = super::log_tail(dir.path());
    if !logged.is_empty() {
        println!("  the server logged (last lines):\n{logged}");
    }

    if backend == Backend::Sqlite {
        // SQLite itself, with the server stopped: the create's row again
        // and again (see limits.rs).
        let sqlite3 = which("sqlite3").context(
            "sqlite3 is not installed: run scripts/bench.sh --compare (it installs it), or apt-get install sqlite3",
        )?;
        let file = dir.path().join("b.db");
        for per_transaction in [1, 64] {
            let run =
                limits::sqlite_native_create(&sqlite3, &file, settings.duration, per_transaction)
                    .await?;
            // The shell reports no per-transaction latency.
            let row = Figures {
                name: format!("sqlite (native): create, {per_transaction}/tx"),
                rate: run.per_second,
                unit: "rows/s",
                p50_ms: 0.0,
                p90_ms: 0.0,
                p99_ms: 0.0,
                max_ms: 0.0,
                errors: 0,
                cpu: run.cpu,
            };
            print_row(&row);
            rows.push(row);
        }
    }

    if !scripts.is_empty() {
        let bin =
            pg_bin.context("MEATSPACE_TEST_PG_BIN is not set (scripts/postgres.sh sets it)")?;
        let pgbench = Path::new(bin).join("pgbench");
        for (name, script) in &scripts {
            rows.push(
                run_pgbench(settings, &pgbench, &database_url, work.path(), name, script).await?,
            );
        }
        let mut text = String::new();
        for (name, script) in &scripts {
            let _ = writeln!(text, "  -- {name}\n{}", indent(script));
        }
        println!("  the pgbench scripts (captured from the server's statement log):\n{text}");
    }
    if backend == Backend::Postgres {
        drop_postgres_database(&database_url).await?;
    }
    Ok((rows, poll_answer))
}

/// The HTTP limit of this machine for the empty poll's answer: the same
/// bytes from a bare hyper service and from nginx, under the same wrk.
async fn http_limits(
    settings: &Settings,
    wrk: &Path,
    answer: &limits::Answer,
) -> Result<Vec<Figures>> {
    println!();
    println!(
        "== HTTP limit: the empty poll's answer ({} bytes of body) from minimal servers",
        answer.body.len()
    );
    let work = tempfile::tempdir()?;
    // wrk's own request (no `request()`): it carries the Host header,
    // which nginx requires of HTTP/1.1 and a request formatted before wrk
    // knows the URL lacks.
    let script = format!("wrk.path = '/'\nfunction completed_total() return 0 end\n{LUA_DONE}");
    header();
    let wrk = Wrk {
        settings,
        program: wrk,
        work: work.path(),
    };
    let mut rows = Vec::new();
    let bare = limits::Reference::bare_hyper(answer, work.path()).await?;
    rows.push(
        wrk.run(&Target::reference(&bare), "bare hyper", &script, false)
            .await?,
    );
    bare.stop().await?;
    match limits::Reference::nginx(answer, work.path()).await? {
        Some(nginx) => {
            rows.push(
                wrk.run(
                    &Target::reference(&nginx),
                    "nginx return 200",
                    &script,
                    false,
                )
                .await?,
            );
            nginx.stop().await?;
        }
        None => println!("  (nginx is not installed: scripts/bench.sh --compare installs it)"),
    }
    Ok(rows)
}

/// Prints the server's peak resident memory and its count of the empty
/// polls it answered from memory, after `when`.
async fn print_memory(server: &Server, http: &Client, when: &str) -> Result<()> {
    println!(
        "  {when}server peak RSS (VmHWM): {}; empty polls answered from memory: {}",
        mib(server.memory_kib("VmHWM")),
        metric(server, http, "meatspace_feed_memory_answers_total").await?
    );
    Ok(())
}

/// An unlabelled counter of the server's metrics; 0 when it has none yet.
async fn metric(server: &Server, http: &Client, name: &str) -> Result<u64> {
    let text = http
        .get(format!("{}/metrics", server.metrics_url))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(text
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0, |v| v as u64))
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An active task as its agent knows it, with its last event id.
struct PolledTask {
    id: String,
    bearer: String,
    last_event: i64,
}

/// A new agent's API key, made with the development key.
async fn agent_key(server: &Server, http: &Client) -> Result<String> {
    let made = post_with_dev_key(http, server, "/api/v1/keys", r#"{"name":"bench agent"}"#).await?;
    text_at(&made, "/secret")
}

/// Registers a worker, creates, publishes, claims and starts a task and
/// sends `messages` messages.
async fn active_task(server: &Server, http: &Client, messages: usize) -> Result<PolledTask> {
    active_task_as(server, http, messages, None).await
}

/// An active task with `messages` messages, created with `key` (an API
/// key) or else the development key.
async fn active_task_as(
    server: &Server,
    http: &Client,
    messages: usize,
    key: Option<&str>,
) -> Result<PolledTask> {
    let worker_bearer = register_worker(http, server).await?;
    let created = create_task(http, server, key).await?;
    let id = text_at(&created, "/task/id")?;
    let bearer = format!("Bearer {}", text_at(&created, "/agent_token")?);
    publish_and_work(
        http,
        server,
        &id,
        &bearer,
        &worker_bearer,
        &["claim", "start"],
    )
    .await?;
    let mut last_event = 0;
    for _ in 0..messages {
        let change = send_message(http, server, &id, &worker_bearer).await?;
        last_event = change["events"][0]["id"].as_i64().context("no event id")?;
    }
    if messages == 0 {
        let page = call(
            http.get(server.url(&format!("/api/v1/tasks/{id}/events?after=0&limit=1000")))
                .header(AUTHORIZATION, &bearer),
        )
        .await?;
        last_event = page["next_cursor"].as_i64().context("no next_cursor")?;
    }
    Ok(PolledTask {
        id,
        bearer,
        last_event,
    })
}

// ---- preloading a large store ------------------------------------------------------

/// Writes LARGE_TASKS terminal tasks with EVENTS_PER_LARGE_TASK events each,
/// straight into the database (after the store's own migrations), in a few
/// set-based statements.
async fn preload(backend: Backend, url: &str) -> Result<()> {
    let policy = meatspace_domain::Policy::default();
    let options = meatspace_store::ConnectOptions::default();
    match backend {
        Backend::Postgres => {
            let store = meatspace_store_connect::PgStore::connect(url, policy, &options).await?;
            let pool = store.pool();
            pool.execute(
                format!(
                    "INSERT INTO tasks (id, description, state, agent_token_hash, created_at, updated_at, \
                       published_at, ended_at, expires_at, last_event_id) \
                     SELECT md5('t' || i)::uuid, 'preloaded task ' || i, 'completed', \
                       sha256(('t' || i)::bytea), now() - interval '1 day', now(), \
                       now() - interval '1 day', now(), now() + interval '1 day', i * {EVENTS_PER_LARGE_TASK} \
                     FROM generate_series(1, {LARGE_TASKS}) AS i"
                )
                .as_str(),
            )
            .await?;
            pool.execute(
                format!(
                    "INSERT INTO events (task_id, type, actor, created_at, data) \
                     SELECT md5('t' || ((n - 1) / {EVENTS_PER_LARGE_TASK} + 1))::uuid, \
                       CASE WHEN n % {EVENTS_PER_LARGE_TASK} = 0 THEN 'task.completed' ELSE 'worker.message' END, \
                       'worker', now(), jsonb_build_object('text', 'preloaded message ' || n) \
                     FROM generate_series(1, {}) AS n",
                    LARGE_TASKS * EVENTS_PER_LARGE_TASK
                )
                .as_str(),
            )
            .await?;
            pool.execute("VACUUM ANALYZE tasks").await?;
            pool.execute("VACUUM ANALYZE events").await?;
            // Write the loaded pages out now, not during the measurements.
            pool.execute("CHECKPOINT").await?;
            pool.close().await;
        }
        Backend::Sqlite => {
            let store =
                meatspace_store_connect::SqliteStore::connect(url, policy, &options).await?;
            let pool = store.pool();
            let uuid = |expr: &str| format!("printf('%08x-0000-4000-8000-%012x', {expr}, {expr})");
            pool.execute(
                format!(
                    "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {LARGE_TASKS}) \
                     INSERT INTO tasks (id, description, state, agent_token_hash, created_at, updated_at, \
                       published_at, ended_at, expires_at, last_event_id) \
                     SELECT {}, 'preloaded task ' || i, 'completed', randomblob(32), \
                       CAST(unixepoch('now', '-1 day') AS INTEGER) * 1000, unixepoch('now') * 1000, \
                       unixepoch('now', '-1 day') * 1000, unixepoch('now') * 1000, \
                       unixepoch('now', '+1 day') * 1000, i * {EVENTS_PER_LARGE_TASK} FROM s",
                    uuid("i")
                )
                .as_str(),
            )
            .await?;
            pool.execute(
                format!(
                    "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {}) \
                     INSERT INTO events (task_id, type, actor, created_at, data) \
                     SELECT {}, \
                       CASE WHEN n % {EVENTS_PER_LARGE_TASK} = 0 THEN 'task.completed' ELSE 'worker.message' END, \
                       'worker', unixepoch('now') * 1000, json_object('text', 'preloaded message ' || n) FROM s",
                    LARGE_TASKS * EVENTS_PER_LARGE_TASK,
                    uuid(&format!("((n - 1) / {EVENTS_PER_LARGE_TASK} + 1)"))
                )
                .as_str(),
            )
            .await?;
            pool.execute("ANALYZE").await?;
            pool.execute("PRAGMA wal_checkpoint(TRUNCATE)").await?;
            pool.close().await;
        }
    }
    // The checkpoints above only reach the OS (the throwaway PostgreSQL runs
    // with fsync off): flush the gigabytes of dirty pages now, or the kernel
    // writes them back during the measurements.
    let synced = tokio::process::Command::new("sync").status().await?;
    anyhow::ensure!(synced.success(), "sync after the preload failed: {synced}");
    Ok(())
}

// ---- capturing the server's SQL ---------------------------------------------------------

/// Runs `request` with PostgreSQL's statement log on and returns the
/// statements it issued as a pgbench script. `request` may return an id
/// (of a row it created) to be replaced by a fresh UUID per transaction.
async fn capture<F, Fut>(database_url: &str, request: F) -> Result<String>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Option<String>>>,
{
    let admin_url = std::env::var(POSTGRES_ENV)?;
    let log_path = PathBuf::from(std::env::var("MEATSPACE_PG_DIR").context(
        "MEATSPACE_PG_DIR is not set: the comparison reads the statement log of a server started by scripts/postgres.sh",
    )?)
    .join("postgres.log");
    let mut admin = sqlx::PgConnection::connect(&admin_url).await?;
    let offset = std::fs::metadata(&log_path)?.len();
    admin
        .execute("ALTER SYSTEM SET log_statement = 'all'")
        .await?;
    admin.execute("SELECT pg_reload_conf()").await?;
    // Every backend rereads its configuration before its next command, once
    // the postmaster has signalled it: no query tells when that happened, so
    // a benchmark-only margin (a missed statement makes capture fail loudly
    // below: "no statement in the log").
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replaced = request().await;
    // Margin for the last statement's log line before logging is turned off.
    tokio::time::sleep(Duration::from_millis(100)).await;
    admin.execute("ALTER SYSTEM RESET log_statement").await?;
    admin.execute("SELECT pg_reload_conf()").await?;
    admin.close().await?;
    let replaced = replaced?;
    // Margin for PostgreSQL to finish writing the log file.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read(&log_path)?;
    let log = String::from_utf8_lossy(&log[offset as usize..]).into_owned();
    let statements = parse_statement_log(&log);
    if statements.is_empty() {
        bail!("no statement in the log {}", log_path.display());
    }
    to_pgbench(database_url, &statements, replaced.as_deref()).await
}

/// A statement from the log, with its parameters (None = NULL).
#[derive(Debug)]
struct Logged {
    sql: String,
    params: Vec<Option<String>>,
}

/// Statements of the request, in order, from the lines `LOG:  statement: …`
/// and `LOG:  execute <name>: …` (+ `DETAIL:  parameters: $1 = '…', …`).
/// The availability probe (`SELECT 1`), the change listener, the
/// configuration reload itself and the worker digest read (kept in memory
/// after the first) are left out.
fn parse_statement_log(log: &str) -> Vec<Logged> {
    let mut out: Vec<Logged> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split_once("LOG:  statement: ").map(|(_, r)| r) {
            out.push(Logged {
                sql: rest.to_owned(),
                params: Vec::new(),
            });
        } else if let Some(rest) = line.split_once("LOG:  execute ").map(|(_, r)| r) {
            let sql = rest.split_once(": ").map_or(rest, |(_, s)| s);
            out.push(Logged {
                sql: sql.to_owned(),
                params: Vec::new(),
            });
        } else if let Some(rest) = line.split_once("DETAIL:  parameters: ").map(|(_, r)| r)
            && let Some(last) = out.last_mut()
        {
            last.params = parse_params(rest);
        }
    }
    out.retain(|s| {
        let sql = s.sql.trim();
        // A worker's token digest is read once and then kept in memory:
        // in the steady state a lifecycle does not read it.
        !(sql == "SELECT 1"
            || sql.starts_with("SELECT token_hash FROM workers")
            || sql.starts_with("LISTEN")
            || sql.contains("pg_reload_conf")
            || sql.starts_with("ALTER SYSTEM"))
    });
    out
}

/// `$1 = 'a', $2 = NULL, $3 = 'it''s'` → values by position.
fn parse_params(text: &str) -> Vec<Option<String>> {
    let mut values: BTreeMap<usize, Option<String>> = BTreeMap::new();
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        rest = &rest[start + 1..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(index) = digits.parse::<usize>() else {
            break;
        };
        rest = rest[digits.len()..].trim_start_matches(" = ");
        if let Some(after) = rest.strip_prefix("NULL") {
            values.insert(index, None);
            rest = after;
            continue;
        }
        let Some(quoted) = rest.strip_prefix('\'') else {
            break;
        };
        let mut value = String::new();
        let mut chars = quoted.char_indices().peekable();
        let mut end = quoted.len();
        while let Some((i, c)) = chars.next() {
            if c == '\'' {
                if chars.peek().is_some_and(|&(_, n)| n == '\'') {
                    value.push('\'');
                    chars.next();
                } else {
                    end = i + 1;
                    break;
                }
            } else {
                value.push(c);
            }
        }
        values.insert(index, Some(value));
        rest = &quoted[end..];
    }
    values.into_values().collect()
}

/// Whether `sql` compares a task's `last_event_id` with parameter `$index`.
fn compares_last_event(sql: &str, index: usize) -> bool {
    let needle = format!("last_event_id = ${index}");
    sql.match_indices(&needle).any(|(at, _)| {
        !sql[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// The statements as a pgbench script: each parameter bound as a typed
/// literal (types from PREPARE), `replaced` (an id the request created) as
/// a random UUID drawn per transaction.
async fn to_pgbench(
    database_url: &str,
    statements: &[Logged],
    replaced: Option<&str>,
) -> Result<String> {
    let mut conn = sqlx::PgConnection::connect(database_url).await?;
    let mut script = String::new();
    if replaced.is_some() {
        script.push_str(
            "\\set r1 random(1, 9223372036854775806)\n\\set r2 random(1, 9223372036854775806)\n",
        );
    }
    for (k, statement) in statements.iter().enumerate() {
        let mut sql = statement.sql.clone();
        if !statement.params.is_empty() {
            let name = format!("meatspace_capture_{k}");
            conn.execute(format!("PREPARE {name} AS {}", statement.sql).as_str())
                .await
                .with_context(|| format!("PREPARE {}", statement.sql))?;
            let types: Vec<String> = sqlx::query(
                "SELECT parameter_types::text[] AS t FROM pg_prepared_statements WHERE name = $1",
            )
            .bind(&name)
            .fetch_one(&mut conn)
            .await?
            .try_get("t")?;
            conn.execute(format!("DEALLOCATE {name}").as_str()).await?;
            // Highest index first, so $1 does not eat the start of $10.
            for (i, value) in statement.params.iter().enumerate().rev() {
                let ty = types.get(i).map_or("text", String::as_str);
                let literal = match value {
                    None => format!("NULL::{ty}"),
                    Some(v) if Some(v.as_str()) == replaced => {
                        format!("(md5(:r1::text || '-' || :r2::text)::uuid)::{ty}")
                    }
                    // A conditional write names the feed head it read; of
                    // the fresh task, that is its own (one index lookup).
                    Some(_) if replaced.is_some() && compares_last_event(&statement.sql, i + 1) => {
                        "(SELECT last_event_id FROM tasks WHERE id = (md5(:r1::text || '-' || :r2::text)::uuid))"
                            .to_owned()
                    }
                    Some(v) => format!("'{}'::{ty}", v.replace('\'', "''")),
                };
                sql = sql.replace(&format!("${}", i + 1), &literal);
            }
        }
        script.push_str(&sql);
        script.push_str(";\n");
    }
    conn.close().await?;
    Ok(script)
}

// ---- wrk -------------------------------------------------------------------------------

fn lua_string(s: &str) -> String {
    format!("{s:?}")
}

/// Reports what the comparison reads, in one line.
const LUA_DONE: &str = r#"
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("MEATSPACE requests=%d duration_us=%d p50=%d p90=%d p99=%d max=%d errors=%d tasks=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.connect + e.read + e.write + e.status + e.timeout,
    completed_total()))
end
"#;

fn lua_poll(tasks: &[PolledTask]) -> String {
    let mut s = String::from("local requests = {}\n");
    for t in tasks {
        let _ = writeln!(
            s,
            "table.insert(requests, wrk.format('GET', {}, {{ ['Authorization'] = {} }}))",
            lua_string(&format!(
                "/api/v1/tasks/{}/events?after={}",
                t.id, t.last_event
            )),
            lua_string(&t.bearer)
        );
    }
    s.push_str(
        r#"
local i = 0
function init(args) i = math.random(#requests) end
function request()
  i = i % #requests + 1
  return requests[i]
end
function completed_total() return 0 end
"#,
    );
    s.push_str(LUA_DONE);
    s
}

/// The headers of a JSON request with the development key, as a Lua table.
fn lua_dev_headers(dev_key: &str) -> String {
    format!(
        "{{ [{}] = {}, ['Content-Type'] = 'application/json' }}",
        lua_string(DEV_KEY_HEADER),
        lua_string(dev_key)
    )
}

fn lua_create(dev_key: &str) -> String {
    let mut s = format!(
        "local req = wrk.format('POST', '/api/v1/tasks', {}, {})\n",
        lua_dev_headers(dev_key),
        lua_string(CREATE_BODY)
    );
    s.push_str("function request() return req end\nfunction completed_total() return 0 end\n");
    s.push_str(LUA_DONE);
    s
}

/// One connection per thread: the thread's script follows its task through
/// create, publish, claim, start and complete, reading ids and tokens from
/// the answers, and counts the tasks it completed.
fn lua_lifecycle(dev_key: &str) -> String {
    let mut s = format!(
        "local dev = {}\nlocal create_body = {}\n",
        lua_dev_headers(dev_key),
        lua_string(CREATE_BODY)
    );
    s.push_str(
        r#"
local threads = {}
function setup(thread) table.insert(threads, thread) end
step, completed = 0, 0
local worker, id, agent
function request()
  if step == 0 then
    return wrk.format('POST', '/api/v1/workers', dev, '{"name":"Bench Worker"}')
  elseif step == 1 then
    return wrk.format('POST', '/api/v1/tasks', dev, create_body)
  elseif step == 2 then
    return wrk.format('POST', '/api/v1/tasks/' .. id .. '/publish', { ['Authorization'] = agent })
  elseif step == 3 then
    return wrk.format('POST', '/api/v1/worker/tasks/' .. id .. '/claim', { ['Authorization'] = worker })
  elseif step == 4 then
    return wrk.format('POST', '/api/v1/worker/tasks/' .. id .. '/start', { ['Authorization'] = worker })
  else
    return wrk.format('POST', '/api/v1/worker/tasks/' .. id .. '/complete', { ['Authorization'] = worker })
  end
end
function response(status, headers, body)
  if status >= 300 then
    -- Counted by wrk as an error; start over with a new task.
    if step > 0 then step = 1 end
    return
  end
  if step == 0 then
    worker = 'Bearer ' .. body:match('"worker_token":"([^"]+)"')
    step = 1
  elseif step == 1 then
    id = body:match('"id":"([^"]+)"')
    agent = 'Bearer ' .. body:match('"agent_token":"([^"]+)"')
    step = 2
  elseif step == 5 then
    completed = completed + 1
    step = 1
  else
    step = step + 1
  end
end
function completed_total()
  local n = 0
  for _, t in ipairs(threads) do n = n + (t:get("completed") or 0) end
  return n
end
"#,
    );
    s.push_str(LUA_DONE);
    s
}

/// What wrk drives: its URL, and the processes whose CPU is the server's.
struct Target<'a> {
    base_url: &'a str,
    pids: Vec<u32>,
}

impl<'a> Target<'a> {
    fn server(server: &'a Server) -> Target<'a> {
        Target {
            base_url: &server.base_url,
            pids: vec![server.pid],
        }
    }

    fn reference(reference: &'a limits::Reference) -> Target<'a> {
        Target {
            base_url: &reference.base_url,
            pids: reference.tree_pids(),
        }
    }
}

/// A load generator (wrk, pgbench) as a child process whose output is read.
fn generator_command(program: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A load generator's stdout; an error with all it printed when it failed.
fn stdout_of(what: &str, output: &std::process::Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(stdout.into_owned())
}

/// A load generator's own CPU ticks, read until just before it exits (its
/// `/proc` entry is gone after).
fn watch_ticks(pid: u32) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let pid = pid.to_string();
        let mut last = 0;
        loop {
            let t = process_ticks(&pid);
            if t == 0 && last > 0 {
                break;
            }
            last = last.max(t);
            // The interval of the CPU reading, a poll that ends with the process.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
        }
        last
    })
}

fn ticks_of(pids: &[u32]) -> u64 {
    pids.iter().map(|p| process_ticks(&p.to_string())).sum()
}

/// What the wrk runs of a comparison share: the settings, wrk itself and a
/// directory for the scripts.
struct Wrk<'a> {
    settings: &'a Settings,
    program: &'a Path,
    work: &'a Path,
}

impl Wrk<'_> {
    /// Warms up, then runs `script` against `target` for the scenario's
    /// duration and prints the row it reads from wrk's output.
    async fn run(
        &self,
        target: &Target<'_>,
        name: &str,
        script: &str,
        thread_per_connection: bool,
    ) -> Result<Figures> {
        let settings = self.settings;
        let path = self.work.join(format!("{}.lua", name.replace(' ', "_")));
        std::fs::write(&path, script)?;
        let clients = settings.clients;
        let threads = if thread_per_connection {
            clients
        } else {
            clients.min(std::thread::available_parallelism().map_or(2, |n| n.get()))
        };
        let wrk_run = |duration: Duration| {
            let mut cmd = generator_command(self.program);
            cmd.arg("-t")
                .arg(threads.to_string())
                .arg("-c")
                .arg(clients.to_string())
                .arg("-d")
                .arg(format!("{}s", duration.as_secs().max(1)))
                .arg("--timeout")
                .arg("10s")
                .arg("-s")
                .arg(&path)
                .arg(target.base_url);
            cmd
        };
        if !settings.warmup.is_zero() {
            wrk_run(settings.warmup).output().await?;
        }
        let ticks = clock_ticks_per_second();
        let before = CpuSnapshot::take(target.pids[0]);
        let before_server = ticks_of(&target.pids);
        let child = wrk_run(settings.duration).spawn()?;
        let wrk_ticks = watch_ticks(child.id().context("wrk has no pid")?);
        let output = child.wait_with_output().await?;
        let after = CpuSnapshot::take(target.pids[0]);
        let server_ticks = ticks_of(&target.pids).saturating_sub(before_server);
        let wrk_ticks = wrk_ticks.await.unwrap_or(0);
        let stdout = stdout_of("wrk", &output)?;
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("MEATSPACE "))
            .with_context(|| format!("no result line from wrk: {stdout}"))?;
        let field = |key: &str| -> f64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        let seconds = field("duration_us") / 1e6;
        let mut cpu = after.since(before, ticks);
        // `this` in the snapshot is the benchmark program, idle meanwhile; the
        // generator is wrk; the server may be several processes (nginx).
        let span = after.at.duration_since(before.at).as_secs_f64();
        let wrk_cores = wrk_ticks as f64 / ticks / span;
        let server_cores = server_ticks as f64 / ticks / span;
        cpu.rest = (cpu.rest + cpu.load_generator + cpu.server - wrk_cores - server_cores).max(0.0);
        cpu.load_generator = wrk_cores;
        cpu.server = server_cores;
        let (rate, unit) = if name == "lifecycle" {
            (field("tasks") / seconds, "tasks/s")
        } else {
            (field("requests") / seconds, "req/s")
        };
        let row = Figures {
            name: name.to_owned(),
            rate,
            unit,
            p50_ms: field("p50") / 1000.0,
            p90_ms: field("p90") / 1000.0,
            p99_ms: field("p99") / 1000.0,
            max_ms: field("max") / 1000.0,
            errors: field("errors") as u64,
            cpu,
        };
        print_row(&row);
        Ok(row)
    }
}

// ---- pgbench ------------------------------------------------------------------------------

/// Runs the script with pgbench (prepared statements, one connection per
/// client, two threads), reading latencies from its per-transaction log.
async fn run_pgbench(
    settings: &Settings,
    pgbench: &Path,
    database_url: &str,
    work: &Path,
    name: &str,
    script: &str,
) -> Result<Figures> {
    let slug: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let dir = work.join(slug);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("script.sql");
    std::fs::write(&path, script)?;
    let threads = settings
        .clients
        .min(std::thread::available_parallelism().map_or(2, |n| n.get()));
    let run = |duration: Duration, log: bool| {
        let mut cmd = generator_command(pgbench);
        cmd.current_dir(&dir)
            .arg("-n")
            .arg("-M")
            .arg("prepared")
            .arg("-c")
            .arg(settings.clients.to_string())
            .arg("-j")
            .arg(threads.to_string())
            .arg("-T")
            .arg(duration.as_secs().max(1).to_string())
            .arg("-f")
            .arg(&path);
        if log {
            cmd.arg("-l");
        }
        cmd.arg(database_url);
        cmd
    };
    if !settings.warmup.is_zero() {
        run(settings.warmup, false).output().await?;
    }
    let ticks = clock_ticks_per_second();
    let before_busy = machine_busy_ticks();
    let started = Instant::now();
    let child = run(settings.duration, true).spawn()?;
    let pg_ticks = watch_ticks(child.id().context("pgbench has no pid")?);
    let output = child.wait_with_output().await?;
    let elapsed = started.elapsed().as_secs_f64();
    let busy = machine_busy_ticks().saturating_sub(before_busy) as f64 / ticks / elapsed;
    let gen_cores = pg_ticks.await.unwrap_or(0) as f64 / ticks / elapsed;
    let stdout = stdout_of("pgbench", &output)?;
    let tps: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no tps in pgbench's output: {stdout}"))?;
    let failed: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Per-transaction log lines: client tx latency_us script epoch us.
    let mut latencies: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("pgbench_log")
        {
            let text = std::fs::read_to_string(entry.path())?;
            latencies.extend(
                text.lines()
                    .filter_map(|l| l.split_whitespace().nth(2))
                    .filter_map(|v| v.parse::<u64>().ok()),
            );
            std::fs::remove_file(entry.path())?;
        }
    }
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * latencies.len() as f64).ceil() as usize;
        latencies[rank.clamp(1, latencies.len()) - 1] as f64 / 1000.0
    };
    let row = Figures {
        name: name.to_owned(),
        rate: tps,
        unit: "tx/s",
        p50_ms: pct(50.0),
        p90_ms: pct(90.0),
        p99_ms: pct(99.0),
        max_ms: latencies.last().map_or(0.0, |&v| v as f64 / 1000.0),
        errors: failed,
        cpu: super::CpuUse {
            server: 0.0,
            load_generator: gen_cores,
            rest: (busy - gen_cores).max(0.0),
        },
    };
    print_row(&row);
    Ok(row)
}
