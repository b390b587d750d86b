//! The store contract: one suite of behaviours that every [`Store`] backend
//! must show, run against a real PostgreSQL server and a real SQLite file.
//!
//! Each case is a plain async function taking the store under test; the
//! `conformance!` macro instantiates every case once per backend, as
//! `postgres::<case>` and `sqlite::<case>`, each on a fresh, empty database.
//! Cases that need the database itself (its URL or its files) take the
//! [`TestDb`] instead.
//!
//! Time never passes by sleeping: every command carries the `now` it happens
//! at, counted in seconds from a fixed instant years ahead ([`at`]). A
//! deadline is reached by acting at a later `now`, and a store that read the
//! wall clock instead of the `now` it is given would be caught.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use futures::future::BoxFuture;
use meatspace_domain::{
    Actor, Command, Due, Event, EventType, ExpiryReason, Extension, IssueAction, IssueKind,
    IssueStatus, MAX_DESCRIPTION_CHARS, NewPhoto, Policy, Refusal, Task, TaskState, Verdict,
};
use meatspace_store::token::{self, TokenHash};
use meatspace_store::{Applied, BackendKind, ConnectOptions, NewTask, OpenTasksCursor};
use meatspace_store::{Change, Store, StoreError};
use meatspace_store_connect::connect;
use meatspace_tests::TestDb;
use serde_json::{Value, json};
use uuid::Uuid;

// ---- time and policy ----------------------------------------------------------

/// Lifetime of every task created here, in seconds.
const LIFETIME: i64 = 3600;
/// Seconds an assigned worker has to start.
const START_TIMEOUT: i64 = 60;
/// Seconds a task may stay active.
const ACTIVE_LIMIT: i64 = 600;

/// The instant `secs` seconds after the tests' epoch (2033-05-18).
fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(2_000_000_000 + secs, 0).expect("valid timestamp")
}

/// The audit entry of an invite made by the development principal at `at`.
fn invite_audit(id: Uuid, at: DateTime<Utc>) -> meatspace_store::NewAudit {
    meatspace_store::NewAudit {
        at,
        principal_id: meatspace_domain::identity::DEVELOPMENT_PRINCIPAL,
        action: meatspace_domain::identity::AuditAction::InviteCreated,
        target: format!("invite:{id}"),
        address: None,
        detail: None,
    }
}

/// Creates the invite `id` with `code`, at `created` seconds, expiring at
/// `expires`.
async fn new_invite(s: &dyn Store, id: Uuid, code: &str, created: i64, expires: i64) {
    s.create_invite(
        id,
        TokenHash::of(code),
        at(expires),
        invite_audit(id, at(created)),
    )
    .await
    .expect("create invite");
}

fn policy() -> Policy {
    Policy {
        default_lifetime: TimeDelta::seconds(LIFETIME),
        min_lifetime: TimeDelta::seconds(1),
        max_lifetime: TimeDelta::days(30),
        start_timeout: TimeDelta::seconds(START_TIMEOUT),
        active_time_limit: TimeDelta::seconds(ACTIVE_LIMIT),
        ..Policy::default()
    }
}

// ---- instantiation ---------------------------------------------------------------

/// Instantiates every case for one backend.
macro_rules! backend_suite {
    ($module:ident, $db:expr, [$($case:ident),* $(,)?], [$($db_case:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let db = meatspace_tests::TestDb::new($db).await;
                    let store = super::open(&db).await;
                    super::$case(store).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $db_case() {
                    let db = meatspace_tests::TestDb::new($db).await;
                    super::$db_case(&db).await;
                }
            )*
        }
    };
}

/// The store a case runs on. A connection is waited for as long as a test
/// may take: the cases that run many writers at once on a busy machine
/// test what gets written, not how soon a connection frees up (running out
/// of connections answers 503 within the production default's second,
/// which `api_ops` tests).
async fn open(db: &TestDb) -> Arc<dyn Store> {
    let options = ConnectOptions {
        acquire_timeout: std::time::Duration::from_secs(30),
        ..ConnectOptions::default()
    };
    connect(&db.url, policy(), &options)
        .await
        .expect("open the store")
}

/// Instantiates every case for both backends: `stores` cases take an
/// `Arc<dyn Store>`, `databases` cases take a `&TestDb`.
macro_rules! conformance {
    (stores: [$($case:ident),* $(,)?], databases: [$($db_case:ident),* $(,)?] $(,)?) => {
        backend_suite!(postgres, meatspace_tests::Db::Postgres, [$($case),*], [$($db_case),*]);
        backend_suite!(sqlite, meatspace_tests::Db::Sqlite, [$($case),*], [$($db_case),*]);
    };
}

conformance! {
    stores: [
        created_task_reads_back_as_a_draft,
        text_round_trips_unchanged,
        agent_token_is_kept_as_a_verifiable_digest,
        worker_token_is_kept_as_a_verifiable_digest,
        lifecycle_to_completion,
        every_event_type_has_its_actor_trust_and_data,
        stop_ends_an_assigned_or_active_task,
        cancel_ends_any_non_terminal_task,
        reconcile_command_applies_only_what_is_due,
        an_extension_moves_the_deadline_the_controller_acts_on,
        idempotency_keys_are_claimed_once_and_replayed,
        webhook_endpoints_deliver_from_a_durable_cursor,
        refusals_name_the_reason_and_change_nothing,
        a_refused_command_leaves_the_task_to_the_controller,
        terminal_tasks_refuse_every_command,
        issues_open_resolve_and_close_when_the_task_ends,
        answering_an_issue_with_cancel_ends_the_task,
        a_lapsed_assignment_closes_its_issues,
        responses_are_scoped_to_the_issue_s_task,
        photo_is_stored_and_scoped_to_its_task,
        events_page_by_after_and_limit,
        a_feed_read_is_the_token_state_and_page_together,
        every_write_bumps_the_task_s_version,
        open_tasks_page_by_cursor,
        next_deadline_is_the_earliest_pending_one,
        reconcile_due_applies_due_deadlines_in_order,
        reconcile_due_clears_a_backlog_in_one_pass,
        tasks_after_pages_every_task_by_id,
        purge_removes_ended_tasks_with_their_data_only,
        changes_name_each_changed_task_in_order,
        concurrent_creates_each_land_and_are_announced,
        a_failing_create_among_concurrent_ones_fails_alone,
        racing_claims_have_exactly_one_winner,
        racing_claims_on_many_tasks_have_one_winner_each,
        racing_endings_leave_one_terminal_state_and_event,
        pollers_see_every_event_of_concurrent_appenders,
        pollers_see_every_event_of_many_appenders_to_one_task,
        invites_work_once_and_expire,
        racing_invite_redemptions_have_one_winner,
        sessions_read_back_until_they_expire_or_end,
        unusable_sign_ins_are_purged_and_usable_ones_kept,
        events_are_counted_up_to_a_bound,
        worker_tasks_and_newest_open_tasks,
        notification_causes_are_recorded_with_their_events_and_fanned_out_once,
        console_sessions_and_overview_counts,
    ],
    databases: [
        replicas_starting_together_migrate_once,
        stored_data_reveals_no_token,
        commands_act_on_changes_made_through_another_store,
        an_audited_action_commits_with_its_audit_row_or_not_at_all,
        suspending_a_worker_releases_its_tasks_in_the_same_transaction,
    ],
}

// ---- commands, short ---------------------------------------------------------------

fn claim(worker: Uuid) -> Command {
    Command::Claim { worker }
}

fn start(worker: Uuid) -> Command {
    Command::Start {
        worker,
        position: None,
    }
}

fn message(worker: Uuid, text: &str) -> Command {
    let text = text.to_owned();
    Command::Message { worker, text }
}

fn send_photo(worker: Uuid, photo: &NewPhoto) -> Command {
    let photo = photo.clone();
    Command::Photo {
        worker,
        photo,
        position: None,
    }
}

fn raise(worker: Uuid, kind: IssueKind, text: &str) -> Command {
    let text = text.to_owned();
    Command::RaiseIssue { worker, kind, text }
}

fn respond(issue_event_id: i64, action: IssueAction, text: Option<&str>) -> Command {
    let text = text.map(str::to_owned);
    Command::RespondToIssue {
        issue_event_id,
        action,
        text,
    }
}

fn complete(worker: Uuid, note: Option<&str>) -> Command {
    let note = note.map(str::to_owned);
    Command::Complete {
        worker,
        note,
        result: None,
    }
}

fn stop(worker: Uuid, reason: Option<&str>) -> Command {
    let reason = reason.map(str::to_owned);
    Command::Stop { worker, reason }
}

fn cancel() -> Command {
    Command::Cancel { reason: None }
}

fn wrong(action: &'static str, state: TaskState) -> Refusal {
    Refusal::WrongState { action, state }
}

/// A photo whose bytes hold every byte value, NUL included, so no text
/// conversion on the way through the store can go unnoticed.
fn photo(len: usize) -> NewPhoto {
    NewPhoto {
        id: Uuid::new_v4(),
        content_type: "image/png".into(),
        width: 640,
        height: 480,
        bytes: (0..=255u8).cycle().take(len).collect(),
    }
}

// ---- helpers -------------------------------------------------------------------------

/// A freshly created task and the agent token it was created with.
struct Created {
    task: Task,
    token: String,
}

/// Creates a draft at `secs` that expires `LIFETIME` seconds later.
async fn create_at(store: &dyn Store, secs: i64, description: &str) -> Created {
    let token = token::generate("mst_");
    let new = NewTask::development(
        Uuid::new_v4(),
        description.to_owned(),
        TokenHash::of(&token),
        at(secs),
        at(secs + LIFETIME),
    );
    let task = store.create_task(new).await.expect("create task");
    Created { task, token }
}

async fn create(store: &dyn Store) -> Task {
    create_at(store, 0, "water the plants").await.task
}

async fn worker(store: &dyn Store) -> Uuid {
    worker_with_token(store).await.0
}

async fn worker_with_token(store: &dyn Store) -> (Uuid, String) {
    let id = Uuid::new_v4();
    let secret = token::generate("msw_");
    let hash = TokenHash::of(&secret);
    store
        .create_worker(id, "Ada", hash, at(0))
        .await
        .expect("create worker");
    (id, secret)
}

async fn read(store: &dyn Store, id: Uuid) -> Option<Task> {
    store.task(id).await.expect("read task")
}

async fn all_events(store: &dyn Store, task: Uuid) -> Vec<Event> {
    store.events(task, 0, 100_000).await.expect("read events")
}

/// Applies `command` at `secs`, which must succeed.
async fn ok(store: &dyn Store, task: Uuid, command: Command, secs: i64) -> Applied {
    let name = command.name();
    let result = store.apply(task, command, at(secs)).await;
    result.unwrap_or_else(|e| panic!("{name} at {secs}s: {e}"))
}

/// Everything a client could read about a task.
async fn snapshot(store: &dyn Store, task: Uuid) -> (Option<Task>, Vec<Event>, usize) {
    let issues = store.issues(task).await.expect("read issues");
    (
        read(store, task).await,
        all_events(store, task).await,
        issues.len(),
    )
}

/// Applies `command` at `secs`, expects exactly the refusal `expected`, and
/// checks that the refusal left no trace.
async fn refused(store: &dyn Store, task: Uuid, command: Command, secs: i64, expected: Refusal) {
    let name = command.name();
    let before = snapshot(store, task).await;
    match store.apply(task, command, at(secs)).await {
        Err(StoreError::Refused(r)) => assert_eq!(r, expected, "refusal to {name}"),
        Err(e) => panic!("{name}: want refusal {expected:?}, got error {e}"),
        Ok(a) => panic!(
            "{name}: want refusal {expected:?}, it applied {:?}",
            a.events
        ),
    }
    let after = snapshot(store, task).await;
    assert_eq!(after, before, "a refused {name} changed the task");
}

fn kinds(events: &[Event]) -> Vec<EventType> {
    events.iter().map(|e| e.kind).collect()
}

fn timestamp(v: &Value) -> DateTime<Utc> {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{v} is no timestamp: {e}"))
}

/// A task driven to `state` (draft, open, assigned or active) the normal
/// way: created at 0, published at 1, claimed at 2 (start by 62), started
/// at 3 (active until 603). Returns it with its worker, a fresh one that is
/// registered whatever the state.
async fn task_in(store: &dyn Store, state: TaskState) -> (Task, Uuid) {
    let task = create(store).await;
    drive_to(store, task, state).await
}

/// An active task with a result schema and review (a 60 s delay).
async fn reviewed_and_active(store: &dyn Store) -> (Task, Uuid) {
    let new = NewTask {
        result_schema: Some(json!({ "type": "object",
            "properties": { "ok": { "type": "boolean" } }, "required": ["ok"] })),
        review: Some(meatspace_domain::Review::new(60)),
        ..NewTask::development(
            Uuid::new_v4(),
            "check the lock",
            TokenHash::of("r"),
            at(0),
            at(LIFETIME),
        )
    };
    let task = store.create_task(new).await.expect("create task");
    drive_to(store, task, TaskState::Active).await
}

/// Takes `task`, a draft, to `state` with a new worker.
async fn drive_to(store: &dyn Store, mut task: Task, state: TaskState) -> (Task, Uuid) {
    let w = worker(store).await;
    let steps = [
        (TaskState::Open, Command::Publish),
        (TaskState::Assigned, claim(w)),
        (TaskState::Active, start(w)),
    ];
    for (secs, (reached, command)) in (1..).zip(steps) {
        if task.state == state {
            break;
        }
        task = ok(store, task.id, command, secs).await.task;
        assert_eq!(task.state, reached);
    }
    assert_eq!(
        task.state, state,
        "task_in reaches draft, open, assigned or active"
    );
    (task, w)
}

/// The id of the event that a command returned first (an issue's id).
fn first_id(applied: &Applied) -> i64 {
    applied.events[0].id
}

// ---- tasks and credentials -------------------------------------------------------------

async fn created_task_reads_back_as_a_draft(store: Arc<dyn Store>) {
    let s = &*store;
    s.ping().await.expect("ping");
    assert_eq!(read(s, Uuid::new_v4()).await, None);

    let task = create_at(s, 7, "buy milk").await.task;
    assert_eq!(task.state, TaskState::Draft);
    assert_eq!(task.description, "buy milk");
    assert_eq!(task.created_at, at(7));
    assert_eq!(task.updated_at, at(7));
    assert_eq!(task.expires_at, at(7 + LIFETIME));
    assert_eq!(task.published_at, None);
    assert_eq!(task.assigned_at, None);
    assert_eq!(task.started_at, None);
    assert_eq!(task.ended_at, None);
    assert_eq!(task.worker_id, None);
    assert_eq!(task.start_by, None);
    assert_eq!(task.active_until, None);
    assert_eq!(task.open_issues, 0);
    assert_eq!(task.last_event_id, 0);
    assert_eq!(read(s, task.id).await.as_ref(), Some(&task));
    assert!(
        all_events(s, task.id).await.is_empty(),
        "a new draft has no events"
    );

    // Ids are the caller's: a second task with the same id is an error.
    let duplicate = NewTask::development(task.id, "other", TokenHash::of("x"), at(8), at(9));
    assert!(
        s.create_task(duplicate).await.is_err(),
        "a duplicate id was accepted"
    );
    assert_eq!(read(s, task.id).await, Some(task));

    // Timestamps keep their milliseconds (the precision of `clock::now`).
    let ms = TimeDelta::milliseconds(789);
    let new = NewTask::development(
        Uuid::new_v4(),
        "precise",
        TokenHash::of("z"),
        at(1) + ms,
        at(LIFETIME) + ms,
    );
    let precise = s.create_task(new).await.expect("create task");
    let published = ok(s, precise.id, Command::Publish, 2).await.task;
    assert_eq!(read(s, precise.id).await.as_ref(), Some(&published));
    assert_eq!(published.created_at, at(1) + ms);
    assert_eq!(published.expires_at, at(LIFETIME) + ms);
    let due = s.next_deadline().await.expect("next deadline");
    assert_eq!(due, Some(at(LIFETIME) + ms));
}

async fn text_round_trips_unchanged(store: Arc<dyn Store>) {
    let s = &*store;
    let texts = [
        "Water the 🌱 — “front” garden\nline two\ttab 'single' \"double\" \\ \\n".to_owned(),
        "é".repeat(MAX_DESCRIPTION_CHARS),
        "'; DROP TABLE tasks; --".to_owned(),
        "{\"looks\": [\"like\", \"json\"]}".to_owned(),
    ];
    for text in &texts {
        let task = create_at(s, 0, text).await.task;
        assert_eq!(&read(s, task.id).await.expect("stored").description, text);
    }
    let (task, w) = task_in(s, TaskState::Active).await;
    for text in &texts {
        let applied = ok(s, task.id, message(w, text), 10).await;
        assert_eq!(applied.events[0].data, json!({ "text": text }));
    }
    let stored: Vec<Value> = all_events(s, task.id)
        .await
        .into_iter()
        .filter(|e| e.kind == EventType::WorkerMessage)
        .map(|e| e.data["text"].clone())
        .collect();
    let sent: Vec<Value> = texts.iter().map(|t| json!(t)).collect();
    assert_eq!(stored, sent);
}

