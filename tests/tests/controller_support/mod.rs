//! Shared by the controller suites (`controller_*.rs`): building tasks in
//! every state through the real store, running the controller in-process
//! (the library, as the API server does) or as the real
//! `meatspace-controller` binary, and checking the store's invariants
//! afterwards.
#![allow(dead_code)] // each suite uses a different part

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use meatspace_controller::ControllerConfig;
use meatspace_controller::kubernetes::MirrorSettings;
use meatspace_domain::{Command, Event, EventType, IssueStatus, Task, TaskState, clock};
use meatspace_store::NewTask;
use meatspace_store::token::TokenHash;
use meatspace_store::{Store, StoreError};
use meatspace_tests::process::Binary;
use tokio::sync::oneshot;
use uuid::Uuid;

/// Runs an async test body against PostgreSQL and against SQLite, as
/// `postgres::name` and `sqlite::name` (the suite's one scheme,
/// [`meatspace_tests::api_tests`]) on two worker threads.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        meatspace_tests::api_tests!(threads = 2; $($name),*);
    };
}

/// A draft task whose lifetime ends at `expires_at`.
pub async fn draft_until(store: &Arc<dyn Store>, expires_at: DateTime<Utc>) -> Task {
    draft_of(
        store,
        "Check whether the bakery on Elm Street is open",
        expires_at,
    )
    .await
}

/// A draft task described as `description`, living a day from now, as the
/// API would create it.
pub async fn draft_named(store: &Arc<dyn Store>, description: &str) -> Task {
    draft_of(store, description, clock::now() + TimeDelta::days(1)).await
}

async fn draft_of(store: &Arc<dyn Store>, description: &str, expires_at: DateTime<Utc>) -> Task {
    store
        .create_task(NewTask::development(
            Uuid::new_v4(),
            description.to_owned(),
            TokenHash::of(&Uuid::new_v4().to_string()),
            clock::now(),
            clock::truncate(expires_at),
        ))
        .await
        .expect("create task")
}

/// A draft task living `lifetime` from now.
pub async fn draft(store: &Arc<dyn Store>, lifetime: TimeDelta) -> Task {
    draft_until(store, clock::now() + lifetime).await
}

/// A published (open) task living `lifetime` from now.
pub async fn open(store: &Arc<dyn Store>, lifetime: TimeDelta) -> Task {
    let t = draft(store, lifetime).await;
    apply(store, t.id, Command::Publish).await
}

/// A registered worker.
pub async fn worker(store: &Arc<dyn Store>) -> Uuid {
    let id = Uuid::new_v4();
    store
        .create_worker(id, "Ada", TokenHash::of(&id.to_string()), clock::now())
        .await
        .expect("create worker");
    id
}

/// An open task living `lifetime`, claimed and started by `worker`.
pub async fn active(store: &Arc<dyn Store>, lifetime: TimeDelta, worker: Uuid) -> Task {
    let t = open(store, lifetime).await;
    apply(store, t.id, Command::Claim { worker }).await;
    apply(
        store,
        t.id,
        Command::Start {
            worker,
            position: None,
        },
    )
    .await
}

/// Applies a command now and expects it to succeed.
pub async fn apply(store: &Arc<dyn Store>, id: Uuid, command: Command) -> Task {
    let name = command.name();
    store
        .apply(id, command, clock::now())
        .await
        .unwrap_or_else(|e| panic!("{name} task {id}: {e}"))
        .task
}