async fn agent_token_is_kept_as_a_verifiable_digest(store: Arc<dyn Store>) {
    let s = &*store;
    let a = create_at(s, 0, "a").await;
    let b = create_at(s, 0, "b").await;
    let digest = |id| async move { s.agent_token_hash(id).await.expect("read digest") };

    let of_a = digest(a.task.id).await.expect("a's digest is stored");
    assert!(
        of_a.verify(&a.token),
        "the digest does not verify its own token"
    );
    assert!(!of_a.verify(&b.token), "a's digest accepts b's token");
    assert!(!of_a.verify(&format!("{}x", a.token)));
    assert!(!of_a.verify(""));
    assert_eq!(of_a, TokenHash::of(&a.token));
    let of_b = digest(b.task.id).await.expect("b's digest is stored");
    assert!(of_b.verify(&b.token) && !of_b.verify(&a.token));
    assert_eq!(digest(Uuid::new_v4()).await, None);
}

async fn worker_token_is_kept_as_a_verifiable_digest(store: Arc<dyn Store>) {
    let s = &*store;
    let (ada, ada_secret) = worker_with_token(s).await;
    let (bob, bob_secret) = worker_with_token(s).await;
    let digest = |id| async move { s.worker_token_hash(id).await.expect("read digest") };

    let of_ada = digest(ada).await.expect("digest stored");
    assert!(of_ada.verify(&ada_secret));
    assert!(!of_ada.verify(&bob_secret));
    let of_bob = digest(bob).await.expect("digest stored");
    assert!(of_bob.verify(&bob_secret) && !of_bob.verify(&ada_secret));
    assert_eq!(digest(Uuid::new_v4()).await, None);

    let again = s.create_worker(ada, "Eve", TokenHash::of("y"), at(1)).await;
    assert!(again.is_err(), "a duplicate worker id was accepted");
    assert!(digest(ada).await.expect("kept").verify(&ada_secret));
}

async fn replicas_starting_together_migrate_once(db: &TestDb) {
    let opts = ConnectOptions::default();
    let starts = (0..4).map(|_| connect(&db.url, policy(), &opts));
    let stores: Vec<Arc<dyn Store>> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("a replica failed to start: {e}")))
        .collect();
    let task = create(&*stores[0]).await;
    ok(&*stores[1], task.id, Command::Publish, 1).await;
    for s in &stores {
        let seen = read(&**s, task.id).await.expect("visible to every replica");
        assert_eq!(seen.state, TaskState::Open);
    }
    // A later start finds the schema in place and the data kept.
    let late = connect(&db.url, policy(), &opts).await.expect("restart");
    assert_eq!(
        read(&*late, task.id).await.expect("kept").state,
        TaskState::Open
    );
}

/// Neither an agent nor a worker token appears anywhere in what the database
/// keeps (PostgreSQL: a `pg_dump` of it; SQLite: the bytes of its files),
/// although the data around them does.
async fn stored_data_reveals_no_token(db: &TestDb) {
    let store = db.store(policy()).await;
    let s = &*store;
    let a = create_at(s, 0, "marker-description-a").await;
    let b = create_at(s, 0, "marker-description-b").await;
    let (w, worker_secret) = worker_with_token(s).await;
    ok(s, a.task.id, Command::Publish, 1).await;
    ok(s, a.task.id, claim(w), 2).await;
    ok(s, a.task.id, start(w), 3).await;
    ok(s, a.task.id, message(w, "marker-message"), 4).await;
    // b ends and is purged: its tombstone keeps only the digest.
    ok(s, b.task.id, cancel(), 5).await;
    assert_eq!(
        s.purge_ended_before(at(6), at(6), 10).await.expect("purge"),
        1
    );

    // An invite redeemed into a worker with a session: their secrets too
    // are kept only as digests.
    let invite_code = token::generate("msi_");
    let invite = Uuid::new_v4();
    new_invite(s, invite, &invite_code, 1, 100).await;
    let invited = Uuid::new_v4();
    s.redeem_invite(invite, invited, "marker-invited", TokenHash::of("x"), at(2))
        .await
        .expect("redeem")
        .expect("the invite works");
    let session_secret = token::generate("mss_");
    s.create_session(
        Uuid::new_v4(),
        invited,
        TokenHash::of(&session_secret),
        at(2),
        at(100),
    )
    .await
    .expect("create session");

    let backend = match s.backend() {
        BackendKind::Postgres => meatspace_tests::Db::Postgres,
        BackendKind::Sqlite => meatspace_tests::Db::Sqlite,
    };
    let stored = meatspace_tests::stored_bytes(backend, &db.url).await;
    // The data is there, so the absence of the tokens means something.
    for marker in ["marker-description-a", "marker-message", "marker-invited"] {
        assert!(
            contains(&stored, marker.as_bytes()),
            "{marker:?} is not in the data"
        );
    }
    for token in [&a.token, &b.token] {
        let digest = TokenHash::of(token).0;
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(
            contains(&stored, &digest) || contains(&stored, hex.as_bytes()),
            "an agent token's digest is not in the data"
        );
    }
    for secret in [
        &a.token,
        &b.token,
        &worker_secret,
        &invite_code,
        &session_secret,
    ] {
        // With and without the recognisable prefix.
        for needle in [secret.as_str(), &secret[4..]] {
            assert!(
                !contains(&stored, needle.as_bytes()),
                "a token is stored in clear"
            );
        }
    }
}

use meatspace_tests::contains;

// ---- the lifecycle ------------------------------------------------------------------------

async fn lifecycle_to_completion(store: Arc<dyn Store>) {
    let s = &*store;
    let w = worker(s).await;
    let id = create(s).await.id;

    // Each step returns the task as written, which is what a reader sees.
    let step = |applied: &Applied, state: TaskState, kind: EventType| {
        assert_eq!(applied.task.state, state);
        assert_eq!(kinds(&applied.events), [kind]);
        assert_eq!(applied.reconciled, None);
        assert_eq!(applied.task.last_event_id, applied.events[0].id);
    };

    let published = ok(s, id, Command::Publish, 10).await;
    step(&published, TaskState::Open, EventType::TaskPublished);
    assert_eq!(published.task.published_at, Some(at(10)));
    assert_eq!(published.task.updated_at, at(10));
    assert_eq!(read(s, id).await.as_ref(), Some(&published.task));

    let claimed = ok(s, id, claim(w), 20).await;
    step(&claimed, TaskState::Assigned, EventType::TaskAssigned);
    assert_eq!(claimed.task.worker_id, Some(w));
    assert_eq!(claimed.task.assigned_at, Some(at(20)));
    assert_eq!(claimed.task.start_by, Some(at(20 + START_TIMEOUT)));
    assert_eq!(read(s, id).await.as_ref(), Some(&claimed.task));

    let started = ok(s, id, start(w), 30).await;
    step(&started, TaskState::Active, EventType::TaskStarted);
    assert_eq!(started.task.started_at, Some(at(30)));
    assert_eq!(started.task.active_until, Some(at(30 + ACTIVE_LIMIT)));
    assert_eq!(read(s, id).await.as_ref(), Some(&started.task));

    let said = ok(s, id, message(w, "on my way"), 40).await;
    step(&said, TaskState::Active, EventType::WorkerMessage);
    let shown = ok(s, id, send_photo(w, &photo(100)), 41).await;
    step(&shown, TaskState::Active, EventType::WorkerPhoto);
    let raised = ok(s, id, raise(w, IssueKind::AccessBlocked, "gate"), 42).await;
    step(&raised, TaskState::Active, EventType::WorkerIssue);
    assert_eq!(raised.task.open_issues, 1);
    let clarify = respond(first_id(&raised), IssueAction::Clarify, Some("side door"));
    let answered = ok(s, id, clarify, 43).await;
    step(&answered, TaskState::Active, EventType::AgentIssueResponse);
    assert_eq!(answered.task.open_issues, 0);

    let done = ok(s, id, complete(w, Some("watered")), 50).await;
    step(&done, TaskState::Completed, EventType::TaskCompleted);
    assert_eq!(done.task.ended_at, Some(at(50)));
    assert_eq!(
        done.task.worker_id,
        Some(w),
        "a finished task remembers its worker"
    );
    let stored = read(s, id).await.expect("kept");
    assert_eq!(stored, done.task);

    // The feed is every event appended, each as it was returned, in order.
    let feed = all_events(s, id).await;
    let returned: Vec<Event> = [
        published, claimed, started, said, shown, raised, answered, done,
    ]
    .into_iter()
    .flat_map(|a| a.events)
    .collect();
    assert_eq!(feed, returned);
    assert!(
        feed.windows(2).all(|p| p[0].id < p[1].id),
        "ids not ascending"
    );
    assert!(feed.iter().all(|e| e.task_id == id));
    let times: Vec<_> = feed.iter().map(|e| e.created_at).collect();
    assert_eq!(times, [10, 20, 30, 40, 41, 42, 43, 50].map(at));
    assert_eq!(stored.last_event_id, feed[7].id);
}

/// Every event type as read back from the feed: who caused it, whether its
/// data is worker-authored (untrusted), and the shape of its data.
async fn every_event_type_has_its_actor_trust_and_data(store: Arc<dyn Store>) {
    let s = &*store;
    let mut checked = BTreeSet::new();
    let mut check = |e: &Event, kind: EventType, actor: Actor, data: Value| {
        assert_eq!(e.kind, kind);
        assert_eq!(e.actor, actor, "actor of {kind:?}");
        assert_eq!(
            e.untrusted,
            kind.carries_worker_content(),
            "untrusted flag of {kind:?}"
        );
        assert_eq!(e.data, data, "data of {kind:?}");
        checked.insert(kind.as_str());
    };

    // published, assigned, started, message, photo, issue, response, completed
    let (t, w) = task_in(s, TaskState::Active).await;
    let t = t.id;
    ok(s, t, message(w, "hello"), 4).await;
    let p = photo(1234);
    ok(s, t, send_photo(w, &p), 5).await;
    let issue = first_id(&ok(s, t, raise(w, IssueKind::NeedsMoreTime, "slow"), 6).await);
    ok(
        s,
        t,
        respond(issue, IssueAction::Acknowledge, Some("fine")),
        7,
    )
    .await;
    ok(s, t, complete(w, Some("done")), 8).await;
    let e = all_events(s, t).await;
    assert_eq!(e.len(), 8);
    check(&e[0], EventType::TaskPublished, Actor::Agent, json!({}));
    let start_by = timestamp(&e[1].data["start_by"]);
    assert_eq!(start_by, at(2 + START_TIMEOUT));
    let assigned = json!({ "worker_id": w, "start_by": e[1].data["start_by"] });
    check(&e[1], EventType::TaskAssigned, Actor::Worker, assigned);
    let active_until = timestamp(&e[2].data["active_until"]);
    assert_eq!(active_until, at(3 + ACTIVE_LIMIT));
    let started = json!({ "worker_id": w, "active_until": e[2].data["active_until"] });
    check(&e[2], EventType::TaskStarted, Actor::Worker, started);
    let text = json!({ "text": "hello" });
    check(&e[3], EventType::WorkerMessage, Actor::Worker, text);
    let shown = json!({
        "photo_id": p.id,
        "content_type": "image/png",
        "width": 640,
        "height": 480,
        "size_bytes": 1234,
        "path": format!("/api/v1/tasks/{t}/photos/{}", p.id),
    });
    check(&e[4], EventType::WorkerPhoto, Actor::Worker, shown);
    let raised = json!({ "kind": "needs_more_time", "text": "slow" });
    check(&e[5], EventType::WorkerIssue, Actor::Worker, raised);
    let answer = json!({ "issue_event_id": issue, "action": "acknowledge", "text": "fine" });
    check(&e[6], EventType::AgentIssueResponse, Actor::Agent, answer);
    let done = json!({ "worker_id": w, "note": "done" });
    check(&e[7], EventType::TaskCompleted, Actor::Worker, done);

    // unassigned, then expired while open
    let (t, w) = task_in(s, TaskState::Assigned).await;
    s.reconcile_due(at(2 + START_TIMEOUT), 10)
        .await
        .expect("unassign");
    s.reconcile_due(at(LIFETIME), 10).await.expect("expire");
    let e = all_events(s, t.id).await;
    assert_eq!(e.len(), 4);
    let unassigned = json!({ "worker_id": w, "reason": "start_timeout" });
    check(&e[2], EventType::TaskUnassigned, Actor::System, unassigned);
    let expired = json!({ "reason": "lifetime", "previous_state": "open" });
    check(&e[3], EventType::TaskExpired, Actor::System, expired);

    // expired while active
    let (t, _) = task_in(s, TaskState::Active).await;
    s.reconcile_due(at(3 + ACTIVE_LIMIT), 10)
        .await
        .expect("expire");
    let e = all_events(s, t.id).await;
    let expired = json!({ "reason": "active_time_limit", "previous_state": "active" });
    check(&e[3], EventType::TaskExpired, Actor::System, expired);

    // stopped, with and without a reason
    let (t, w) = task_in(s, TaskState::Active).await;
    ok(s, t.id, stop(w, Some("rain")), 9).await;
    let e = all_events(s, t.id).await;
    let stopped = json!({ "worker_id": w, "reason": "rain" });
    check(&e[3], EventType::TaskStopped, Actor::Worker, stopped);
    let (t, w) = task_in(s, TaskState::Assigned).await;
    ok(s, t.id, stop(w, None), 9).await;
    let e = all_events(s, t.id).await;
    let stopped = json!({ "worker_id": w, "reason": null });
    check(&e[2], EventType::TaskStopped, Actor::Worker, stopped);

    // cancelled by the agent, directly and by answering an issue
    let (t, _) = task_in(s, TaskState::Open).await;
    let reason = Some("not needed".to_owned());
    ok(s, t.id, Command::Cancel { reason }, 9).await;
    let e = all_events(s, t.id).await;
    let cancelled = json!({ "reason": "not needed" });
    check(&e[1], EventType::TaskCancelled, Actor::Agent, cancelled);
    let (t, w) = task_in(s, TaskState::Active).await;
    let issue = first_id(&ok(s, t.id, raise(w, IssueKind::SafetyConcern, "dog"), 4).await);
    ok(s, t.id, respond(issue, IssueAction::Cancel, None), 5).await;
    let e = all_events(s, t.id).await;
    let answer = json!({ "issue_event_id": issue, "action": "cancel", "text": null });
    check(&e[4], EventType::AgentIssueResponse, Actor::Agent, answer);
    let cancelled = json!({ "reason": null, "issue_event_id": issue });
    check(&e[5], EventType::TaskCancelled, Actor::Agent, cancelled);

    // extended by the agent
    let (t, _) = task_in(s, TaskState::Open).await;
    ok(
        s,
        t.id,
        Command::Extend(Extension::Until(at(LIFETIME + 60))),
        9,
    )
    .await;
    let e = all_events(s, t.id).await;
    let extended = json!({
        "previous_expires_at": t.expires_at,
        "expires_at": at(LIFETIME + 60),
    });
    check(&e[1], EventType::TaskExtended, Actor::Agent, extended);

    // review: submitted, sent back, submitted again, accepted by the agent
    let (t, w) = reviewed_and_active(s).await;
    let submit = |ok: bool| Command::Complete {
        worker: w,
        note: None,
        result: Some(json!({ "ok": ok })),
    };
    ok(s, t.id, submit(false), 4).await;
    let revise = Verdict::Revise {
        text: "again".into(),
    };
    ok(s, t.id, Command::Review(revise), 5).await;
    ok(s, t.id, submit(true), 6).await;
    ok(s, t.id, Command::Review(Verdict::Accept), 7).await;
    let e = all_events(s, t.id).await;
    let submitted = json!({ "worker_id": w, "note": null, "result": { "ok": false },
                            "revision": 0, "auto_accept_at": at(4 + 60) });
    check(&e[3], EventType::TaskSubmitted, Actor::Worker, submitted);
    let revised = json!({ "text": "again", "revision": 1,
                          "active_until": at(5 + ACTIVE_LIMIT) });
    check(
        &e[4],
        EventType::TaskRevisionRequested,
        Actor::Agent,
        revised,
    );
    let accepted = json!({ "worker_id": w, "result": { "ok": true },
                           "review": "accepted", "automatic": false });
    check(&e[6], EventType::TaskCompleted, Actor::Agent, accepted);
    let stored = read(s, t.id).await.expect("kept");
    assert_eq!(stored.result, Some(json!({ "ok": true })));
    assert_eq!(
        stored.review.map(|r| (r.state, r.revisions)),
        Some((meatspace_domain::ReviewState::Accepted, 1))
    );

    let every: BTreeSet<_> = EventType::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(checked, every, "some event types were not checked");
}

async fn stop_ends_an_assigned_or_active_task(store: Arc<dyn Store>) {
    let s = &*store;
    let stranger = worker(s).await;
    for state in [TaskState::Assigned, TaskState::Active] {
        let (task, w) = task_in(s, state).await;
        refused(s, task.id, stop(stranger, None), 10, Refusal::NotYourTask).await;
        // Stop is authoritative: allowed even after every deadline passed.
        let late = 10 * LIFETIME;
        let stopped = ok(s, task.id, stop(w, None), late).await;
        assert_eq!(stopped.task.state, TaskState::Stopped);
        assert_eq!(stopped.task.ended_at, Some(at(late)));
        assert_eq!(read(s, task.id).await, Some(stopped.task));
    }
    for state in [TaskState::Draft, TaskState::Open] {
        // Nobody is assigned yet, so no worker may stop it.
        let (task, w) = task_in(s, state).await;
        refused(s, task.id, stop(w, None), 10, Refusal::NotYourTask).await;
    }
    // Only the two unstopped tasks still have a deadline.
    let next = s.next_deadline().await.expect("next deadline");
    assert_eq!(next, Some(at(LIFETIME)));
}

async fn cancel_ends_any_non_terminal_task(store: Arc<dyn Store>) {
    let s = &*store;
    let states = [
        TaskState::Draft,
        TaskState::Open,
        TaskState::Assigned,
        TaskState::Active,
    ];
    for state in states {
        let (task, _) = task_in(s, state).await;
        // Cancel is allowed even after every deadline passed.
        let late = 10 * LIFETIME;
        let cancelled = ok(s, task.id, cancel(), late).await;
        assert_eq!(cancelled.task.state, TaskState::Cancelled, "from {state}");
        assert_eq!(cancelled.task.ended_at, Some(at(late)));
        assert_eq!(kinds(&cancelled.events), [EventType::TaskCancelled]);
        assert_eq!(read(s, task.id).await, Some(cancelled.task));
    }
    // Nothing is left for the controller.
    assert_eq!(s.next_deadline().await.expect("next deadline"), None);
    let due = s.reconcile_due(at(100 * LIFETIME), 100).await;
    assert!(due.expect("reconcile").is_empty());
}

/// A webhook endpoint is created with its task; it is due while its task
/// has events after its cursor; a claim leases it (no second claim until
/// the lease ends); outcomes move the cursor, the failure count and the
/// state; a disabled endpoint is never due again; it goes with its task.
async fn webhook_endpoints_deliver_from_a_durable_cursor(store: Arc<dyn Store>) {
    use meatspace_store::{WebhookOutcome as O, webhooks::WebhookState};
    let s = &*store;
    let id = Uuid::new_v4();
    let task = s
        .create_task_with_webhook(
            NewTask::development(id, "hooked", TokenHash::of("mst_x"), at(0), at(LIFETIME)),
            "https://example.test/hook",
        )
        .await
        .expect("create with webhook");
    assert_eq!(task.id, id);
    // What is due at `secs`, leased for 30 s (at most 10).
    let claim_due = async |secs: i64| {
        s.claim_due_webhooks(at(secs), at(secs + 30), 10)
            .await
            .unwrap()
    };
    let w = s.webhook(id).await.unwrap().expect("endpoint");
    assert_eq!(w.url, "https://example.test/hook");
    assert_eq!(w.state, WebhookState::Active);
    assert_eq!(w.last_delivered_event_id, 0);
    assert_eq!(s.webhook(create(s).await.id).await.unwrap(), None);
    // No event yet: nothing due.
    assert!(claim_due(1).await.is_empty());
    assert_eq!(s.next_webhook_attempt().await.unwrap(), None);
    let published = ok(s, id, Command::Publish, 1).await.events[0].id;
    assert_eq!(s.next_webhook_attempt().await.unwrap(), Some(at(0)));
    let due = claim_due(2).await;
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].task_id, due[0].delivered_event_id), (id, 0));
    // Leased: not due again before the lease ends.
    assert!(claim_due(3).await.is_empty());
    assert_eq!(s.next_webhook_attempt().await.unwrap(), Some(at(32)));
    // A failure counts and schedules the retry.
    let failed = O::Failed {
        error: "could not connect".into(),
        next_attempt_at: at(10),
    };
    s.record_webhook(id, &failed, at(4)).await.unwrap();
    let w = s.webhook(id).await.unwrap().unwrap();
    assert_eq!((w.state, w.attempts), (WebhookState::Failing, 1));
    assert_eq!(w.failing_since, Some(at(4)));
    assert_eq!(w.last_error.as_deref(), Some("could not connect"));
    assert!(claim_due(9).await.is_empty());
    let due = claim_due(10).await;
    assert_eq!((due[0].attempts, due[0].failing_since), (1, Some(at(4))));
    // Delivered: the cursor moves, the failure is forgotten, nothing is due.
    let delivered = O::Delivered {
        event_id: published,
        next_attempt_at: Some(at(11)),
    };
    s.record_webhook(id, &delivered, at(11)).await.unwrap();
    let w = s.webhook(id).await.unwrap().unwrap();
    assert_eq!(w.last_delivered_event_id, published);
    assert_eq!(
        (w.state, w.attempts, w.last_error),
        (WebhookState::Active, 0, None)
    );
    assert!(claim_due(12).await.is_empty());
    // A new event makes it due again; disabling ends it for good.
    ok(s, id, Command::Cancel { reason: None }, 13).await;
    assert_eq!(claim_due(14).await.len(), 1);
    s.record_webhook(
        id,
        &O::Disabled {
            error: "410 Gone".into(),
        },
        at(15),
    )
    .await
    .unwrap();
    let w = s.webhook(id).await.unwrap().unwrap();
    assert_eq!(w.state, WebhookState::Disabled);
    assert_eq!(w.next_attempt_at, None);
    // Later outcomes of a delivery in flight do not revive it.
    s.record_webhook(id, &delivered, at(16)).await.unwrap();
    assert_eq!(
        s.webhook(id).await.unwrap().unwrap().state,
        WebhookState::Disabled
    );
    assert!(claim_due(1000).await.is_empty());
    assert_eq!(s.next_webhook_attempt().await.unwrap(), None);
    // Retention removes the endpoint with its task.
    s.purge_ended_before(at(100), at(100), 10).await.unwrap();
    assert_eq!(s.webhook(id).await.unwrap(), None);
}

/// An idempotency key: claimed by one request, in flight for the others,
/// refused for another request, replayed once completed, free again after
/// a release, an expired window or an abandoned lease, and purged.
async fn idempotency_keys_are_claimed_once_and_replayed(store: Arc<dyn Store>) {
    use meatspace_store::{IdempotencyBegin as B, idempotency::IdempotencyClaim};
    let s = &*store;
    let claim = |key: &str, print: u8, secs: i64| IdempotencyClaim {
        scope: [1; 32],
        key: key.to_owned(),
        fingerprint: [print; 32],
        now: at(secs),
        lease: TimeDelta::seconds(60),
        ttl: TimeDelta::seconds(3600),
    };
    // The request of fingerprint `print` for the key "k", at `secs`.
    let begin =
        async |print: u8, secs: i64| s.idempotency_begin(&claim("k", print, secs)).await.unwrap();
    assert_eq!(begin(1, 0).await, B::Started);
    assert_eq!(begin(1, 1).await, B::InFlight);
    assert_eq!(begin(2, 1).await, B::Mismatch);
    // Another scope with the same key is independent.
    let mut other = claim("k", 2, 1);
    other.scope = [2; 32];
    assert_eq!(s.idempotency_begin(&other).await.unwrap(), B::Started);
    s.idempotency_complete(&[1; 32], "k", 201, b"sealed")
        .await
        .unwrap();
    assert_eq!(
        begin(1, 2).await,
        B::Completed {
            status: 201,
            response: b"sealed".to_vec()
        }
    );
    assert_eq!(begin(2, 2).await, B::Mismatch);
    // After its window the key is new again, for any request.
    assert_eq!(begin(2, 3600).await, B::Started);
    // A release frees an in-flight claim; a completed one is kept.
    s.idempotency_release(&[1; 32], "k").await.unwrap();
    assert_eq!(begin(3, 3601).await, B::Started);
    // An abandoned claim is taken over after its lease.
    assert_eq!(begin(3, 3630).await, B::InFlight);
    assert_eq!(begin(4, 3661).await, B::Started);
    // Purging removes what expired by the cutoff (the other scope's claim),
    // and only that.
    assert_eq!(s.purge_idempotency_keys(at(3601), 100).await.unwrap(), 1);
    assert_eq!(s.purge_idempotency_keys(at(3601), 100).await.unwrap(), 0);
    assert_eq!(begin(4, 3662).await, B::InFlight);
}

/// The extended deadline is written, read back, and is the one the
/// controller's index and `reconcile_due` act on: nothing at the old one.
async fn an_extension_moves_the_deadline_the_controller_acts_on(store: Arc<dyn Store>) {
    let s = &*store;
    let (t, _) = task_in(s, TaskState::Open).await;
    let later = at(LIFETIME + 600);
    let a = ok(s, t.id, Command::Extend(Extension::Until(later)), 10).await;
    assert_eq!(a.task.expires_at, later);
    let read = s.task(t.id).await.expect("read").expect("exists");
    assert_eq!(read.expires_at, later);
    assert_eq!(s.next_deadline().await.expect("next deadline"), Some(later));
    let nothing = s.reconcile_due(at(LIFETIME), 10).await.expect("reconcile");
    assert!(
        nothing.is_empty(),
        "expired at the old deadline: {nothing:?}"
    );
    let expired = s.reconcile_due(later, 10).await.expect("reconcile");
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].task.state, TaskState::Expired);
}

async fn reconcile_command_applies_only_what_is_due(store: Arc<dyn Store>) {
    let s = &*store;
    let reconcile = || Command::Reconcile;

    let (open, _) = task_in(s, TaskState::Open).await;
    refused(s, open.id, reconcile(), LIFETIME - 1, Refusal::NothingDue).await;
    let expired = ok(s, open.id, reconcile(), LIFETIME).await;
    assert_eq!(expired.task.state, TaskState::Expired);
    assert_eq!(
        expired.reconciled,
        Some(Due::Expire(ExpiryReason::Lifetime))
    );
    assert_eq!(expired.task.ended_at, Some(at(LIFETIME)));

    let (assigned, w) = task_in(s, TaskState::Assigned).await;
    let start_by = 2 + START_TIMEOUT;
    refused(
        s,
        assigned.id,
        reconcile(),
        start_by - 1,
        Refusal::NothingDue,
    )
    .await;
    let reopened = ok(s, assigned.id, reconcile(), start_by).await;
    assert_eq!(reopened.reconciled, Some(Due::Unassign));
    assert_eq!(reopened.task.state, TaskState::Open);
    assert_eq!(reopened.task.worker_id, None);
    assert_eq!(reopened.task.assigned_at, None);
    assert_eq!(reopened.task.start_by, None);
    // Open again: even the worker who missed the start may claim it anew.
    let again = ok(s, assigned.id, claim(w), start_by + 1).await;
    let new_start_by = at(start_by + 1 + START_TIMEOUT);
    assert_eq!(again.task.start_by, Some(new_start_by));

    let (active, _) = task_in(s, TaskState::Active).await;
    let until = 3 + ACTIVE_LIMIT;
    refused(s, active.id, reconcile(), until - 1, Refusal::NothingDue).await;
    let timed_out = ok(s, active.id, reconcile(), until).await;
    let reason = ExpiryReason::ActiveTimeLimit;
    assert_eq!(timed_out.reconciled, Some(Due::Expire(reason)));
    assert_eq!(timed_out.task.state, TaskState::Expired);
}

async fn refusals_name_the_reason_and_change_nothing(store: Arc<dyn Store>) {
    let s = &*store;
    let stranger = worker(s).await;

    let missing = s.apply(Uuid::new_v4(), Command::Publish, at(1)).await;
    assert!(matches!(missing, Err(StoreError::NotFound)), "{missing:?}");

    let (draft, _) = task_in(s, TaskState::Draft).await;
    let id = draft.id;
    refused(s, id, claim(stranger), 5, wrong("claim", TaskState::Draft)).await;
    refused(s, id, message(stranger, "hi"), 5, Refusal::NotYourTask).await;

    let (open, _) = task_in(s, TaskState::Open).await;
    let id = open.id;
    refused(
        s,
        id,
        Command::Publish,
        5,
        wrong("publish", TaskState::Open),
    )
    .await;
    // A passed deadline waits for the controller.
    refused(s, id, claim(stranger), LIFETIME, Refusal::DeadlinePassed).await;
    refused(s, id, Command::Publish, LIFETIME, Refusal::DeadlinePassed).await;

    let (assigned, w) = task_in(s, TaskState::Assigned).await;
    let id = assigned.id;
    let taken = wrong("claim", TaskState::Assigned);
    refused(s, id, claim(stranger), 5, taken.clone()).await;
    refused(s, id, claim(w), 5, taken).await;
    refused(s, id, start(stranger), 5, Refusal::NotYourTask).await;
    let early = wrong("complete", TaskState::Assigned);
    refused(s, id, complete(w, None), 5, early).await;
    let start_by = 2 + START_TIMEOUT;
    refused(s, id, start(w), start_by, Refusal::DeadlinePassed).await;

    let (active, w) = task_in(s, TaskState::Active).await;
    let id = active.id;
    refused(s, id, start(w), 5, wrong("start", TaskState::Active)).await;
    refused(
        s,
        id,
        message(stranger, "let me in"),
        5,
        Refusal::NotYourTask,
    )
    .await;
    let issue = raise(stranger, IssueKind::Other, "x");
    refused(s, id, issue, 5, Refusal::NotYourTask).await;
    refused(s, id, complete(stranger, None), 5, Refusal::NotYourTask).await;
    let until = 3 + ACTIVE_LIMIT;
    refused(s, id, message(w, "late"), until, Refusal::DeadlinePassed).await;
    refused(s, id, complete(w, None), until, Refusal::DeadlinePassed).await;
    // A refused photo is not stored.
    let p = photo(10);
    refused(s, id, send_photo(stranger, &p), 5, Refusal::NotYourTask).await;
    refused(s, id, send_photo(w, &p), until, Refusal::DeadlinePassed).await;
    assert_eq!(s.photo(id, p.id).await.expect("read photo"), None);

    // Each refused task is still exactly where it was.
    assert_eq!(read(s, active.id).await, Some(active));
    assert_eq!(read(s, assigned.id).await, Some(assigned));
    assert_eq!(read(s, open.id).await, Some(open));
    assert_eq!(read(s, draft.id).await, Some(draft));
}

/// A refused command lets go of the task at once: the controller's sweep,
/// which passes over tasks that another writer holds, finds it right after.
async fn a_refused_command_leaves_the_task_to_the_controller(store: Arc<dyn Store>) {
    let s = &*store;
    for round in 0..20 {
        let (task, _) = task_in(s, TaskState::Open).await;
        let late = s.apply(task.id, Command::Publish, at(LIFETIME)).await;
        let refusal = Refusal::DeadlinePassed;
        assert!(matches!(late, Err(StoreError::Refused(r)) if r == refusal));
        let swept = s.reconcile_due(at(LIFETIME), 10).await.expect("reconcile");
        let ids: Vec<Uuid> = swept.iter().map(|a| a.task.id).collect();
        assert_eq!(ids, [task.id], "round {round}");
    }
}

async fn terminal_tasks_refuse_every_command(store: Arc<dyn Store>) {
    let s = &*store;
    /// A final state, the command that reaches it (given the worker) and when.
    type Ending = (TaskState, fn(Uuid) -> Command, i64);
    let endings: [Ending; 4] = [
        (TaskState::Completed, |w| complete(w, None), 10),
        (TaskState::Stopped, |w| stop(w, None), 10),
        (TaskState::Cancelled, |_| cancel(), 10),
        (TaskState::Expired, |_| Command::Reconcile, 3 + ACTIVE_LIMIT),
    ];
    for (state, ending, secs) in endings {
        let (task, w) = task_in(s, TaskState::Active).await;
        let id = task.id;
        let issue = first_id(&ok(s, id, raise(w, IssueKind::Other, "?"), 5).await);
        assert_eq!(ok(s, id, ending(w), secs).await.task.state, state);
        let other = worker(s).await;
        let p = photo(10);
        let commands = [
            Command::Publish,
            cancel(),
            respond(issue, IssueAction::Clarify, Some("x")),
            claim(other),
            start(w),
            message(w, "still here"),
            send_photo(w, &p),
            raise(w, IssueKind::Other, "again"),
            complete(w, None),
            stop(w, None),
            Command::Reconcile,
        ];
        for command in commands {
            refused(s, id, command, 20, Refusal::Terminal { state }).await;
        }
        assert_eq!(s.photo(id, p.id).await.expect("read photo"), None);
        let feed = all_events(s, id).await;
        assert_eq!(feed.iter().filter(|e| e.kind.is_terminal()).count(), 1);
        let last = feed.last().expect("events");
        assert!(last.kind.is_terminal(), "nothing follows the end");
    }
}