/// Creates `n` draft tasks expiring at `expires_at`, 16 at a time.
pub async fn drafts_until(
    store: &Arc<dyn Store>,
    n: usize,
    expires_at: DateTime<Utc>,
) -> Vec<Uuid> {
    futures::stream::iter(0..n)
        .map(|_| {
            let store = store.clone();
            async move { draft_until(&store, expires_at).await.id }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

/// All events of a task.
pub async fn events(store: &Arc<dyn Store>, id: Uuid) -> Vec<Event> {
    store.events(id, 0, 10_000).await.expect("read events")
}

/// The task, which must exist.
pub async fn task(store: &Arc<dyn Store>, id: Uuid) -> Task {
    store
        .task(id)
        .await
        .expect("read task")
        .expect("task exists")
}

/// Moves a task's end (and creation) `days` into the past, straight in the
/// database at `url`, as if that much time had gone by.
pub async fn age(url: &str, id: Uuid, days: i64) {
    use sqlx::Connection;
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::query(
            "UPDATE tasks SET ended_at = ended_at - make_interval(days => $2), \
             created_at = created_at - make_interval(days => $2) WHERE id = $1",
        )
        .bind(id)
        .bind(days as i32)
        .execute(&mut c)
        .await
        .expect("age the task");
    } else {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::query(
            "UPDATE tasks SET ended_at = ended_at - ?2, created_at = created_at - ?2 WHERE id = ?1",
        )
        .bind(id.to_string())
        .bind(days * 86_400_000)
        .execute(&mut c)
        .await
        .expect("age the task");
    }
}

/// The terminal event type that goes with a terminal state.
pub fn terminal_event_of(state: TaskState) -> Option<EventType> {
    match state {
        TaskState::Completed => Some(EventType::TaskCompleted),
        TaskState::Stopped => Some(EventType::TaskStopped),
        TaskState::Cancelled => Some(EventType::TaskCancelled),
        TaskState::Expired => Some(EventType::TaskExpired),
        _ => None,
    }
}

/// Checks every invariant the controller must keep for one task and returns
/// it with its events:
/// - a terminal task has exactly one terminal event, of its state's type,
///   and it is the task's last event; a live task has none;
/// - `last_event_id` is the id of the newest event, ids ascend;
/// - `ended_at` is set exactly when the task is terminal;
/// - a terminal task has no open issue, and every closed issue records a
///   resolution and a time.
pub async fn check_consistent(store: &Arc<dyn Store>, id: Uuid) -> (Task, Vec<Event>) {
    let t = task(store, id).await;
    let evs = events(store, id).await;
    let ctx = format!(
        "task {id} ({}), events {:?}",
        t.state,
        evs.iter().map(|e| e.kind).collect::<Vec<_>>()
    );
    assert!(
        evs.windows(2).all(|w| w[0].id < w[1].id),
        "{ctx}: ids must ascend"
    );
    assert_eq!(
        t.last_event_id,
        evs.last().map_or(0, |e| e.id),
        "{ctx}: last_event_id"
    );
    let terminal: Vec<&Event> = evs.iter().filter(|e| e.kind.is_terminal()).collect();
    assert_eq!(
        t.ended_at.is_some(),
        t.state.is_terminal(),
        "{ctx}: ended_at"
    );
    match terminal_event_of(t.state) {
        Some(kind) => {
            assert_eq!(terminal.len(), 1, "{ctx}: exactly one terminal event");
            assert_eq!(
                terminal[0].kind, kind,
                "{ctx}: terminal event matches the state"
            );
            assert_eq!(
                evs.last().map(|e| e.id),
                Some(terminal[0].id),
                "{ctx}: nothing after the terminal event"
            );
            assert_eq!(t.open_issues, 0, "{ctx}: open issue count");
        }
        None => assert!(
            terminal.is_empty(),
            "{ctx}: a live task has no terminal event"
        ),
    }
    for issue in store.issues(id).await.expect("read issues") {
        if t.state.is_terminal() {
            assert_ne!(
                issue.status,
                IssueStatus::Open,
                "{ctx}: issue {} still open",
                issue.event_id
            );
        }
        if issue.status != IssueStatus::Open {
            assert!(
                issue.resolution.is_some() && issue.resolved_at.is_some(),
                "{ctx}: issue {issue:?} records no resolution"
            );
        }
    }
    (t, evs)
}

/// The controller library running in this process, as the API server runs
/// it for SQLite.
#[derive(Debug)]
pub struct InProcess {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), meatspace_controller::Error>>,
}

impl InProcess {
    pub fn start(store: &Arc<dyn Store>, config: ControllerConfig) -> InProcess {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(meatspace_controller::run(
            store.clone(),
            config,
            async move {
                let _ = stopped.await;
            },
        ));
        InProcess { stop, task }
    }

    /// Shuts the controller down and checks it stops cleanly within 10 s.
    pub async fn stop(self) {
        self.stop_within(Duration::from_secs(10)).await;
    }

    /// Shuts the controller down and checks it stops cleanly within `limit`.
    pub async fn stop_within(self, limit: Duration) {
        let _ = self.stop.send(());
        let ended = tokio::time::timeout(limit, self.task)
            .await
            .unwrap_or_else(|_| panic!("the controller stops within {limit:?} of shutdown"));
        ended
            .expect("controller task")
            .expect("controller run returns Ok");
    }

    /// Ends it the way a killed process ends: no clean-up, the Lease is
    /// not released.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The default controller, mirroring into Kubernetes with `mirror`.
pub fn with_mirror(mirror: MirrorSettings) -> ControllerConfig {
    ControllerConfig {
        mirror: Some(mirror),
        ..ControllerConfig::default()
    }
}

/// A controller tuned for tests: it sleeps up to a minute between deadline
/// reads, so anything faster than that proves it woke on a change.
pub fn config() -> ControllerConfig {
    ControllerConfig {
        max_sleep: Duration::from_secs(60),
        ..ControllerConfig::default()
    }
}

/// Milliseconds from `deadline` to `t` (negative if early).
pub fn ms_after(t: DateTime<Utc>, deadline: DateTime<Utc>) -> i64 {
    (t - deadline).num_milliseconds()
}

/// Median and largest of some lags in milliseconds.
pub fn median_and_max(lags: &[i64]) -> (i64, i64) {
    let mut v = lags.to_vec();
    v.sort_unstable();
    (v[v.len() / 2], *v.last().expect("some lags"))
}

/// Whether a store error is the refusal a losing racer must get.
pub fn is_clean_loss(e: &StoreError) -> bool {
    use meatspace_domain::Refusal;
    matches!(
        e,
        StoreError::Refused(
            Refusal::Terminal { .. } | Refusal::DeadlinePassed | Refusal::WrongState { .. }
        )
    )
}

// ---- the real binary -------------------------------------------------------

pub use meatspace_tests::process::ServerProcess as Process;

/// Path of the `meatspace-controller` binary: `MEATSPACE_CONTROLLER_BIN`, or
/// the one cargo built next to this test binary.
pub fn controller_bin() -> PathBuf {
    Binary::Controller.path()
}

/// The server key the controller processes of these tests sign with.
pub const TEST_SECRET_KEY: &str = "controller-test-server-key-of-at-least-32-characters";

/// Starts a `meatspace-controller` process against `database_url` with
/// extra environment. Killed if the test ends without stopping it.
pub fn controller_process(database_url: &str, env: &[(&str, &str)]) -> Process {
    let mut all = vec![
        ("DATABASE_URL", database_url),
        ("RUST_LOG", "info,meatspace_controller=debug"),
        // The controller refuses to start without the webhook key.
        ("MEATSPACE_SECRET_KEY", TEST_SECRET_KEY),
    ];
    all.extend_from_slice(env);
    Process::start(Binary::Controller, &all)
}