// ---- issues and photos -------------------------------------------------------------------

async fn issues_open_resolve_and_close_when_the_task_ends(store: Arc<dyn Store>) {
    let s = &*store;
    let (task, w) = task_in(s, TaskState::Active).await;
    let id = task.id;
    assert!(s.issues(id).await.expect("issues").is_empty());

    let first = ok(
        s,
        id,
        raise(w, IssueKind::UnclearInstructions, "which?"),
        10,
    )
    .await;
    assert_eq!(first.task.open_issues, 1);
    let second = ok(s, id, raise(w, IssueKind::AccessBlocked, "locked"), 11).await;
    let third = ok(s, id, raise(w, IssueKind::ItemUnavailable, "no water"), 12).await;
    assert_eq!(third.task.open_issues, 3);
    let [first, second, third] = [first, second, third].map(|a| first_id(&a));

    let issues = s.issues(id).await.expect("issues");
    let listed: Vec<_> = issues.iter().map(|i| (i.event_id, i.kind)).collect();
    let raised = [
        (first, IssueKind::UnclearInstructions),
        (second, IssueKind::AccessBlocked),
        (third, IssueKind::ItemUnavailable),
    ];
    assert_eq!(listed, raised, "issues, ascending by event id");
    for i in &issues {
        assert_eq!((i.task_id, i.status), (id, IssueStatus::Open));
        assert_eq!((&i.resolution, i.resolved_at), (&None, None));
    }

    let answer = respond(second, IssueAction::Clarify, Some("key under the mat"));
    let answered = ok(s, id, answer, 13).await;
    assert_eq!(answered.task.open_issues, 2);
    assert_eq!(read(s, id).await.expect("task").open_issues, 2);
    let again = respond(second, IssueAction::Acknowledge, Some("again"));
    let already = Refusal::IssueNotOpen(second, IssueStatus::Resolved);
    refused(s, id, again, 14, already).await;

    // The task ends (expires) with two issues unanswered: they close, and
    // say why.
    let ended = s.reconcile_due(at(3 + ACTIVE_LIMIT), 10).await;
    let ended = ended.expect("reconcile");
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].task.open_issues, 0);
    let status: Vec<_> = s
        .issues(id)
        .await
        .expect("issues")
        .into_iter()
        .map(|i| (i.event_id, i.status, i.resolution, i.resolved_at))
        .collect();
    let closed = |event_id| {
        let why = Some("task_expired".to_owned());
        (
            event_id,
            IssueStatus::Closed,
            why,
            Some(at(3 + ACTIVE_LIMIT)),
        )
    };
    let resolved = (
        second,
        IssueStatus::Resolved,
        Some("clarify".to_owned()),
        Some(at(13)),
    );
    assert_eq!(status, [closed(first), resolved, closed(third)]);
    assert_eq!(read(s, id).await.expect("task").open_issues, 0);
}

async fn answering_an_issue_with_cancel_ends_the_task(store: Arc<dyn Store>) {
    let s = &*store;
    let (task, w) = task_in(s, TaskState::Assigned).await;
    let id = task.id;
    let dog = first_id(&ok(s, id, raise(w, IssueKind::SafetyConcern, "dog"), 10).await);
    let stairs = first_id(&ok(s, id, raise(w, IssueKind::SafetyConcern, "stairs"), 11).await);

    let answer = respond(dog, IssueAction::Cancel, Some("stay safe"));
    let applied = ok(s, id, answer, 12).await;
    assert_eq!(applied.task.state, TaskState::Cancelled);
    let ending = [EventType::AgentIssueResponse, EventType::TaskCancelled];
    assert_eq!(kinds(&applied.events), ending);
    assert!(applied.events[0].id < applied.events[1].id);
    let status: Vec<_> = s
        .issues(id)
        .await
        .expect("issues")
        .into_iter()
        .map(|i| (i.event_id, i.status, i.resolution))
        .collect();
    let resolved = (dog, IssueStatus::Resolved, Some("cancel".to_owned()));
    let closed = (
        stairs,
        IssueStatus::Closed,
        Some("task_cancelled".to_owned()),
    );
    assert_eq!(status, [resolved, closed]);
    let feed = all_events(s, id).await;
    assert_eq!(feed.iter().filter(|e| e.kind.is_terminal()).count(), 1);
}

async fn responses_are_scoped_to_the_issue_s_task(store: Arc<dyn Store>) {
    let s = &*store;
    let (mine, _) = task_in(s, TaskState::Active).await;
    let (theirs, w) = task_in(s, TaskState::Active).await;
    let foreign = first_id(&ok(s, theirs.id, raise(w, IssueKind::Other, "x"), 5).await);
    let answer = |id| respond(id, IssueAction::Clarify, Some("y"));

    // Another task's issue, an event that is no issue, an id that does not exist.
    let not_an_issue = mine.last_event_id;
    for id in [foreign, not_an_issue, i64::MAX] {
        refused(s, mine.id, answer(id), 6, Refusal::IssueNotFound(id)).await;
    }
    assert!(s.issues(mine.id).await.expect("issues").is_empty());
    let theirs = s.issues(theirs.id).await.expect("issues");
    assert_eq!(theirs.len(), 1);
    assert_eq!(
        theirs[0].status,
        IssueStatus::Open,
        "answered through another task"
    );
}

async fn photo_is_stored_and_scoped_to_its_task(store: Arc<dyn Store>) {
    let s = &*store;
    let (task, w) = task_in(s, TaskState::Assigned).await;
    let (other, _) = task_in(s, TaskState::Active).await;
    let id = task.id;
    let p = photo(200_000);
    let applied = ok(s, id, send_photo(w, &p), 10).await;
    assert_eq!(applied.events[0].data["photo_id"], json!(p.id));
    assert_eq!(applied.events[0].data["size_bytes"], json!(200_000));

    let stored = s.photo(id, p.id).await.expect("read photo");
    let stored = stored.expect("photo stored");
    assert_eq!(stored.id, p.id);
    assert_eq!(stored.task_id, id);
    assert_eq!(stored.content_type, "image/png");
    assert_eq!(stored.created_at, at(10));
    assert!(
        stored.bytes == p.bytes,
        "the photo's bytes changed in the store"
    );

    // Only through its own task.
    assert_eq!(s.photo(other.id, p.id).await.expect("read"), None);
    assert_eq!(s.photo(id, Uuid::new_v4()).await.expect("read"), None);
    assert_eq!(s.photo(Uuid::new_v4(), p.id).await.expect("read"), None);

    // A second photo does not replace the first.
    let second = photo(3);
    ok(s, id, send_photo(w, &second), 11).await;
    let got = s.photo(id, second.id).await.expect("read").expect("stored");
    assert_eq!(got.bytes, second.bytes);
    let kept = s.photo(id, p.id).await.expect("read").expect("kept");
    assert!(kept.bytes == p.bytes);
}

// ---- feeds and listings -------------------------------------------------------------------

async fn events_page_by_after_and_limit(store: Arc<dyn Store>) {
    let s = &*store;
    let (a, wa) = task_in(s, TaskState::Active).await;
    let (b, wb) = task_in(s, TaskState::Active).await;
    // Interleaved appends to two tasks: each task's ids have gaps.
    for n in 0..20 {
        ok(s, a.id, message(wa, &format!("a{n}")), 10).await;
        ok(s, b.id, message(wb, &format!("b{n}")), 10).await;
    }
    let all = all_events(s, a.id).await;
    assert_eq!(all.len(), 23);
    assert!(
        all.iter().all(|e| e.task_id == a.id),
        "another task's events leaked in"
    );
    assert!(all.windows(2).all(|p| p[0].id < p[1].id));
    let texts: Vec<_> = all[3..].iter().map(|e| e.data["text"].clone()).collect();
    let sent: Vec<_> = (0..20).map(|n| json!(format!("a{n}"))).collect();
    assert_eq!(texts, sent);

    // Paging with after = the last id seen yields every event once, in order.
    let mut paged = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let page = s.events(a.id, after, 5).await.expect("page");
        assert!(page.len() <= 5);
        pages += 1;
        let Some(last) = page.last() else { break };
        after = last.id;
        paged.extend(page);
    }
    assert_eq!(paged, all);
    assert_eq!(pages, 6, "23 events in pages of 5, then an empty page");

    // `after` is exclusive and need not be an id of this task.
    let page = |after, limit| async move { s.events(a.id, after, limit).await.expect("page") };
    assert_eq!(page(all[9].id, 3).await, all[10..13]);
    let b_id = all_events(s, b.id).await[10].id;
    let later: Vec<_> = all.iter().filter(|e| e.id > b_id).cloned().collect();
    assert_eq!(page(b_id, 100).await, later);
    assert!(page(all[22].id, 100).await.is_empty());
    assert!(page(i64::MAX, 100).await.is_empty());
    assert_eq!(page(-1, 2).await, all[..2]);
    assert!(page(0, 0).await.is_empty());
    let unknown = s.events(Uuid::new_v4(), 0, 100).await;
    assert!(unknown.expect("events of an unknown task").is_empty());
    assert_eq!(read(s, a.id).await.expect("task").last_event_id, all[22].id);
}

/// `feed_read` answers what `agent_token_hash`, `task` and `events` would,
/// in one read; nothing for a task that is not there (purged or never).
async fn a_feed_read_is_the_token_state_and_page_together(store: Arc<dyn Store>) {
    let s = &*store;
    let created = create_at(s, 0, "read my feed").await;
    let id = created.task.id;
    // The task's feed read after `after`, at most `limit` events.
    let feed = async |after: i64, limit: u32| {
        s.feed_read(id, after, limit)
            .await
            .expect("read")
            .expect("the task")
    };
    let empty = feed(0, 10).await;
    assert!(empty.agent_token_hash.verify(&created.token));
    assert_eq!(empty.state, TaskState::Draft);
    assert_eq!(empty.last_event_id, 0);
    assert!(empty.events.is_empty());

    ok(s, id, Command::Publish, 1).await;
    let w = worker(s).await;
    ok(s, id, claim(w), 2).await;
    ok(s, id, start(w), 3).await;
    for n in 0..5 {
        ok(s, id, message(w, &format!("m{n}")), 4).await;
    }
    let all = all_events(s, id).await;
    let read = feed(0, 100).await;
    assert_eq!(read.state, TaskState::Active);
    assert_eq!(read.last_event_id, all.last().expect("events").id);
    assert_eq!(read.events, all);
    let page = feed(all[2].id, 3).await;
    assert_eq!(page.events, all[3..6]);
    let tail = feed(read.last_event_id, 3).await;
    assert!(tail.events.is_empty());
    assert_eq!(tail.last_event_id, read.last_event_id);

    assert!(
        s.feed_read(Uuid::new_v4(), 0, 10)
            .await
            .expect("read")
            .is_none()
    );
    ok(s, id, complete(w, None), 5).await;
    let ended = feed(0, 100).await;
    assert_eq!(ended.state, TaskState::Completed);
    s.purge_ended_before(at(1000), at(1000), 10)
        .await
        .expect("purge");
    assert!(s.feed_read(id, 0, 10).await.expect("read").is_none());
}

/// Every committed change of a task bumps its counter before the call
/// returns (what lets the API trust a cached feed head, see
/// `meatspace_api::feed_heads`).
async fn every_write_bumps_the_task_s_version(store: Arc<dyn Store>) {
    let s = &*store;
    let versions = s.versions().expect("both backends keep change counters");
    let created = create_at(s, 0, "count my changes").await;
    let id = created.task.id;
    let mut last = versions.current(id);
    let mut changed = |what: &str| {
        let now = versions.current(id);
        assert_ne!(now, last, "{what} did not bump the task's version");
        last = now;
    };
    ok(s, id, Command::Publish, 1).await;
    changed("publish");
    let w = worker(s).await;
    ok(s, id, claim(w), 2).await;
    changed("claim");
    ok(s, id, start(w), 3).await;
    changed("start");
    ok(s, id, message(w, "hello"), 4).await;
    changed("a message");
    // Past the active time limit: the controller's expiry.
    let expired = s
        .reconcile_due(at(3 + ACTIVE_LIMIT + 1), 10)
        .await
        .expect("reconcile");
    assert_eq!(expired.len(), 1);
    changed("an expiry");
    s.purge_ended_before(at(100_000), at(100_000), 10)
        .await
        .expect("purge");
    changed("a purge");
}

async fn open_tasks_page_by_cursor(store: Arc<dyn Store>) {
    let s = &*store;
    let w = worker(s).await;
    assert!(s.open_tasks(None, 10).await.expect("list").is_empty());
    // Three tasks share a creation time, so the id must break the tie.
    let mut open = Vec::new();
    for created in [5, 0, 0, 3, 0, 9, 7] {
        let task = create_at(s, created, "t").await.task;
        open.push(ok(s, task.id, Command::Publish, created + 1).await.task);
    }
    let draft = create_at(s, 1, "draft").await.task;
    let cancelled = open.pop().expect("task");
    ok(s, cancelled.id, cancel(), 20).await;
    let claimed = open.pop().expect("task");
    ok(s, claimed.id, claim(w), 20).await;
    open.sort_by_key(|t| (t.created_at, t.id));

    let listed = every_page(
        2,
        |cursor| s.open_tasks(cursor, 2),
        |last| OpenTasksCursor {
            created_at: last.created_at,
            id: last.id,
        },
    )
    .await;
    assert_eq!(listed, open, "open tasks, oldest first, each once");
    let unlisted = [draft.id, cancelled.id, claimed.id];
    assert!(!listed.iter().any(|t| unlisted.contains(&t.id)));

    // A task that loses its worker is listed again, in its place.
    let reopened = s.reconcile_due(at(20 + START_TIMEOUT), 10).await;
    let reopened = reopened.expect("reconcile");
    assert_eq!(reopened.len(), 1);
    assert_eq!(reopened[0].task.id, claimed.id);
    open.push(reopened[0].task.clone());
    open.sort_by_key(|t| (t.created_at, t.id));
    assert_eq!(s.open_tasks(None, 100).await.expect("list"), open);
}

/// A listing read page by page to its end: `page(cursor)` reads the tasks
/// after `cursor`, at most `size` of them; `cursor_of` makes the next
/// cursor from a page's last task.
async fn every_page<C, Fut>(
    size: usize,
    mut page: impl FnMut(Option<C>) -> Fut,
    cursor_of: impl Fn(&Task) -> C,
) -> Vec<Task>
where
    Fut: std::future::Future<Output = Result<Vec<Task>, StoreError>>,
{
    let mut listed = Vec::new();
    let mut cursor = None;
    loop {
        let tasks = page(cursor).await.expect("list");
        assert!(tasks.len() <= size);
        let Some(last) = tasks.last() else { break };
        cursor = Some(cursor_of(last));
        listed.extend(tasks);
    }
    listed
}

// ---- deadlines, reconciliation, retention --------------------------------------------------

async fn next_deadline_is_the_earliest_pending_one(store: Arc<dyn Store>) {
    let s = &*store;
    let next = move || async move { s.next_deadline().await.expect("next deadline") };
    assert_eq!(next().await, None);
    let w = worker(s).await;
    let late = create_at(s, 0, "late").await.task;
    assert_eq!(next().await, Some(at(LIFETIME)));
    let early = create_at(s, -100, "early").await.task;
    assert_eq!(next().await, Some(at(LIFETIME - 100)));
    ok(s, early.id, Command::Publish, 1).await;
    assert_eq!(next().await, Some(at(LIFETIME - 100)));
    ok(s, early.id, claim(w), 10).await;
    assert_eq!(
        next().await,
        Some(at(10 + START_TIMEOUT)),
        "the start timeout"
    );
    ok(s, early.id, start(w), 20).await;
    assert_eq!(
        next().await,
        Some(at(20 + ACTIVE_LIMIT)),
        "the active time limit"
    );
    ok(s, early.id, complete(w, None), 30).await;
    assert_eq!(
        next().await,
        Some(at(LIFETIME)),
        "a finished task has no deadline"
    );
    ok(s, late.id, cancel(), 40).await;
    assert_eq!(next().await, None);
}

async fn reconcile_due_applies_due_deadlines_in_order(store: Arc<dyn Store>) {
    let s = &*store;
    let (open, _) = task_in(s, TaskState::Open).await;
    let (draft, _) = task_in(s, TaskState::Draft).await;
    let (assigned, w) = task_in(s, TaskState::Assigned).await;
    let (active, _) = task_in(s, TaskState::Active).await;
    let (done, _) = task_in(s, TaskState::Open).await;
    ok(s, done.id, cancel(), 4).await;
    // Assigned, but its lifetime ends (at 10) before its start timeout (at 60).
    let short = create_at(s, 10 - LIFETIME, "short").await.task;
    ok(s, short.id, Command::Publish, 0).await;
    ok(s, short.id, claim(worker(s).await), 0).await;
    let ids = [open.id, draft.id, assigned.id, active.id, done.id, short.id];
    let tasks = move || async move {
        let mut out = Vec::new();
        for id in ids {
            out.push(read(s, id).await.expect("task"));
        }
        out
    };
    let reconcile = move |secs, limit| async move {
        let applied = s.reconcile_due(at(secs), limit).await.expect("reconcile");
        for a in &applied {
            // What it returns is what it wrote.
            assert_eq!(read(s, a.task.id).await.as_ref(), Some(&a.task));
            assert_eq!(all_events(s, a.task.id).await.last(), a.events.last());
        }
        let summary: Vec<_> = applied
            .iter()
            .map(|a| (a.task.id, a.reconciled, a.task.state, kinds(&a.events)))
            .collect();
        summary
    };
    let expire = |id, reason| {
        let expired = vec![EventType::TaskExpired];
        (id, Some(Due::Expire(reason)), TaskState::Expired, expired)
    };

    let before = tasks().await;
    assert!(reconcile(9, 100).await.is_empty());
    assert_eq!(
        tasks().await,
        before,
        "nothing was due, yet something changed"
    );

    let unassigned = (
        assigned.id,
        Some(Due::Unassign),
        TaskState::Open,
        vec![EventType::TaskUnassigned],
    );
    let first = reconcile(2 + START_TIMEOUT, 100).await;
    let earliest_first = [expire(short.id, ExpiryReason::Lifetime), unassigned];
    assert_eq!(first, earliest_first);
    let again = reconcile(2 + START_TIMEOUT, 100).await;
    assert!(
        again.is_empty(),
        "a second pass at the same time repeated work"
    );
    // The reopened task is claimable again: active until 701.
    ok(s, assigned.id, claim(w), 100).await;
    ok(s, assigned.id, start(w), 101).await;

    let second = reconcile(3 + ACTIVE_LIMIT, 100).await;
    assert_eq!(second, [expire(active.id, ExpiryReason::ActiveTimeLimit)]);

    // At most `limit` per call, earliest deadline first, the rest in the
    // next call: the restarted task's active time limit (701) before the
    // lifetimes (3600) of the open task and the draft.
    let mut batches = Vec::new();
    for expected in [2, 1, 0] {
        let batch = reconcile(LIFETIME, 2).await;
        assert_eq!(batch.len(), expected);
        batches.push(batch);
    }
    let restarted = expire(assigned.id, ExpiryReason::ActiveTimeLimit);
    assert_eq!(batches[0][0], restarted);
    let mut rest = vec![batches[0][1].clone(), batches[1][0].clone()];
    rest.sort_by_key(|r| r.0);
    let mut lifetimes = vec![
        expire(open.id, ExpiryReason::Lifetime),
        expire(draft.id, ExpiryReason::Lifetime),
    ];
    lifetimes.sort_by_key(|r| r.0);
    assert_eq!(rest, lifetimes);

    assert_eq!(s.next_deadline().await.expect("next"), None);
    let cancelled = read(s, done.id).await.expect("task");
    assert_eq!(cancelled, before[4], "a terminal task was touched");
}

/// Sixty tasks come due at once, of all three kinds: open tasks at the end
/// of their lifetime, assigned ones past their start timeout, active ones
/// past their time limit with an issue still open.
async fn reconcile_due_clears_a_backlog_in_one_pass(store: Arc<dyn Store>) {
    let s = &*store;
    let mut open = BTreeSet::new();
    let mut assigned = BTreeSet::new();
    let mut active = BTreeSet::new();
    for _ in 0..20 {
        // Expires at 600.
        let task = create_at(s, 600 - LIFETIME, "open").await.task;
        ok(s, task.id, Command::Publish, 1).await;
        open.insert(task.id);
        // Start by 62.
        assigned.insert(task_in(s, TaskState::Assigned).await.0.id);
        // Active until 603, with an issue.
        let (task, w) = task_in(s, TaskState::Active).await;
        ok(s, task.id, raise(w, IssueKind::Other, "?"), 4).await;
        active.insert(task.id);
    }

    let swept = s.reconcile_due(at(700), 1000).await.expect("reconcile");
    assert_eq!(swept.len(), 60);
    let ids: BTreeSet<Uuid> = swept.iter().map(|a| a.task.id).collect();
    assert_eq!(ids.len(), 60, "a task was handled twice");
    for a in &swept {
        let id = a.task.id;
        let (due, state, kind) = if open.contains(&id) {
            let due = Due::Expire(ExpiryReason::Lifetime);
            (due, TaskState::Expired, EventType::TaskExpired)
        } else if assigned.contains(&id) {
            (Due::Unassign, TaskState::Open, EventType::TaskUnassigned)
        } else {
            assert!(active.contains(&id));
            let due = Due::Expire(ExpiryReason::ActiveTimeLimit);
            (due, TaskState::Expired, EventType::TaskExpired)
        };
        assert_eq!((a.reconciled, a.task.state), (Some(due), state));
        assert_eq!(kinds(&a.events), [kind]);
        assert_eq!(read(s, id).await.as_ref(), Some(&a.task));
        let feed = all_events(s, id).await;
        assert_eq!(feed.last(), a.events.last());
        assert_eq!(a.task.last_event_id, a.events[0].id);
        assert!(feed.windows(2).all(|p| p[0].id < p[1].id));
        if active.contains(&id) {
            assert_eq!(issue_statuses(s, id).await, [IssueStatus::Closed]);
            assert_eq!(a.task.open_issues, 0);
        }
    }
    // Only the reopened tasks are left, until their lifetime ends.
    assert!(
        s.reconcile_due(at(700), 1000)
            .await
            .expect("again")
            .is_empty()
    );
    let next = s.next_deadline().await.expect("next deadline");
    assert_eq!(next, Some(at(LIFETIME)));
}

async fn tasks_after_pages_every_task_by_id(store: Arc<dyn Store>) {
    let s = &*store;
    assert!(s.tasks_after(None, 10).await.expect("list").is_empty());
    let mut all = Vec::new();
    for state in [
        TaskState::Draft,
        TaskState::Open,
        TaskState::Assigned,
        TaskState::Active,
    ] {
        for _ in 0..3 {
            all.push(task_in(s, state).await.0);
        }
    }
    let ended = all[0].id;
    all[0] = ok(s, ended, cancel(), 10).await.task;
    all.sort_by_key(|t| t.id);

    let listed = every_page(5, |after| s.tasks_after(after, 5), |last| last.id).await;
    assert_eq!(
        listed, all,
        "every task, terminal ones too, by id, each once"
    );
    // `after` need not be the id of a task.
    let between = Uuid::from_u128(all[6].id.as_u128() + 1);
    let rest = s.tasks_after(Some(between), 100).await.expect("list");
    assert_eq!(rest, all[7..]);
}

async fn purge_removes_ended_tasks_with_their_data_only(store: Arc<dyn Store>) {
    let s = &*store;
    // Ended at 10, with events, an issue and a photo.
    let (old, w) = task_in(s, TaskState::Active).await;
    ok(s, old.id, raise(w, IssueKind::Other, "?"), 5).await;
    let old_photo = photo(50);
    ok(s, old.id, send_photo(w, &old_photo), 6).await;
    ok(s, old.id, complete(w, None), 10).await;
    // Ended at 20 and at 30.
    let (middle, _) = task_in(s, TaskState::Open).await;
    ok(s, middle.id, cancel(), 20).await;
    let (recent, _) = task_in(s, TaskState::Open).await;
    ok(s, recent.id, cancel(), 30).await;
    // Never ended, however old.
    let (active, aw) = task_in(s, TaskState::Active).await;
    ok(s, active.id, raise(aw, IssueKind::Other, "!"), 5).await;
    let kept_photo = photo(60);
    ok(s, active.id, send_photo(aw, &kept_photo), 6).await;
    let (draft, _) = task_in(s, TaskState::Draft).await;
    let active_before = snapshot(s, active.id).await;
    let draft_before = snapshot(s, draft.id).await;

    // Purged "now" = at the cutoff, so tombstones carry distinct times.
    let purge = move |cutoff, limit| async move {
        s.purge_ended_before(at(cutoff), at(cutoff), limit)
            .await
            .expect("purge")
    };
    let digest = move |id| async move { s.agent_token_hash(id).await.expect("read digest") };
    let digests = [
        digest(old.id).await,
        digest(middle.id).await,
        digest(recent.id).await,
    ];
    let gone = move |id, before: Option<TokenHash>| async move {
        assert_eq!(
            snapshot(s, id).await,
            (None, vec![], 0),
            "data outlived its task"
        );
        // A tombstone keeps the token's digest, so the agent learns that the
        // task is gone rather than that its token is wrong.
        assert!(before.is_some());
        assert_eq!(
            digest(id).await,
            before,
            "the digest did not outlive the task"
        );
    };

    // The cutoff is exclusive.
    assert_eq!(purge(10, 100).await, 0);
    assert!(read(s, old.id).await.is_some());
    // Oldest first, at most `limit`.
    assert_eq!(purge(25, 1).await, 1);
    gone(old.id, digests[0].clone()).await;
    let photo_left = s.photo(old.id, old_photo.id).await.expect("read");
    assert_eq!(photo_left, None, "the photo outlived its task");
    assert!(read(s, middle.id).await.is_some());
    assert_eq!(purge(25, 100).await, 1);
    gone(middle.id, digests[1].clone()).await;
    let recent_events = all_events(s, recent.id).await;
    assert_eq!(recent_events.len(), 2, "a task that ended later lost data");
    assert_eq!(purge(25, 100).await, 0);
    assert_eq!(purge(100 * LIFETIME, 100).await, 1);
    gone(recent.id, digests[2].clone()).await;

    assert_eq!(snapshot(s, active.id).await, active_before);
    assert_eq!(snapshot(s, draft.id).await, draft_before);
    let kept = s.photo(active.id, kept_photo.id).await.expect("read");
    assert_eq!(kept.expect("kept").bytes, kept_photo.bytes);
    let worker_left = s.worker_token_hash(w).await.expect("read");
    assert!(worker_left.is_some(), "workers are not purged");
    // The survivors carry on.
    ok(s, active.id, message(aw, "still here"), 7).await;

    // Tombstones are forgotten in turn, oldest first, the cutoff exclusive:
    // old and middle were purged at 25, recent at 100 * LIFETIME.
    let forget = move |cutoff, limit| async move {
        s.forget_purged_before(at(cutoff), limit)
            .await
            .expect("forget")
    };
    assert_eq!(forget(25, 100).await, 0);
    assert_eq!(forget(26, 1).await, 1);
    assert_eq!(forget(26, 100).await, 1);
    assert_eq!(forget(26, 100).await, 0);
    assert_eq!(digest(old.id).await, None, "the tombstone was kept");
    assert_eq!(digest(middle.id).await, None, "the tombstone was kept");
    assert_eq!(
        digest(recent.id).await,
        digests[2],
        "a newer tombstone went"
    );
}

/// The issues of a worker whose assignment lapsed close with it (in the
/// controller's batched write too), so no answer reaches the next worker;
/// and the reopening is findable as the start of the next worker's feed.
async fn a_lapsed_assignment_closes_its_issues(store: Arc<dyn Store>) {
    let s = &*store;
    let (t, w) = task_in(s, TaskState::Assigned).await;
    let issue = first_id(&ok(s, t.id, raise(w, IssueKind::AccessBlocked, "gate"), 3).await);
    assert_eq!(
        s.last_event_of_type(t.id, EventType::TaskUnassigned)
            .await
            .expect("read"),
        None
    );
    let applied = s
        .reconcile_due(at(2 + START_TIMEOUT), 10)
        .await
        .expect("unassign");
    assert_eq!(applied.len(), 1);
    let task = read(s, t.id).await.expect("kept");
    assert_eq!((task.state, task.open_issues), (TaskState::Open, 0));
    let issues = s.issues(t.id).await.expect("issues");
    assert_eq!(issues.len(), 1);
    assert_eq!(issues[0].status, IssueStatus::Closed);
    assert_eq!(issues[0].resolution.as_deref(), Some("assignment_lapsed"));
    assert_eq!(
        s.last_event_of_type(t.id, EventType::TaskUnassigned)
            .await
            .expect("read"),
        Some(applied[0].events[0].id)
    );
    let next = worker(s).await;
    ok(s, t.id, claim(next), 3 + START_TIMEOUT).await;
    refused(
        s,
        t.id,
        respond(issue, IssueAction::Clarify, Some("side door")),
        4 + START_TIMEOUT,
        Refusal::IssueNotOpen(issue, IssueStatus::Closed),
    )
    .await;
}

async fn changes_name_each_changed_task_in_order(store: Arc<dyn Store>) {
    let s = &*store;
    let mut changes = s.changes().await.expect("subscribe");
    let a = create(s).await;
    ok(s, a.id, Command::Publish, 1).await;
    let b = create(s).await;
    ok(s, b.id, cancel(), 2).await;
    // A refused command changes nothing, so it announces nothing.
    let finished = Refusal::Terminal {
        state: TaskState::Cancelled,
    };
    refused(s, b.id, Command::Publish, 3, finished).await;
    let d = create_at(s, 600 - LIFETIME, "short").await.task;
    assert_eq!(s.reconcile_due(at(600), 10).await.expect("expire").len(), 1);
    assert_eq!(
        s.purge_ended_before(at(3), at(3), 10).await.expect("purge"),
        1
    );

    // create, publish, create, cancel, create, expire, purge
    let want = [a.id, a.id, b.id, b.id, d.id, d.id, b.id];
    let mut got = Vec::new();
    for _ in want {
        let next = tokio::time::timeout(Duration::from_secs(10), changes.next()).await;
        match next {
            Ok(Some(Change::Task(id))) => got.push(id),
            Ok(Some(Change::Gap)) => panic!("a gap without any outage, after {got:?}"),
            Ok(Some(Change::Credential(id))) => panic!("no credential changed, yet {id} did"),
            Ok(None) => panic!("the change stream ended after {got:?}"),
            Err(_) => panic!("no change announced within 10s after {got:?}"),
        }
    }
    assert_eq!(got, want);
}

/// Creates that arrive together each land intact and are announced (the
/// PostgreSQL store writes concurrent creates as one statement).
async fn concurrent_creates_each_land_and_are_announced(store: Arc<dyn Store>) {
    const CREATES: usize = 120;
    let mut changes = store.changes().await.expect("subscribe");
    let jobs = (0..CREATES)
        .map(|i| {
            let store = Arc::clone(&store);
            // Text that array literals would have to quote.
            let description = format!("task {i}: {{\"a\", 'b'}}, \\ NULL ,");
            let job: BoxFuture<'static, (Created, String)> = Box::pin(async move {
                let created = create_at(&*store, i as i64, &description).await;
                (created, description)
            });
            job
        })
        .collect();
    let created = race(jobs).await;
    let mut want = BTreeSet::new();
    for (i, (c, description)) in created.iter().enumerate() {
        let task = read(&*store, c.task.id)
            .await
            .expect("created task reads back");
        assert_eq!(task.description, *description);
        assert_eq!(task.state, TaskState::Draft);
        assert_eq!(task.created_at, at(i as i64));
        assert_eq!(task.expires_at, at(i as i64 + LIFETIME));
        let digest = store
            .agent_token_hash(c.task.id)
            .await
            .expect("read digest")
            .expect("a digest");
        assert!(digest.verify(&c.token), "task {i}'s token does not verify");
        want.insert(c.task.id);
    }
    let mut announced = BTreeSet::new();
    while announced.len() < want.len() {
        match tokio::time::timeout(Duration::from_secs(10), changes.next()).await {
            Ok(Some(Change::Task(id))) => {
                announced.insert(id);
            }
            Ok(Some(Change::Gap)) => panic!("a gap without any outage"),
            Ok(Some(Change::Credential(id))) => panic!("no credential changed, yet {id} did"),
            Ok(None) => panic!("the change stream ended"),
            Err(_) => panic!(
                "{} of {CREATES} creates announced within 10s",
                announced.len()
            ),
        }
    }
    assert_eq!(announced, want);
}

/// A create that fails (its id is taken) fails alone: the creates written
/// with it land.
async fn a_failing_create_among_concurrent_ones_fails_alone(store: Arc<dyn Store>) {
    const CREATES: usize = 60;
    let taken = create(&*store).await.id;
    let jobs = (0..CREATES)
        .map(|i| {
            let store = Arc::clone(&store);
            let job: BoxFuture<'static, (Uuid, Result<Task, StoreError>)> = Box::pin(async move {
                let id = if i == CREATES / 2 {
                    taken
                } else {
                    Uuid::new_v4()
                };
                let new = NewTask::development(
                    id,
                    format!("task {i}"),
                    TokenHash::of(&token::generate("mst_")),
                    at(0),
                    at(LIFETIME),
                );
                (id, store.create_task(new).await)
            });
            job
        })
        .collect();
    let outcomes = race(jobs).await;
    let failed = keys_where(&outcomes, false);
    assert_eq!(failed, vec![taken], "only the create of a taken id fails");
    for (id, outcome) in &outcomes {
        if outcome.is_ok() {
            assert!(
                read(&*store, *id).await.is_some(),
                "acknowledged create {id} is missing"
            );
        }
    }
    let original = read(&*store, taken).await.expect("the first task is kept");
    assert_eq!(original.description, "water the plants");
}

// ---- concurrency ---------------------------------------------------------------------------

/// Runs the jobs at once, each on its own task, released together.
async fn race<T: Send + 'static>(jobs: Vec<BoxFuture<'static, T>>) -> Vec<T> {
    let barrier = Arc::new(tokio::sync::Barrier::new(jobs.len()));
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                job.await
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a racer panicked"));
    }
    out
}

/// The keys of the racers whose outcome succeeded (`true`) or failed
/// (`false`), in order.
fn keys_where<K: Copy, T, E>(outcomes: &[(K, Result<T, E>)], succeeded: bool) -> Vec<K> {
    outcomes
        .iter()
        .filter(|(_, outcome)| outcome.is_ok() == succeeded)
        .map(|(key, _)| *key)
        .collect()
}

type Outcome = Result<Applied, StoreError>;

async fn racing_claims_have_exactly_one_winner(store: Arc<dyn Store>) {
    const WORKERS: usize = 12;
    const ROUNDS: usize = 10;
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(worker(&*store).await);
    }
    for round in 0..ROUNDS {
        let (task, _) = task_in(&*store, TaskState::Open).await;
        let id = task.id;
        let jobs: Vec<BoxFuture<'static, (Uuid, Outcome)>> = workers
            .iter()
            .map(|&w| {
                let store = store.clone();
                let job = async move { (w, store.apply(id, claim(w), at(10)).await) };
                Box::pin(job) as BoxFuture<'static, _>
            })
            .collect();
        let results = race(jobs).await;

        let winners = keys_where(&results, true);
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let winner = winners[0];
        for (_, r) in &results {
            match r {
                Ok(a) => assert_eq!(a.task.worker_id, Some(winner)),
                Err(StoreError::Refused(refusal)) => {
                    let taken = wrong("claim", TaskState::Assigned);
                    assert_eq!(*refusal, taken, "round {round}")
                }
                Err(e) => panic!("round {round}: a losing claim failed with {e}"),
            }
        }
        let stored = read(&*store, id).await.expect("task");
        assert_eq!(stored.worker_id, Some(winner));
        let feed = all_events(&*store, id).await;
        let claimed = [EventType::TaskPublished, EventType::TaskAssigned];
        assert_eq!(kinds(&feed), claimed, "round {round}");
        assert_eq!(feed[1].data["worker_id"], json!(winner));
    }
}

/// Claims of many tasks at once, three workers racing for each, then every
/// winner's start and complete at once: writes to different tasks that
/// arrive together (which PostgreSQL writes in one statement) each get
/// their own outcome, a lost race takes no other write down, and every
/// task's feed is its own events in order.
async fn racing_claims_on_many_tasks_have_one_winner_each(store: Arc<dyn Store>) {
    const TASKS: usize = 16;
    let workers = [
        worker(&*store).await,
        worker(&*store).await,
        worker(&*store).await,
    ];
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        tasks.push(task_in(&*store, TaskState::Open).await.0.id);
    }
    let jobs: Vec<BoxFuture<'static, (Uuid, Uuid, Outcome)>> = tasks
        .iter()
        .flat_map(|&id| workers.iter().map(move |&w| (id, w)))
        .map(|(id, w)| {
            let store = store.clone();
            let job = async move { (id, w, store.apply(id, claim(w), at(10)).await) };
            Box::pin(job) as BoxFuture<'static, _>
        })
        .collect();
    let mut winners = std::collections::HashMap::new();
    for (id, w, outcome) in race(jobs).await {
        match outcome {
            Ok(a) => {
                assert_eq!((a.task.id, a.task.worker_id), (id, Some(w)));
                assert_eq!(kinds(&a.events), [EventType::TaskAssigned]);
                assert!(winners.insert(id, w).is_none(), "task {id}: two winners");
            }
            Err(StoreError::Refused(refusal)) => {
                assert_eq!(refusal, wrong("claim", TaskState::Assigned), "task {id}")
            }
            Err(e) => panic!("task {id}: a claim failed with {e}"),
        }
    }
    assert_eq!(winners.len(), TASKS, "every task has a winner");
    let done = |w| complete(w, None);
    for (command, secs) in [(start as fn(Uuid) -> Command, 11), (done, 12)] {
        let jobs: Vec<BoxFuture<'static, (Uuid, Outcome)>> = winners
            .iter()
            .map(|(&id, &w)| {
                let store = store.clone();
                let job = async move { (id, store.apply(id, command(w), at(secs)).await) };
                Box::pin(job) as BoxFuture<'static, _>
            })
            .collect();
        for (id, outcome) in race(jobs).await {
            let applied = outcome.unwrap_or_else(|e| panic!("task {id}: {e}"));
            assert_eq!(applied.task.id, id);
        }
    }
    for (&id, &w) in &winners {
        let stored = read(&*store, id).await.expect("task");
        assert_eq!(
            (stored.state, stored.worker_id),
            (TaskState::Completed, Some(w))
        );
        let feed = all_events(&*store, id).await;
        let expected = [
            EventType::TaskPublished,
            EventType::TaskAssigned,
            EventType::TaskStarted,
            EventType::TaskCompleted,
        ];
        assert_eq!(kinds(&feed), expected, "task {id}");
        assert!(feed.iter().all(|e| e.task_id == id), "task {id}: {feed:?}");
        assert!(
            feed.windows(2).all(|p| p[0].id < p[1].id),
            "task {id}: {feed:?}"
        );
        assert_eq!(stored.last_event_id, feed[3].id, "task {id}");
        assert_eq!(feed[1].data["worker_id"], json!(w));
    }
}

/// The assigned worker completes and stops, the agent cancels twice (directly
/// and by answering an issue), and the controller expires the task twice
/// (one command, one sweep), all at once: exactly one of them wins.
async fn racing_endings_leave_one_terminal_state_and_event(store: Arc<dyn Store>) {
    const ROUNDS: usize = 15;
    for round in 0..ROUNDS {
        let (task, w) = task_in(&*store, TaskState::Active).await;
        let id = task.id;
        let raised = ok(&*store, id, raise(w, IssueKind::Other, "?"), 5).await;
        let issue = first_id(&raised);
        let late = 3 + ACTIVE_LIMIT + 1;
        let commands = [
            (complete(w, None), 10),
            (stop(w, None), 10),
            (cancel(), 10),
            (respond(issue, IssueAction::Cancel, None), 10),
            (Command::Reconcile, late),
        ];
        type Sweep = Result<Vec<Applied>, StoreError>;
        let mut jobs: Vec<BoxFuture<'static, Sweep>> = commands
            .into_iter()
            .map(|(command, secs)| {
                let store = store.clone();
                let job = async move { store.apply(id, command, at(secs)).await.map(|a| vec![a]) };
                Box::pin(job) as BoxFuture<'static, _>
            })
            .collect();
        let controller = store.clone();
        jobs.push(Box::pin(async move {
            controller.reconcile_due(at(late), 10).await
        }));
        let results = race(jobs).await;

        let stored = read(&*store, id).await.expect("task");
        assert!(
            stored.state.is_terminal(),
            "round {round}: {}",
            stored.state
        );
        let mut wins = 0;
        for r in &results {
            match r {
                Ok(applied) => {
                    wins += applied.len();
                    for a in applied {
                        assert_eq!(
                            a.task, stored,
                            "round {round}: the winner's write is not the last"
                        );
                    }
                }
                Err(StoreError::Refused(Refusal::Terminal { state })) => {
                    assert_eq!(*state, stored.state, "round {round}")
                }
                Err(e) => panic!("round {round}: a losing ending failed with {e}"),
            }
        }
        assert_eq!(wins, 1, "round {round}: {results:?}");
        let feed = all_events(&*store, id).await;
        let terminal: Vec<_> = feed.iter().filter(|e| e.kind.is_terminal()).collect();
        assert_eq!(terminal.len(), 1, "round {round}: {:?}", kinds(&feed));
        assert_eq!(feed.last(), terminal.last().copied(), "round {round}");
        let issues = issue_statuses(&*store, id).await;
        assert_eq!(issues.len(), 1);
        assert_ne!(
            issues[0],
            IssueStatus::Open,
            "round {round}: issue left open"
        );
        assert_eq!(stored.open_issues, 0);
    }
}

async fn issue_statuses(store: &dyn Store, task: Uuid) -> Vec<IssueStatus> {
    let issues = store.issues(task).await.expect("issues");
    issues.into_iter().map(|i| i.status).collect()
}

/// Eight writers append to four tasks at once (two per task, so one task's
/// appends really race each other) while one poller per task follows its
/// feed with `after = the last id it saw`. Every poller must deliver exactly
/// the committed events of its task, ascending, none missed.
async fn pollers_see_every_event_of_concurrent_appenders(store: Arc<dyn Store>) {
    follow_concurrent_appenders(store, 4, 8, 200).await;
}

/// Sixteen connections of the assigned worker send messages to one task at
/// once while a poller follows it: on PostgreSQL most writes find that
/// another one committed since they read the task, so they decide again or
/// take the row lock (see `engine::Backend for PgStore`). Every acknowledged message is
/// in the feed exactly once, the feed ascends with nothing missed, and the
/// task's `last_event_id` is its newest event's id. (Some writes lose
/// their race several times and fall back to the row lock: with that
/// fallback replaced by an error, this case failed in each of three runs.)
async fn pollers_see_every_event_of_many_appenders_to_one_task(store: Arc<dyn Store>) {
    follow_concurrent_appenders(store, 1, 16, 40).await;
}

/// `writers` writers append `per_writer` messages each to `tasks` active
/// tasks (writer `n` to task `n % tasks`), while one poller per task
/// follows its feed with `after = the last id it saw`.
async fn follow_concurrent_appenders(
    store: Arc<dyn Store>,
    tasks: usize,
    writers: usize,
    per_writer: usize,
) {
    assert_eq!(writers % tasks, 0, "as many writers on every task");
    let per_task = writers / tasks * per_writer;
    let tasks = {
        let mut all = Vec::new();
        for _ in 0..tasks {
            all.push(task_in(&*store, TaskState::Active).await);
        }
        all
    };
    let done = Arc::new(AtomicBool::new(false));

    let pollers: Vec<_> = tasks
        .iter()
        .map(|(task, _)| {
            let (store, done, id) = (store.clone(), done.clone(), task.id);
            tokio::spawn(async move {
                let mut seen: Vec<Event> = Vec::new();
                let mut after = 0;
                loop {
                    // Read the flag before polling: a page that comes back
                    // empty after every writer finished ends the feed.
                    let finished = done.load(Ordering::SeqCst);
                    let page = store.events(id, after, 50).await.expect("poll");
                    if page.is_empty() {
                        if finished {
                            return seen;
                        }
                        tokio::task::yield_now().await;
                        continue;
                    }
                    for e in &page {
                        assert!(e.id > after, "a poll after {after} returned {}", e.id);
                        after = e.id;
                    }
                    seen.extend(page);
                }
            })
        })
        .collect();

    let writer_handles: Vec<_> = (0..writers)
        .map(|n| {
            let (task, w) = &tasks[n % tasks.len()];
            let (store, id, w) = (store.clone(), task.id, *w);
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..per_writer {
                    let text = format!("writer {n} message {i}");
                    let applied = store.apply(id, message(w, &text), at(10)).await;
                    let applied = applied.expect("append");
                    let [event] = &applied.events[..] else {
                        panic!("a message appends one event: {:?}", applied.events);
                    };
                    assert_eq!(event.data["text"], json!(text));
                    assert_eq!(applied.task.last_event_id, event.id);
                    ids.push(event.id);
                }
                ids
            })
        })
        .collect();
    let mut acknowledged: Vec<BTreeSet<i64>> = vec![BTreeSet::new(); tasks.len()];
    for (n, writer) in writer_handles.into_iter().enumerate() {
        let ids = writer.await.expect("a writer panicked");
        let task = n % tasks.len();
        let before = acknowledged[task].len();
        acknowledged[task].extend(&ids);
        assert_eq!(
            acknowledged[task].len(),
            before + ids.len(),
            "writer {n}: an event id acknowledged twice"
        );
    }
    done.store(true, Ordering::SeqCst);

    for (n, ((task, _), poller)) in tasks.iter().zip(pollers).enumerate() {
        let delivered = poller.await.expect("a poller panicked");
        let committed = all_events(&*store, task.id).await;
        assert_eq!(committed.len(), 3 + per_task);
        assert!(
            committed.windows(2).all(|w| w[0].id < w[1].id),
            "task {n}: the feed does not ascend"
        );
        let delivered_ids: BTreeSet<i64> = delivered.iter().map(|e| e.id).collect();
        let missed: Vec<i64> = committed
            .iter()
            .map(|e| e.id)
            .filter(|id| !delivered_ids.contains(id))
            .collect();
        assert!(missed.is_empty(), "task {n}: the poller missed {missed:?}");
        assert_eq!(
            delivered, committed,
            "task {n}: delivered differs from committed"
        );
        let messages: BTreeSet<i64> = committed
            .iter()
            .filter(|e| e.kind == EventType::WorkerMessage)
            .map(|e| e.id)
            .collect();
        assert_eq!(
            messages, acknowledged[n],
            "task {n}: committed is not acknowledged"
        );
        let stored = read(&*store, task.id).await.expect("task");
        assert_eq!(
            stored.last_event_id,
            committed.last().expect("events").id,
            "task {n}: last_event_id is not the newest event's"
        );
        // Each writer's messages are in the order it sent them.
        for writer in (0..writers).filter(|w| w % tasks.len() == n) {
            let prefix = format!("writer {writer} message ");
            let order: Vec<usize> = committed
                .iter()
                .filter_map(|e| e.data["text"].as_str()?.strip_prefix(&prefix)?.parse().ok())
                .collect();
            let sent: Vec<usize> = (0..per_writer).collect();
            assert_eq!(order, sent, "writer {writer}");
        }
    }
}

/// Two stores on one database, as two server processes (or a server and
/// the controller) are: each command acts on the task as the other left
/// it, whatever the store remembers of its own last write. (PostgreSQL's
/// `apply` first decides on its own copy of the task; a refusal from that
/// copy, or a write of a decision made on it after the task changed, would
/// fail these. Checked: answering the copy's refusal fails the first part,
/// writing without the `last_event_id` check fails the second.)
async fn commands_act_on_changes_made_through_another_store(db: &TestDb) {
    let (one, other) = (db.store(policy()).await, db.store(policy()).await);
    let (one, other) = (&*one, &*other);

    // `one` claimed (its copy: assigned), `other` started: `one`'s complete
    // is decided on the active task, not refused as "assigned".
    let (task, w) = task_in(one, TaskState::Assigned).await;
    ok(other, task.id, start(w), 4).await;
    let done = ok(one, task.id, complete(w, None), 5).await;
    assert_eq!(done.task.state, TaskState::Completed);
    assert_eq!(done.task.started_at, Some(at(4)));
    let feed = all_events(one, task.id).await;
    assert_eq!(
        kinds(&feed),
        [
            EventType::TaskPublished,
            EventType::TaskAssigned,
            EventType::TaskStarted,
            EventType::TaskCompleted
        ]
    );

    // `one` started it, `other` extended it: `one`'s message keeps the
    // extension.
    let (task, w) = task_in(one, TaskState::Active).await;
    let extended = at(2 * LIFETIME);
    ok(
        other,
        task.id,
        Command::Extend(Extension::Until(extended)),
        4,
    )
    .await;
    let sent = ok(one, task.id, message(w, "still here"), 5).await;
    assert_eq!(sent.task.expires_at, extended);
    let stored = read(other, task.id).await.expect("task");
    assert_eq!(stored, sent.task);
    assert_eq!(stored.last_event_id, sent.events[0].id);

    // `one` started it, `other` cancelled it: `one`'s complete is refused
    // and the task has one terminal event.
    let (task, w) = task_in(one, TaskState::Active).await;
    ok(other, task.id, cancel(), 4).await;
    let terminal = Refusal::Terminal {
        state: TaskState::Cancelled,
    };
    refused(one, task.id, complete(w, None), 5, terminal).await;

    // `one` published it, `other` gave it to a worker: `one`'s claim for
    // another worker is refused.
    let (task, _) = task_in(one, TaskState::Open).await;
    let (first, second) = (worker(one).await, worker(one).await);
    ok(other, task.id, claim(first), 4).await;
    refused(
        one,
        task.id,
        claim(second),
        5,
        wrong("claim", TaskState::Assigned),
    )
    .await;
    assert_eq!(
        read(one, task.id).await.expect("task").worker_id,
        Some(first)
    );
}

// ---- PostgreSQL: a command that meets a change committed after it read the task ----------

// On PostgreSQL, `apply` reads the task without a lock, decides, and writes
// with one statement that locks the row and writes only if the task is
// still as read; otherwise it reads and decides again (`engine::Backend for PgStore`).
// These cases make that retry happen for certain, rather than by a lucky
// interleaving: another transaction holds the task's row lock with a change
// written but not committed; the command reads the task as it was, its
// write waits for the lock (the test watches PostgreSQL say so), and only
// then is the change committed. The command must act on the task as
// changed. SQLite has one writer and reads the task inside its write
// transaction, so there is nothing to interleave there.
//
// Checked against deliberately broken versions of `PgStore::apply`, each
// of which fails these cases: a retry that writes the first (stale)
// decision again with the re-read task's state and last event id as its
// condition (the message case reverts the extension; the losing claim and
// the late complete are applied: two claims, two terminal events); a write
// conditional on the state alone, without `last_event_id` (the message
// case reverts the extension); and a write whose "nothing written" is
// taken as success or as an error (every case).

mod postgres_only {
    use meatspace_tests::{Db, TestDb};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_message_written_after_a_concurrent_extension_keeps_it() {
        let db = TestDb::new(Db::Postgres).await;
        super::a_message_written_after_a_concurrent_extension_keeps_it(&db).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_claim_that_meets_a_committed_claim_is_refused() {
        let db = TestDb::new(Db::Postgres).await;
        super::a_claim_that_meets_a_committed_claim_is_refused(&db).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_complete_that_meets_a_committed_cancel_is_refused() {
        let db = TestDb::new(Db::Postgres).await;
        super::a_complete_that_meets_a_committed_cancel_is_refused(&db).await;
    }
}

/// Another writer of task `id` in the middle of its transaction: it holds
/// the task's row lock and has written what the domain decides for
/// `command` at `secs` (events, issue closures, task row), uncommitted.
/// Raw SQL, so that the test chooses the moment it commits.
async fn another_writer_holding_the_lock(
    db: &TestDb,
    store: &dyn Store,
    id: Uuid,
    command: Command,
    secs: i64,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .expect("connect");
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await
        .expect("lock the task");
    let before = read(store, id).await.expect("task");
    let d = meatspace_domain::decide(
        &before,
        &meatspace_domain::Context::default(),
        command,
        at(secs),
        &policy(),
    )
    .expect("the other writer's command is accepted");
    let mut task = d.task;
    for e in &d.events {
        task.last_event_id = sqlx::query_scalar(
            "INSERT INTO events (task_id, type, actor, created_at, data) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(id)
        .bind(e.kind.as_str())
        .bind(e.actor.as_str())
        .bind(task.updated_at)
        .bind(&e.data)
        .fetch_one(&mut *tx)
        .await
        .expect("insert an event");
    }
    for change in d.issue_changes {
        let meatspace_domain::IssueChange::CloseAll { resolution } = change else {
            panic!("the other writer only closes issues: {change:?}");
        };
        sqlx::query(
            "UPDATE issues SET status = 'closed', resolution = $2, resolved_at = $3 \
             WHERE task_id = $1 AND status = 'open'",
        )
        .bind(id)
        .bind(resolution)
        .bind(task.updated_at)
        .execute(&mut *tx)
        .await
        .expect("close issues");
    }
    sqlx::query(
        "UPDATE tasks SET state = $2, worker_id = $3, updated_at = $4, published_at = $5, \
         assigned_at = $6, started_at = $7, ended_at = $8, start_by = $9, active_until = $10, \
         next_deadline = $11, open_issues = $12, last_event_id = $13, expires_at = $14 \
         WHERE id = $1",
    )
    .bind(id)
    .bind(task.state.as_str())
    .bind(task.worker_id)
    .bind(task.updated_at)
    .bind(task.published_at)
    .bind(task.assigned_at)
    .bind(task.started_at)
    .bind(task.ended_at)
    .bind(task.start_by)
    .bind(task.active_until)
    .bind(task.next_deadline())
    .bind(task.open_issues)
    .bind(task.last_event_id)
    .bind(task.expires_at)
    .execute(&mut *tx)
    .await
    .expect("update the task");
    tx
}

/// Runs `command` at `secs` on task `id` while `other` (which holds the
/// task's row lock, see [`another_writer_holding_the_lock`]) commits: the
/// command has read the task before the change, and the change commits
/// while its conditional write waits for the lock.
async fn apply_while_another_writer_commits(
    db: &TestDb,
    store: &Arc<dyn Store>,
    id: Uuid,
    command: Command,
    secs: i64,
    other: sqlx::Transaction<'static, sqlx::Postgres>,
) -> Outcome {
    let running = tokio::spawn({
        let store = store.clone();
        async move { store.apply(id, command, at(secs)).await }
    });
    // PostgreSQL's word that the command's one-statement write (not the
    // locking path's `SELECT … FOR UPDATE`, which would see the change
    // after the wait without any retry) waits for the lock, i.e. that it
    // read the task before the change.
    let watcher = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .expect("connect");
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE 'WITH r AS MATERIALIZED%'",
        )
        .fetch_one(&watcher)
        .await
        .expect("read pg_stat_activity");
        if waiting > 0 {
            break;
        }
        assert!(
            !running.is_finished(),
            "the command finished without waiting for the other writer's lock: {:?}",
            running.await
        );
        assert!(
            tokio::time::Instant::now() < give_up,
            "the command's write never waited for the lock"
        );
        // The interval of a bounded poll.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    other.commit().await.expect("the other writer commits");
    running.await.expect("the command panicked")
}

async fn a_message_written_after_a_concurrent_extension_keeps_it(db: &TestDb) {
    let store = db.store(policy()).await;
    let (task, w) = task_in(&*store, TaskState::Active).await;
    let id = task.id;
    let extended = at(2 * LIFETIME);
    let other = another_writer_holding_the_lock(
        db,
        &*store,
        id,
        Command::Extend(Extension::Until(extended)),
        9,
    )
    .await;
    let applied = apply_while_another_writer_commits(
        db,
        &store,
        id,
        message(w, "sent while the agent extended the task"),
        10,
        other,
    )
    .await
    .expect("the message is accepted after the extension");

    // A write of the decision made before the extension would put the old
    // deadline back.
    assert_eq!(applied.task.expires_at, extended);
    let stored = read(&*store, id).await.expect("task");
    assert_eq!(stored, applied.task);
    let feed = all_events(&*store, id).await;
    assert_eq!(
        kinds(&feed[feed.len() - 2..]),
        [EventType::TaskExtended, EventType::WorkerMessage]
    );
    assert_eq!(applied.events, feed[feed.len() - 1..]);
    assert_eq!(stored.last_event_id, feed.last().expect("events").id);
}

async fn a_claim_that_meets_a_committed_claim_is_refused(db: &TestDb) {
    let store = db.store(policy()).await;
    let (task, _) = task_in(&*store, TaskState::Open).await;
    let id = task.id;
    let (first, second) = (worker(&*store).await, worker(&*store).await);
    let other = another_writer_holding_the_lock(db, &*store, id, claim(first), 9).await;
    let outcome =
        apply_while_another_writer_commits(db, &store, id, claim(second), 10, other).await;

    match outcome {
        Err(StoreError::Refused(r)) => assert_eq!(r, wrong("claim", TaskState::Assigned)),
        other => panic!("the second claim must be refused, got {other:?}"),
    }
    let stored = read(&*store, id).await.expect("task");
    assert_eq!(stored.worker_id, Some(first));
    let feed = all_events(&*store, id).await;
    assert_eq!(
        kinds(&feed),
        [EventType::TaskPublished, EventType::TaskAssigned]
    );
    assert_eq!(feed[1].data["worker_id"], json!(first));
    assert_eq!(stored.last_event_id, feed[1].id);
}

async fn a_complete_that_meets_a_committed_cancel_is_refused(db: &TestDb) {
    let store = db.store(policy()).await;
    let (task, w) = task_in(&*store, TaskState::Active).await;
    let id = task.id;
    let other = another_writer_holding_the_lock(db, &*store, id, cancel(), 9).await;
    let outcome =
        apply_while_another_writer_commits(db, &store, id, complete(w, Some("done")), 10, other)
            .await;

    match outcome {
        Err(StoreError::Refused(r)) => assert_eq!(
            r,
            Refusal::Terminal {
                state: TaskState::Cancelled
            }
        ),
        other => panic!("the complete must be refused, got {other:?}"),
    }
    let stored = read(&*store, id).await.expect("task");
    assert_eq!(stored.state, TaskState::Cancelled);
    let feed = all_events(&*store, id).await;
    let terminal: Vec<EventType> = feed
        .iter()
        .filter(|e| e.kind.is_terminal())
        .map(|e| e.kind)
        .collect();
    assert_eq!(terminal, [EventType::TaskCancelled]);
    assert_eq!(stored.last_event_id, feed.last().expect("events").id);
}

// ---- worker web app: invites, sessions, task lists ---------------------------------

async fn invites_work_once_and_expire(store: Arc<dyn Store>) {
    let s = &*store;
    let code = token::generate("msi_");
    let id = Uuid::new_v4();
    new_invite(s, id, &code, 0, 100).await;
    let stored = s.invite(id).await.expect("read").expect("stored");
    assert!(stored.code_hash.verify(&code) && !stored.code_hash.verify("msi_other"));
    let invite = stored.invite;
    assert_eq!(
        (invite.created_at, invite.expires_at, invite.used_at),
        (at(0), at(100), None)
    );
    assert_eq!(s.invite(Uuid::new_v4()).await.expect("read"), None);

    let grace = Uuid::new_v4();
    let worker = s
        .redeem_invite(id, grace, "Grace", TokenHash::of("msw_g"), at(10))
        .await
        .expect("redeem")
        .expect("the first redemption works");
    assert_eq!(
        (worker.id, worker.name.as_str(), worker.created_at),
        (grace, "Grace", at(10))
    );
    assert!(s.worker_token_hash(grace).await.expect("read").is_some());
    assert_eq!(
        s.invite(id)
            .await
            .expect("read")
            .expect("kept")
            .invite
            .used_at,
        Some(at(10))
    );

    // Used: a second redemption creates nobody.
    let eve = Uuid::new_v4();
    // Eve redeeming `invite` at `secs`.
    let redeem_as_eve = async |invite: Uuid, secs: i64| {
        s.redeem_invite(invite, eve, "Eve", TokenHash::of("msw_e"), at(secs))
            .await
            .expect("redeem")
    };
    assert_eq!(redeem_as_eve(id, 11).await, None);
    assert_eq!(s.worker_token_hash(eve).await.expect("read"), None);

    // Expired at its deadline, and unknown invites redeem nothing.
    let late = Uuid::new_v4();
    new_invite(s, late, "msi_late", 0, 100).await;
    assert_eq!(redeem_as_eve(late, 100).await, None);
    assert_eq!(redeem_as_eve(Uuid::new_v4(), 1).await, None);
    assert_eq!(s.worker_token_hash(eve).await.expect("read"), None);
}

async fn racing_invite_redemptions_have_one_winner(store: Arc<dyn Store>) {
    let id = Uuid::new_v4();
    new_invite(&*store, id, "msi_race", 0, 100).await;
    let racers = (0..8).map(|i| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store
                .redeem_invite(
                    id,
                    Uuid::new_v4(),
                    &format!("racer {i}"),
                    TokenHash::of("w"),
                    at(1),
                )
                .await
                .expect("redeem")
        })
    });
    let winners: Vec<_> = futures::future::join_all(racers)
        .await
        .into_iter()
        .filter_map(|r| r.expect("racer panicked"))
        .collect();
    assert_eq!(winners.len(), 1, "{winners:?}");
}

async fn sessions_read_back_until_they_expire_or_end(store: Arc<dyn Store>) {
    let s = &*store;
    let (worker, _) = worker_with_token(s).await;
    let id = Uuid::new_v4();
    let secret = token::generate("mss_");
    s.create_session(id, worker, TokenHash::of(&secret), at(0), at(100))
        .await
        .expect("create session");
    let session = s.session(id, at(99)).await.expect("read").expect("live");
    assert_eq!(
        (session.id, session.worker.id, session.worker.name.as_str()),
        (id, worker, "Ada")
    );
    assert_eq!(session.expires_at, at(100));
    assert!(session.secret_hash.verify(&secret) && !session.secret_hash.verify("mss_x"));
    assert_eq!(s.session(id, at(100)).await.expect("read"), None, "expired");
    assert_eq!(s.session(Uuid::new_v4(), at(1)).await.expect("read"), None);

    assert!(s.delete_session(id).await.expect("delete"));
    assert_eq!(s.session(id, at(1)).await.expect("read"), None, "ended");
    assert!(!s.delete_session(id).await.expect("delete again"));
}

async fn unusable_sign_ins_are_purged_and_usable_ones_kept(store: Arc<dyn Store>) {
    let s = &*store;
    let (worker, _) = worker_with_token(s).await;
    // Sessions: one expired at 50, one live until 500.
    let (expired, live) = (Uuid::new_v4(), Uuid::new_v4());
    s.create_session(expired, worker, TokenHash::of("mss_a"), at(0), at(50))
        .await
        .unwrap();
    s.create_session(live, worker, TokenHash::of("mss_b"), at(0), at(500))
        .await
        .unwrap();
    // Invites: used, expired, revoked, and one still open.
    let (used, lapsed, open) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let revoked = Uuid::new_v4();
    for (id, until) in [(used, 500), (lapsed, 50), (open, 500), (revoked, 500)] {
        new_invite(s, id, &format!("msi_{id}"), 0, until).await;
    }
    s.redeem_invite(
        used,
        Uuid::new_v4(),
        "Grace",
        TokenHash::of("msw_g"),
        at(10),
    )
    .await
    .unwrap()
    .expect("redeemed");
    let revocation = meatspace_store::NewAudit {
        action: meatspace_domain::identity::AuditAction::InviteRevoked,
        ..invite_audit(revoked, at(5))
    };
    let gone = s
        .revoke_invite(revoked, revocation)
        .await
        .unwrap()
        .expect("the invite");
    assert_eq!(gone.revoked_at, Some(at(5)));
    // A revoked invite signs nobody up.
    assert!(
        s.redeem_invite(
            revoked,
            Uuid::new_v4(),
            "Eve",
            TokenHash::of("msw_e"),
            at(6)
        )
        .await
        .unwrap()
        .is_none()
    );

    // Nothing is due at 40 but the used and the revoked invite; at 100, in
    // batches of one, the rest goes and nothing usable does.
    assert_eq!(s.purge_sign_ins(at(40), 10).await.unwrap(), 2);
    assert_eq!(s.invite(used).await.unwrap(), None);
    assert_eq!(s.invite(revoked).await.unwrap(), None);
    let mut purged = 0;
    loop {
        let n = s.purge_sign_ins(at(100), 1).await.unwrap();
        assert!(n <= 2, "a batch of one per table");
        purged += n;
        if n == 0 {
            break;
        }
    }
    assert_eq!(purged, 2);
    assert_eq!(s.invite(lapsed).await.unwrap(), None);
    assert!(
        s.invite(open).await.unwrap().is_some(),
        "an open invite went"
    );
    assert!(
        s.session(live, at(100)).await.unwrap().is_some(),
        "a live session went"
    );
    assert_eq!(
        s.session(expired, at(0)).await.unwrap(),
        None,
        "the expired one stays"
    );
    assert!(!s.delete_session(expired).await.unwrap());
}

async fn events_are_counted_up_to_a_bound(store: Arc<dyn Store>) {
    let s = &*store;
    let t = create_at(s, 0, "count me").await;
    ok(s, t.task.id, Command::Publish, 1).await;
    let w = worker(s).await;
    ok(s, t.task.id, Command::Claim { worker: w }, 2).await;
    for i in 0..5 {
        let text = format!("message {i}");
        ok(s, t.task.id, Command::Message { worker: w, text }, 3).await;
    }
    // published, assigned and five messages.
    assert_eq!(s.count_events(t.task.id, 100).await.unwrap(), 7);
    assert_eq!(s.count_events(t.task.id, 3).await.unwrap(), 3, "bounded");
    assert_eq!(s.count_events(Uuid::new_v4(), 100).await.unwrap(), 0);
}

/// The ids of `tasks`, in order.
fn ids_of(tasks: Vec<Task>) -> Vec<Uuid> {
    tasks.iter().map(|t| t.id).collect()
}

async fn worker_tasks_and_newest_open_tasks(store: Arc<dyn Store>) {
    let s = &*store;
    let w = worker(s).await;
    let other = worker(s).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let t = create_at(s, i, &format!("task {i}")).await;
        ok(s, t.task.id, Command::Publish, i).await;
        ids.push(t.task.id);
    }
    let newest = ids_of(s.newest_open_tasks(10).await.expect("list"));
    assert_eq!(newest, [ids[3], ids[2], ids[1], ids[0]]);
    assert_eq!(s.newest_open_tasks(2).await.expect("list").len(), 2);

    ok(s, ids[1], claim(w), 10).await;
    ok(s, ids[2], claim(w), 11).await;
    ok(s, ids[3], claim(other), 12).await;
    ok(s, ids[1], start(w), 13).await;
    let open = ids_of(s.newest_open_tasks(10).await.expect("list"));
    assert_eq!(open, [ids[0]], "claimed tasks are no longer open");
    let mine = ids_of(s.worker_tasks(w, 10).await.expect("list"));
    assert_eq!(mine, [ids[1], ids[2]], "most recently changed first");
    assert_eq!(s.worker_tasks(w, 1).await.expect("list").len(), 1);
    assert!(
        s.worker_tasks(Uuid::new_v4(), 10)
            .await
            .expect("list")
            .is_empty()
    );
}

// ---- audited actions ----------------------------------------------------------------

/// Runs `sql` (one or more statements) on the test's database, beside the
/// store: for a trigger that makes a write fail.
async fn raw_sql(db: &TestDb, sql: &str) {
    use sqlx::Connection;
    if db.url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(&db.url)
            .await
            .expect("connect");
        sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
    } else {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
        sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
    }
}

/// A trigger that fails every insert into `table` (whose rows match
/// `when`, an SQL condition on `NEW`), named `name`.
fn refuse_inserts(db: &TestDb, name: &str, table: &str, when: &str) -> String {
    if db.url.starts_with("sqlite:") {
        format!(
            "CREATE TRIGGER {name} BEFORE INSERT ON {table} WHEN {when} \
             BEGIN SELECT RAISE(ABORT, '{name}'); END;"
        )
    } else {
        format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION '{name}'; END $$; \
             CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW WHEN ({when}) \
             EXECUTE FUNCTION {name}();"
        )
    }
}

fn drop_refusal(db: &TestDb, name: &str, table: &str) -> String {
    if db.url.starts_with("sqlite:") {
        format!("DROP TRIGGER {name};")
    } else {
        format!("DROP TRIGGER {name} ON {table}; DROP FUNCTION {name}();")
    }
}

fn operator_audit(
    action: meatspace_domain::identity::AuditAction,
    target: String,
    secs: i64,
) -> meatspace_store::NewAudit {
    meatspace_store::NewAudit {
        at: at(secs),
        principal_id: OPERATOR,
        action,
        target,
        address: Some("127.0.0.1".into()),
        detail: None,
    }
}

const OPERATOR: Uuid = Uuid::from_u128(0x0e0e_0e0e);

async fn audit_targets(store: &dyn Store) -> Vec<String> {
    let filter = meatspace_store::AuditFilter {
        principal: Some(OPERATOR),
        action: None,
        target: None,
        since: None,
        until: None,
        before: None,
        limit: 100,
    };
    let entries = store.audit(&filter).await.expect("audit");
    entries.into_iter().map(|e| e.target).collect()
}

/// An operator's cancel of a task it does not own and its audit row are
/// one transaction: when the audit row cannot be written, the task is not
/// cancelled; when it can, both are there.
async fn an_audited_action_commits_with_its_audit_row_or_not_at_all(db: &TestDb) {
    let store = db.store(policy()).await;
    let s = &*store;
    let (task, _) = task_in(s, TaskState::Open).await;
    let by = meatspace_domain::identity::ActedBy::ApiKey {
        principal_id: OPERATOR,
        key_id: Uuid::from_u128(7),
    };
    let cancelled_by_operator = || {
        operator_audit(
            meatspace_domain::identity::AuditAction::TaskCancelledByOperator,
            format!("task:{}", task.id),
            5,
        )
    };

    raw_sql(db, &refuse_inserts(db, "refuse_audit", "audit", "1 = 1")).await;
    let before = snapshot(s, task.id).await;
    let failed = s
        .apply_audited(task.id, cancel(), by, cancelled_by_operator())
        .await;
    assert!(
        matches!(failed, Err(StoreError::Database(_))),
        "the audit row's failure fails the cancel: {failed:?}"
    );
    assert_eq!(
        snapshot(s, task.id).await,
        before,
        "nothing of the cancel is left when its audit row failed"
    );
    assert_eq!(audit_targets(s).await, Vec::<String>::new());

    raw_sql(db, &drop_refusal(db, "refuse_audit", "audit")).await;
    let done = s
        .apply_audited(task.id, cancel(), by, cancelled_by_operator())
        .await
        .expect("the cancel");
    assert_eq!(done.task.state, TaskState::Cancelled);
    assert_eq!(
        done.task.ended_at,
        Some(at(5)),
        "the audit row's time is the command's"
    );
    assert_eq!(done.events[0].data["by"]["principal_id"], json!(OPERATOR));
    assert_eq!(audit_targets(s).await, [format!("task:{}", task.id)]);
}

/// Suspending a worker releases the tasks it holds in the suspension's own
/// transaction: a release that cannot be written leaves the worker
/// unsuspended and its task held, never a suspended worker still holding it.
async fn suspending_a_worker_releases_its_tasks_in_the_same_transaction(db: &TestDb) {
    let store = db.store(policy()).await;
    let s = &*store;
    let (assigned, w) = task_in(s, TaskState::Assigned).await;
    let suspension = || {
        operator_audit(
            meatspace_domain::identity::AuditAction::WorkerSuspended,
            format!("worker:{w}"),
            5,
        )
    };

    let release = refuse_inserts(
        db,
        "refuse_release",
        "events",
        "NEW.type = 'task.unassigned'",
    );
    raw_sql(db, &release).await;
    let before = snapshot(s, assigned.id).await;
    let failed = s.suspend_worker(w, suspension()).await;
    assert!(
        matches!(failed, Err(StoreError::Database(_))),
        "the release's failure fails the suspension: {failed:?}"
    );
    assert_eq!(snapshot(s, assigned.id).await, before);
    let worker = s.worker(w).await.expect("worker").expect("it exists");
    assert_eq!(worker.suspended_at, None, "the suspension rolled back");
    assert_eq!(audit_targets(s).await, Vec::<String>::new());

    raw_sql(db, &drop_refusal(db, "refuse_release", "events")).await;
    let worker = s
        .suspend_worker(w, suspension())
        .await
        .expect("suspend")
        .expect("the worker exists");
    assert_eq!(worker.suspended_at, Some(at(5)));
    let task = read(s, assigned.id).await.expect("task");
    assert_eq!(task.state, TaskState::Open);
    assert_eq!(task.worker_id, None);
    let last = all_events(s, assigned.id).await.pop().expect("an event");
    assert_eq!(last.kind, EventType::TaskUnassigned);
    assert_eq!(last.data["reason"], "worker_suspended");
    assert_eq!(audit_targets(s).await, [format!("worker:{w}")]);
    assert_eq!(
        s.suspend_worker(Uuid::new_v4(), suspension())
            .await
            .expect("suspend"),
        None,
        "no such worker"
    );
}

// ---- notifications ------------------------------------------------------------------

async fn notification_causes_are_recorded_with_their_events_and_fanned_out_once(
    store: Arc<dyn Store>,
) {
    use meatspace_domain::notify::{Area, Cause, Channel, Preferences};
    use meatspace_store::notify::{NewNotification, NotificationOutcome};
    let s = &*store;
    // Publishing records one cause; a message records none.
    let (task, worker) = task_in(s, TaskState::Active).await;
    ok(s, task.id, message(worker, "on my way"), 4).await;
    let causes = s.claim_causes(at(5), at(65), 10).await.unwrap();
    let kinds: Vec<EventType> = causes.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, vec![EventType::TaskPublished]);
    assert_eq!(causes[0].task_id, task.id);
    // Leased: a second controller gets nothing until the lease ends.
    assert!(s.claim_causes(at(6), at(66), 10).await.unwrap().is_empty());
    assert_eq!(s.claim_causes(at(65), at(125), 10).await.unwrap().len(), 1);

    // A worker who asked for new tasks in an area is a listener.
    let prefs = Preferences {
        area: Some(Area {
            latitude: 52.5,
            longitude: 13.4,
            radius_m: 5_000,
        }),
        new_tasks: true,
        my_tasks: true,
        email: Some("ada@example.org".into()),
    };
    assert!(s.set_preferences(worker, &prefs, at(5)).await.unwrap());
    assert_eq!(s.preferences(worker).await.unwrap(), Some(prefs.clone()));
    let listeners = s.listeners(None, 10).await.unwrap();
    assert_eq!(listeners.len(), 1);
    assert_eq!(listeners[0].preferences, prefs);
    assert!(!listeners[0].has_push);
    assert!(s.listeners(Some(worker), 10).await.unwrap().is_empty());

    // Fanning out twice makes the notification once; the cause leaves.
    let n = NewNotification {
        worker_id: worker,
        cause_key: Cause::Published.key(task.id, None),
        cause: Cause::Published,
        task_id: task.id,
        channel: Channel::Email,
    };
    let id = causes[0].event_id;
    assert_eq!(
        s.fan_out(Some(id), std::slice::from_ref(&n), Some(worker), at(70))
            .await
            .unwrap(),
        1
    );
    assert_eq!(s.fan_out(Some(id), &[n], None, at(71)).await.unwrap(), 0);
    assert!(
        s.claim_causes(at(1000), at(1060), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let backlog = s.notification_backlog().await.unwrap();
    assert_eq!((backlog.causes, backlog.notifications), (0, 1));
    assert_eq!(backlog.oldest, Some(at(70)));

    // Due, leased, retried, sent and counted.
    let due = s
        .claim_due_notifications(at(80), at(140), 10)
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(
        (due[0].worker_id, due[0].cause, due[0].attempts),
        (worker, Cause::Published, 0)
    );
    assert!(
        s.claim_due_notifications(at(81), at(141), 10)
            .await
            .unwrap()
            .is_empty()
    );
    s.record_notification(due[0].id, NotificationOutcome::Retry(at(90)), at(80))
        .await
        .unwrap();
    assert_eq!(s.next_notification_work().await.unwrap(), Some(at(90)));
    let again = s
        .claim_due_notifications(at(90), at(150), 10)
        .await
        .unwrap();
    assert_eq!(again[0].attempts, 1);
    s.record_notification(again[0].id, NotificationOutcome::Sent, at(91))
        .await
        .unwrap();
    assert_eq!(
        s.sent_since(worker, Channel::Email, at(31)).await.unwrap(),
        1
    );
    assert_eq!(
        s.sent_since(worker, Channel::Push, at(31)).await.unwrap(),
        0
    );
    assert_eq!(s.notification_backlog().await.unwrap(), Default::default());

    // Unsubscribing from email forgets the address and withdraws what waits.
    let lapse = NewNotification {
        worker_id: worker,
        cause_key: Cause::Lapsing.key(task.id, Some(at(603).timestamp_millis())),
        cause: Cause::Lapsing,
        task_id: task.id,
        channel: Channel::Email,
    };
    assert_eq!(s.fan_out(None, &[lapse], None, at(100)).await.unwrap(), 1);
    s.unsubscribe(worker, Channel::Email, at(101))
        .await
        .unwrap();
    assert_eq!(s.preferences(worker).await.unwrap().unwrap().email, None);
    assert!(
        s.claim_due_notifications(at(200), at(260), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // The active task lapses at 603: found from 543 with a minute's notice.
    let lapsing = s.lapsing(at(543), at(603), 10).await.unwrap();
    assert_eq!(lapsing.len(), 1);
    assert_eq!(
        (lapsing[0].task_id, lapsing[0].worker_id, lapsing[0].at),
        (task.id, worker, at(603))
    );
    assert!(s.lapsing(at(400), at(500), 10).await.unwrap().is_empty());

    // Push subscriptions: added, renewed, removed by the push service.
    let sub = meatspace_store::notify::PushSubscription {
        endpoint: "https://push.example/one".into(),
        p256dh: "key".into(),
        auth: "auth".into(),
    };
    s.add_push_subscription(worker, &sub, at(5)).await.unwrap();
    s.add_push_subscription(worker, &sub, at(6)).await.unwrap();
    assert_eq!(
        s.push_subscriptions(worker).await.unwrap(),
        vec![sub.clone()]
    );
    assert!(s.listeners(None, 10).await.unwrap()[0].has_push);
    assert!(
        s.remove_push_subscription(None, &sub.endpoint)
            .await
            .unwrap()
    );
    assert!(
        !s.remove_push_subscription(None, &sub.endpoint)
            .await
            .unwrap()
    );
}

// ---- the operator console ------------------------------------------------------------

async fn console_sessions_and_overview_counts(store: Arc<dyn Store>) {
    use meatspace_store::console::ConsoleSession;
    let s = &*store;
    let session = ConsoleSession {
        id: Uuid::new_v4(),
        secret_hash: TokenHash::of("mss_secret"),
        key_id: Some(Uuid::new_v4()),
        key_digest: Some(TokenHash::of("msk_key")),
        principal_id: Uuid::new_v4(),
        created_at: at(0),
        last_seen_at: at(0),
        expires_at: at(3600),
    };
    s.create_console_session(&session).await.unwrap();
    assert_eq!(
        s.console_session(session.id, at(10)).await.unwrap(),
        Some(session.clone())
    );
    s.touch_console_session(session.id, at(20)).await.unwrap();
    s.touch_console_session(session.id, at(15)).await.unwrap();
    let touched = s
        .console_session(session.id, at(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(touched.last_seen_at, at(20), "activity only moves forward");
    assert_eq!(s.console_session(session.id, at(3600)).await.unwrap(), None);
    assert_eq!(s.purge_console_sessions(at(3600), 10).await.unwrap(), 1);
    let ended = ConsoleSession {
        id: Uuid::new_v4(),
        ..session
    };
    s.create_console_session(&ended).await.unwrap();
    s.end_console_session(ended.id).await.unwrap();
    assert_eq!(s.console_session(ended.id, at(10)).await.unwrap(), None);

    // One task completed at 5, one published at 11, one draft two hours on.
    let (done, worker) = task_in(s, TaskState::Active).await;
    ok(s, done.id, complete(worker, None), 5).await;
    let open = create_at(s, 10, "open one").await.task;
    ok(s, open.id, Command::Publish, 11).await;
    create_at(s, 7200, "a draft, later").await;
    let counts = s.task_counts().await.unwrap();
    assert_eq!(
        counts,
        vec![
            (TaskState::Draft, 1),
            (TaskState::Open, 1),
            (TaskState::Completed, 1)
        ]
    );
    assert_eq!(
        s.oldest_open_task().await.unwrap().map(|t| t.id),
        Some(open.id)
    );
    let hours = s.tasks_per_hour(at(0) - TimeDelta::hours(1)).await.unwrap();
    let created: u64 = hours.iter().map(|h| h.created).sum();
    let completed: u64 = hours.iter().map(|h| h.completed).sum();
    assert_eq!((created, completed), (3, 1));
    assert!(
        hours.iter().all(|h| h.hour.timestamp() % 3600 == 0),
        "{hours:?}"
    );
    assert!(hours.windows(2).all(|w| w[0].hour < w[1].hour));

    // A submission waiting for review counts in the health.
    assert_eq!(s.health().await.unwrap().reviews_waiting, 0);
    let (reviewed, worker) = reviewed_and_active(s).await;
    let submit = Command::Complete {
        worker,
        note: None,
        result: Some(json!({ "ok": true })),
    };
    ok(s, reviewed.id, submit, 20).await;
    let health = s.health().await.unwrap();
    assert_eq!(
        (
            health.reviews_waiting,
            health.webhooks_failing,
            health.webhooks_disabled
        ),
        (1, 0, 0)
    );
}
