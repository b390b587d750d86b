//! Identity and access, against the real server on both
//! backends: each agent's key sees and drives only its principal's tasks
//! (404 for the others', so ids cannot be probed), scopes bound what a key
//! does, rotation keeps the old secret for its grace period only, an
//! operator suspends a worker (signed out, its task reopens), every
//! privileged action lands in the audit trail, a revocation reaches a
//! second replica on the same PostgreSQL at once, memory answers included,
//! and the development key, turned off, is refused with a way forward.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use meatspace_tests::server::{
    DEV_KEY_HEADER, Expect, PROBLEM_TYPE_BASE, ServerOptions, TestServer, array_at, str_at,
    task_and_token, uuid_at, web,
};
use meatspace_tests::{Db, TestDb, eventually};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

meatspace_tests::api_tests!(
    agents_see_list_and_drive_only_their_own_tasks,
    scopes_bound_what_a_key_does,
    a_rotated_secret_works_for_its_grace_period_only,
    a_suspended_worker_is_signed_out_and_its_task_reopens,
    every_privileged_action_is_audited_with_its_principal,
    the_dev_key_turned_off_is_refused_with_a_way_forward,
    keys_are_stored_only_as_digests,
);

/// A key made by the development principal (an operator).
struct Key {
    id: Uuid,
    secret: String,
    principal: Uuid,
}

async fn create_key(srv: &TestServer, body: Value) -> Key {
    let made = srv
        .dev(Method::POST, "/api/v1/keys")
        .json(&body)
        .expect_json(StatusCode::CREATED)
        .await;
    Key {
        id: uuid_at(&made, "/key/id"),
        secret: str_at(&made, "/secret"),
        principal: uuid_at(&made, "/key/principal/id"),
    }
}

async fn agent_key(srv: &TestServer, name: &str) -> Key {
    create_key(srv, json!({ "name": name })).await
}

async fn operator_key(srv: &TestServer, name: &str) -> Key {
    create_key(srv, json!({ "name": name, "kind": "operator" })).await
}

/// Creates a task with `key`; returns its id and agent token.
async fn create_with(srv: &TestServer, key: &str, description: &str) -> (Uuid, String) {
    let made = srv
        .agent(key)
        .post("/api/v1/tasks")
        .json(&json!({ "description": description }))
        .expect_json(StatusCode::CREATED)
        .await;
    task_and_token(&made)
}

/// The `previous_valid_until` of a rotation's answer, as a time.
fn valid_until(rotated: &Value) -> DateTime<Utc> {
    let text = str_at(rotated, "/key/previous_valid_until");
    DateTime::parse_from_rfc3339(&text)
        .unwrap_or_else(|e| panic!("previous_valid_until {text:?}: {e}"))
        .with_timezone(&Utc)
}

fn slug(problem: &Value) -> String {
    str_at(problem, "/type")
        .trim_start_matches(PROBLEM_TYPE_BASE)
        .to_owned()
}

fn task_ids(page: &Value) -> Vec<Uuid> {
    array_at(page, "/tasks")
        .iter()
        .map(|t| uuid_at(t, "/id"))
        .collect()
}

async fn agents_see_list_and_drive_only_their_own_tasks(db: Db) {
    let srv = TestServer::start(db).await;
    let (a, b) = (
        agent_key(&srv, "agent a").await,
        agent_key(&srv, "agent b").await,
    );
    let (task_a, token_a) = create_with(&srv, &a.secret, "A's errand").await;
    let (task_b, _) = create_with(&srv, &b.secret, "B's errand").await;

    // The owner's key drives its task without the task token.
    srv.agent_post(task_a, &a.secret, "publish").await;
    let got = srv
        .agent(&a.secret)
        .get_json(&format!("/api/v1/tasks/{task_a}"))
        .await;
    assert_eq!(got["state"], "open");
    let feed = srv
        .agent(&a.secret)
        .get_json(&format!("/api/v1/tasks/{task_a}/events?after=0"))
        .await;
    assert_eq!(feed["events"][0]["type"], "task.published");
    // The event says which credential acted.
    assert_eq!(
        feed["events"][0]["data"]["by"],
        json!({ "via": "api_key", "principal_id": a.principal, "key_id": a.id })
    );

    // Another agent's key learns nothing of it: 404, as for no task at all.
    for (method, rest) in [
        (Method::GET, ""),
        (Method::GET, "/events?after=0"),
        (Method::POST, "/publish"),
        (Method::POST, "/cancel"),
    ] {
        let problem = srv
            .agent(&b.secret)
            .request(method.clone(), &format!("/api/v1/tasks/{task_a}{rest}"))
            .expect_problem(StatusCode::NOT_FOUND)
            .await;
        assert_eq!(slug(&problem), "not-found", "{method} {rest}");
        let nothing = srv
            .agent(&b.secret)
            .request(
                method.clone(),
                &format!("/api/v1/tasks/{}{rest}", Uuid::new_v4()),
            )
            .expect_problem(StatusCode::NOT_FOUND)
            .await;
        assert_eq!(problem["detail"], nothing["detail"], "{method} {rest}");
    }
    // The task token still works for whoever holds it (a sub-agent), and
    // its actions say so.
    srv.agent(&token_a)
        .get_json(&format!("/api/v1/tasks/{task_a}"))
        .await;
    let (task_c, token_c) = create_with(&srv, &a.secret, "handed to a sub-agent").await;
    let published = srv.agent_post(task_c, &token_c, "publish").await;
    assert_eq!(
        published["events"][0]["data"]["by"],
        json!({ "via": "agent_token" })
    );
    // An operator may cancel any task; the audit trail records it.
    let op = operator_key(&srv, "ops").await;
    srv.agent_post(task_c, &op.secret, "cancel").await;
    let trail = srv
        .agent(&op.secret)
        .get_json(&format!("/api/v1/audit?principal={}", op.principal))
        .await;
    assert_eq!(trail["entries"][0]["action"], "task.cancelled_by_operator");
    assert_eq!(trail["entries"][0]["target"], format!("task:{task_c}"));

    // Each lists its own, with the state filter and pagination.
    let list = |key: &str, query: &str| {
        srv.agent(key)
            .get(&format!("/api/v1/tasks{query}"))
            .expect_json(StatusCode::OK)
    };
    assert_eq!(task_ids(&list(&a.secret, "").await), vec![task_c, task_a]);
    assert_eq!(task_ids(&list(&b.secret, "").await), vec![task_b]);
    let open = list(&a.secret, "?state=open").await;
    assert_eq!(task_ids(&open), vec![task_a]);
    let cancelled = list(&a.secret, "?state=cancelled").await;
    assert_eq!(task_ids(&cancelled), vec![task_c]);
    assert!(task_ids(&list(&a.secret, "?state=draft").await).is_empty());
    let (newer, _) = create_with(&srv, &a.secret, "A's second errand").await;
    let first = list(&a.secret, "?limit=2").await;
    assert_eq!(task_ids(&first), vec![newer, task_c], "newest first");
    let cursor = str_at(&first, "/next_cursor");
    let second = list(&a.secret, &format!("?limit=2&cursor={cursor}")).await;
    assert_eq!(task_ids(&second), vec![task_a]);
    assert!(second.get("next_cursor").is_none());
    srv.agent(&a.secret)
        .get("/api/v1/tasks?cursor=nonsense")
        .expect_problem(StatusCode::BAD_REQUEST)
        .await;

    // The same Idempotency-Key and body from two agents are two requests:
    // B never gets A's task or token back.
    let body = json!({ "description": "the same body" });
    let replay = |key: &str| {
        srv.agent(key)
            .post("/api/v1/tasks")
            .header("idempotency-key", "shared-key-1")
            .json(&body)
            .expect_json(StatusCode::CREATED)
    };
    let first_a = replay(&a.secret).await;
    let again_a = replay(&a.secret).await;
    let first_b = replay(&b.secret).await;
    assert_eq!(
        first_a["task"]["id"], again_a["task"]["id"],
        "A's retry is a replay"
    );
    assert_ne!(first_a["task"]["id"], first_b["task"]["id"]);
    assert_ne!(first_a["agent_token"], first_b["agent_token"]);
}

async fn scopes_bound_what_a_key_does(db: Db) {
    let srv = TestServer::start(db).await;
    let agent = agent_key(&srv, "tasks only").await;
    let register = json!({ "name": "Ada" });
    let problem = srv
        .agent(&agent.secret)
        .post("/api/v1/workers")
        .json(&register)
        .expect_problem(StatusCode::FORBIDDEN)
        .await;
    assert_eq!(slug(&problem), "insufficient-scope");
    assert!(str_at(&problem, "/detail").contains("workers:register"));
    for (method, path) in [
        (Method::GET, "/api/v1/keys"),
        (Method::GET, "/api/v1/audit"),
        (Method::GET, "/api/v1/workers"),
        (Method::POST, "/api/v1/workers/invites"),
    ] {
        srv.agent(&agent.secret)
            .request(method, path)
            .expect_problem(StatusCode::FORBIDDEN)
            .await;
    }
    let registrar = create_key(
        &srv,
        json!({ "name": "registrar", "scopes": ["workers:register"] }),
    )
    .await;
    srv.agent(&registrar.secret)
        .post("/api/v1/workers")
        .json(&register)
        .expect_json(StatusCode::CREATED)
        .await;
    // Without the tasks scope it creates no task and drives none.
    srv.agent(&registrar.secret)
        .post("/api/v1/tasks")
        .json(&json!({ "description": "x" }))
        .expect_problem(StatusCode::FORBIDDEN)
        .await;
    // A task or worker token is no key.
    let (_, token) = srv.create_task("x").await;
    srv.agent(&token)
        .post("/api/v1/tasks")
        .json(&json!({ "description": "x" }))
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    // A tampered, unknown or revoked key is 401.
    let mut tampered = agent.secret.clone();
    tampered.push('x');
    for bad in [tampered, format!("msk_{}_nothing", Uuid::new_v4().simple())] {
        srv.assert_agent_key(&bad, false).await;
    }
    srv.dev(Method::POST, &format!("/api/v1/keys/{}/revoke", agent.id))
        .expect_json(StatusCode::OK)
        .await;
    let revoked = srv
        .agent(&agent.secret)
        .get("/api/v1/tasks")
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    assert!(str_at(&revoked, "/detail").contains("revoked"));
    // A key that expired is refused; an expiry in the past is refused at once.
    srv.dev(Method::POST, "/api/v1/keys")
        .json(&json!({ "name": "old", "expires_at": "2001-01-01T00:00:00Z" }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
}

async fn a_rotated_secret_works_for_its_grace_period_only(db: Db) {
    let srv = TestServer::start(db).await;
    let key = agent_key(&srv, "rotating").await;
    let works = |secret: String| {
        let srv = &srv;
        async move {
            srv.agent(&secret)
                .get("/api/v1/tasks")
                .send()
                .await
                .expect("send")
                .status()
                == StatusCode::OK
        }
    };
    assert!(works(key.secret.clone()).await);
    let rotate = |grace: u64| {
        srv.dev(Method::POST, &format!("/api/v1/keys/{}/rotate", key.id))
            .json(&json!({ "grace_seconds": grace }))
            .expect_json(StatusCode::OK)
    };
    let before = Utc::now();
    let first = rotate(3600).await;
    let after = Utc::now();
    let second_secret = str_at(&first, "/secret");
    assert!(second_secret.starts_with(&format!("msk_{}_", key.id.simple())));
    // The grace ends an hour after the rotation, by the server's clock.
    let until = valid_until(&first);
    let hour = TimeDelta::hours(1);
    assert!(
        before + hour - TimeDelta::seconds(1) <= until
            && until <= after + hour + TimeDelta::seconds(1),
        "previous_valid_until {until} is not an hour after the rotation ({before} .. {after})"
    );
    // During the grace period both work.
    assert!(
        works(key.secret.clone()).await,
        "the old secret in its grace"
    );
    assert!(works(second_secret.clone()).await);
    // A rotation with no grace ends the replaced secret at once, and the
    // grace of the one before ended with it.
    let third = rotate(0).await;
    let third_secret = str_at(&third, "/secret");
    assert!(
        !works(second_secret).await,
        "the replaced secret after its grace"
    );
    assert!(!works(key.secret.clone()).await, "two rotations back");
    assert!(works(third_secret.clone()).await);

    // A short grace, watched to its end: the replaced secret is refused once
    // previous_valid_until has passed, and not before. (Real time: the
    // server's clock is the wall clock.)
    let fourth = rotate(2).await;
    let until = valid_until(&fourth);
    eventually(
        Duration::from_secs(30),
        "the replaced secret refused after its grace",
        || {
            let works = &works;
            let third_secret = third_secret.clone();
            async move {
                let worked = works(third_secret).await;
                // The server decided before this answer arrived: a refusal
                // seen now was decided at or before now.
                let answered_at = Utc::now();
                if worked {
                    None
                } else {
                    assert!(
                        answered_at >= until,
                        "refused by {answered_at}, before the grace ended at {until}"
                    );
                    Some(())
                }
            }
        },
    )
    .await;
    assert!(works(str_at(&fourth, "/secret")).await);
    srv.dev(Method::POST, &format!("/api/v1/keys/{}/rotate", key.id))
        .json(&json!({ "grace_seconds": 999_999_999 }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    srv.dev(Method::POST, &format!("/api/v1/keys/{}/revoke", key.id))
        .expect_json(StatusCode::OK)
        .await;
    let refused = srv
        .dev(Method::POST, &format!("/api/v1/keys/{}/rotate", key.id))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert_eq!(slug(&refused), "key-revoked");
}

/// Asserts that the worker token `token` is `accepted` (its task list is
/// answered) or refused (401).
async fn assert_worker_token(srv: &TestServer, token: &str, accepted: bool) {
    let list = srv.worker(token).get("/api/v1/worker/tasks");
    if accepted {
        list.expect_json(StatusCode::OK).await;
    } else {
        list.expect_problem(StatusCode::UNAUTHORIZED).await;
    }
}

async fn a_suspended_worker_is_signed_out_and_its_task_reopens(db: Db) {
    let srv = TestServer::start(db).await;
    let http = web::client();
    let active = srv.active_task("Water the plants.").await;
    let session = web::sign_in(
        &srv,
        &http,
        &active.worker_token,
        &web::same_origin(&srv.base_url),
    )
    .await;
    let page = web::get_with(&http, &srv.url("/app/my"), &session).await;
    assert_eq!(page.status(), StatusCode::OK);

    let manage = |action: &str| {
        srv.dev(
            Method::POST,
            &format!("/api/v1/workers/{}/{action}", active.worker_id),
        )
    };
    let suspended = manage("suspend")
        .json(&json!({ "reason": "reported" }))
        .expect_json(StatusCode::OK)
        .await;
    assert!(suspended["suspended_at"].is_string());

    // Its token, its session and its browser are refused.
    assert_worker_token(&srv, &active.worker_token, false).await;
    let page = web::get_with(&http, &srv.url("/app/my"), &session).await;
    assert_eq!(page.status(), StatusCode::SEE_OTHER, "signed out");
    assert_eq!(
        page.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/app/login")
    );
    // The task reopened for another worker, and says why.
    let task = srv.task(active.task_id, &active.agent_token).await;
    assert_eq!(task["state"], "open");
    assert!(task.get("worker_id").is_none_or(Value::is_null), "{task}");
    let feed = srv.feed(active.task_id, &active.agent_token).await;
    let last = feed.last().expect("events");
    assert_eq!(last["type"], "task.unassigned");
    assert_eq!(last["data"]["reason"], "worker_suspended");
    let (_, other) = srv.register_worker("Grace").await;
    srv.worker_post(active.task_id, &other, "claim").await;

    // Reinstated, it works again; a rotated token replaces the old one.
    manage("reinstate").expect_json(StatusCode::OK).await;
    assert_worker_token(&srv, &active.worker_token, true).await;
    let rotated = manage("rotate").expect_json(StatusCode::OK).await;
    assert_worker_token(&srv, &active.worker_token, false).await;
    assert_worker_token(&srv, &str_at(&rotated, "/worker_token"), true).await;
    let listed = srv.dev_get_json("/api/v1/workers").await;
    assert_eq!(listed["workers"].as_array().map(Vec::len), Some(2));
    srv.dev(
        Method::POST,
        &format!("/api/v1/workers/{}/suspend", Uuid::new_v4()),
    )
    .expect_problem(StatusCode::NOT_FOUND)
    .await;
}

async fn every_privileged_action_is_audited_with_its_principal(db: Db) {
    let srv = TestServer::start(db).await;
    let op = operator_key(&srv, "ops").await;
    let as_op = |method: Method, path: &str| srv.agent(&op.secret).request(method, path);
    let made = as_op(Method::POST, "/api/v1/keys")
        .json(&json!({ "name": "billing agent" }))
        .expect_json(StatusCode::CREATED)
        .await;
    let key = uuid_at(&made, "/key/id");
    as_op(Method::POST, &format!("/api/v1/keys/{key}/rotate"))
        .expect_json(StatusCode::OK)
        .await;
    as_op(Method::POST, &format!("/api/v1/keys/{key}/revoke"))
        .json(&json!({ "cancel_tasks": true }))
        .expect_json(StatusCode::OK)
        .await;
    let (worker, _) = srv.register_worker("Ada").await;
    as_op(Method::POST, &format!("/api/v1/workers/{worker}/suspend"))
        .expect_json(StatusCode::OK)
        .await;
    as_op(Method::POST, &format!("/api/v1/workers/{worker}/reinstate"))
        .expect_json(StatusCode::OK)
        .await;
    as_op(Method::POST, &format!("/api/v1/workers/{worker}/rotate"))
        .expect_json(StatusCode::OK)
        .await;
    let invite = as_op(Method::POST, "/api/v1/workers/invites")
        .expect_json(StatusCode::CREATED)
        .await;
    let invite_id = uuid_at(&invite, "/id");
    assert_eq!(uuid_at(&invite, "/created_by"), op.principal);
    let revoked = as_op(
        Method::POST,
        &format!("/api/v1/workers/invites/{invite_id}/revoke"),
    )
    .expect_json(StatusCode::OK)
    .await;
    assert!(revoked["revoked_at"].is_string());
    let invites = as_op(Method::GET, "/api/v1/workers/invites")
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(invites["invites"][0]["created_by"], json!(op.principal));

    let trail = as_op(
        Method::GET,
        &format!("/api/v1/audit?principal={}", op.principal),
    )
    .expect_json(StatusCode::OK)
    .await;
    let entries = array_at(&trail, "/entries");
    let actions: Vec<&str> = entries
        .iter()
        .rev()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        actions,
        [
            "key.created",
            "key.rotated",
            "key.revoked",
            "worker.suspended",
            "worker.reinstated",
            "worker.token_rotated",
            "invite.created",
            "invite.revoked",
        ]
    );
    for e in entries {
        assert_eq!(uuid_at(e, "/principal/id"), op.principal, "{e}");
        assert_eq!(e["principal"]["name"], "ops");
        assert_eq!(e["address"], "127.0.0.1");
    }
    assert_eq!(entries[7]["target"], format!("key:{key}"));
    // The development principal made the operator's key: its own entry.
    let everyone = as_op(Method::GET, "/api/v1/audit?limit=200")
        .expect_json(StatusCode::OK)
        .await;
    let all = array_at(&everyone, "/entries");
    assert_eq!(all.len(), entries.len() + 1);
    assert_eq!(
        all.last().expect("first entry")["principal"]["name"],
        "development"
    );
    // Paginated, newest first, without repeats.
    let page = as_op(Method::GET, "/api/v1/audit?limit=3")
        .expect_json(StatusCode::OK)
        .await;
    let cursor = str_at(&page, "/next_cursor");
    let next = as_op(
        Method::GET,
        &format!("/api/v1/audit?limit=3&cursor={cursor}"),
    )
    .expect_json(StatusCode::OK)
    .await;
    assert_eq!(next["entries"][0]["id"], all[3]["id"]);
    // A time window that ends before everything holds nothing.
    let before = as_op(Method::GET, "/api/v1/audit?until=2001-01-01T00:00:00Z")
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(before["entries"], json!([]));
}

async fn the_dev_key_turned_off_is_refused_with_a_way_forward(db: Db) {
    let srv = TestServer::start_without_dev_key(db).await;
    let problem = srv
        .dev(Method::POST, "/api/v1/tasks")
        .json(&json!({ "description": "x" }))
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    assert_eq!(slug(&problem), "dev-key-disabled");
    assert!(
        str_at(&problem, "/detail").contains("meatspace key create"),
        "{problem}"
    );
    // Even a wrong value is told the same (the key is off, not wrong).
    srv.post("/api/v1/workers")
        .header(DEV_KEY_HEADER, "not the key")
        .json(&json!({ "name": "x" }))
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    // No credential at all: told to get a key.
    let none = srv
        .post("/api/v1/tasks")
        .json(&json!({ "description": "x" }))
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    assert!(
        str_at(&none, "/detail").contains("meatspace key create"),
        "{none}"
    );

    // The first operator key, made without any key, works; the audit
    // trail recorded the refusal (once, however many came).
    let key = meatspace_api::access::bootstrap_operator(srv.store.as_ref(), "first operator")
        .await
        .expect("bootstrap");
    let trail = srv.agent(&key).get_json("/api/v1/audit").await;
    let refusals: Vec<&Value> = array_at(&trail, "/entries")
        .iter()
        .filter(|e| e["action"] == "dev_key.refused")
        .collect();
    assert_eq!(refusals.len(), 1, "{trail}");
    assert_eq!(refusals[0]["target"], "route:/api/v1/tasks");
    create_with(&srv, &key, "made with the operator key").await;
}

async fn keys_are_stored_only_as_digests(db: Db) {
    let srv = TestServer::start(db).await;
    let key = agent_key(&srv, "secretive").await;
    create_with(&srv, &key.secret, "x").await;
    let rotated = srv
        .dev(Method::POST, &format!("/api/v1/keys/{}/rotate", key.id))
        .expect_json(StatusCode::OK)
        .await;
    let secrets = [key.secret.clone(), str_at(&rotated, "/secret")];
    // The listing shows no secret.
    let listed = srv
        .dev(Method::GET, "/api/v1/keys")
        .send()
        .await
        .expect("list");
    let text = listed.text().await.expect("body");
    for s in &secrets {
        let tail = s.splitn(3, '_').nth(2).expect("secret part");
        assert!(!text.contains(tail), "a secret in the key listing");
    }
    // Nor does any column of the database, in any form the server stores.
    let dump = meatspace_tests::stored_bytes(srv.backend, &srv.db.url).await;
    for s in &secrets {
        let tail = s.splitn(3, '_').nth(2).expect("secret part");
        assert!(
            !meatspace_tests::contains(&dump, tail.as_bytes()),
            "a key secret is stored in plaintext"
        );
    }
    assert!(
        meatspace_tests::contains(&dump, b"secretive"),
        "the dump reads the keys table"
    );
}

/// A second API server on the same PostgreSQL database hears of a revoked
/// key, a suspended worker and a rotated-away secret from the change
/// stream and refuses them at once, although it had them in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revocations_reach_a_second_replica_at_once() {
    let first = TestServer::start(Db::Postgres).await;
    let replica = TestDb::replica(&first.db);
    let second = TestServer::start_on(Db::Postgres, replica, ServerOptions::default()).await;
    let key = agent_key(&first, "replicated").await;
    let rotating = agent_key(&first, "rotating").await;
    let (task, _) = create_with(&second, &key.secret, "x").await;
    let (worker, worker_token) = first.register_worker("Ada").await;
    // Both credentials are now in the second server's memory, and so is
    // the task's head: its polls are answered without the database.
    for _ in 0..2 {
        second
            .agent(&key.secret)
            .get_json(&format!("/api/v1/tasks/{task}/events?after=0"))
            .await;
        second.assert_worker_token(&worker_token, true).await;
        second.assert_agent_key(&rotating.secret, true).await;
    }
    first
        .dev(Method::POST, &format!("/api/v1/keys/{}/revoke", key.id))
        .expect_json(StatusCode::OK)
        .await;
    refused_by("revoked key", || {
        second
            .agent(&key.secret)
            .get(&format!("/api/v1/tasks/{task}/events?after=0"))
    })
    .await;

    first
        .dev(Method::POST, &format!("/api/v1/workers/{worker}/suspend"))
        .expect_json(StatusCode::OK)
        .await;
    refused_by("suspended worker", || {
        second.worker(&worker_token).get("/api/v1/worker/tasks")
    })
    .await;

    // Rotated on the first with no grace: the replica refuses the old
    // secret it had in memory, and takes the new one.
    let rotated = first
        .dev(
            Method::POST,
            &format!("/api/v1/keys/{}/rotate", rotating.id),
        )
        .json(&json!({ "grace_seconds": 0 }))
        .expect_json(StatusCode::OK)
        .await;
    refused_by("rotated-away secret", || {
        second.agent(&rotating.secret).get("/api/v1/tasks")
    })
    .await;
    second
        .assert_agent_key(&str_at(&rotated, "/secret"), true)
        .await;
}

/// Waits (a few seconds at most) until the replica answers `request` 401,
/// and prints how long that took.
async fn refused_by(what: &str, request: impl Fn() -> reqwest::RequestBuilder) {
    let since = Instant::now();
    eventually(
        Duration::from_secs(5),
        &format!("the replica refuses the {what}"),
        || async {
            (request().send().await.expect("send").status() == StatusCode::UNAUTHORIZED)
                .then_some(())
        },
    )
    .await;
    println!("{what} refused by the replica after {:?}", since.elapsed());
}

/// The binary, as an operator runs it: `bootstrap-operator` prints a first
/// key that works against a server started on the same data afterwards; a
/// key given by configuration is stored at start; the development key
/// turned off is refused; and at `RUST_LOG=trace` no key, token or secret
/// reaches the logs or the metrics.
#[tokio::test]
async fn the_binary_bootstraps_an_operator_and_logs_no_credential() {
    use meatspace_tests::process::{Binary, ServerProcess, free_port};
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("data");
    let data_env = data.to_str().expect("utf-8 path").to_owned();
    let boot = meatspace_tests::run_ok(
        tokio::process::Command::new(Binary::ApiServer.path())
            .args(["bootstrap-operator", "--name", "first operator"])
            .env_clear()
            .env("MEATSPACE_DATA_DIR", &data_env),
        "bootstrap-operator",
    )
    .await;
    let printed = String::from_utf8(boot.stdout).expect("utf-8");
    let operator = printed.trim().to_owned();
    assert!(operator.starts_with("msk_"), "{printed:?}");

    let configured = format!("msk_{}_{}", Uuid::new_v4().simple(), "c".repeat(43));
    let addr = format!("127.0.0.1:{}", free_port());
    let mut api = ServerProcess::start_in(
        Binary::ApiServer,
        dir.path(),
        "api",
        &addr,
        &[
            ("RUST_LOG", "trace"),
            ("MEATSPACE_DATA_DIR", &data_env),
            ("MEATSPACE_DEV_KEY_ENABLED", "false"),
            ("MEATSPACE_BOOTSTRAP_OPERATOR_KEY", &configured),
        ],
    );
    api.ready().await;
    assert!(
        api.printed_dev_key().is_none(),
        "a turned-off dev key was printed"
    );
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let call = |method: Method, path: &str, key: &str, body: Option<Value>| {
        let mut req = http
            .request(method, api.url(path))
            .header("authorization", format!("Bearer {key}"));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let what = path.to_owned();
        async move {
            let res = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
            let status = res.status();
            let body: Value = res
                .json()
                .await
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e})"));
            (status, body)
        }
    };
    let post = |path: &str, key: &str, body: Value| call(Method::POST, path, key, Some(body));
    let mut secrets = vec![operator.clone(), configured.clone()];
    // Both operator keys work; the configured one makes an agent key.
    for key in [&operator, &configured] {
        let (status, _) = call(Method::GET, "/api/v1/keys", key, None).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (_, made) = post("/api/v1/keys", &configured, json!({ "name": "agent" })).await;
    let agent = str_at(&made, "/secret");
    secrets.push(agent.clone());
    let (_, created) = post(
        "/api/v1/tasks",
        &agent,
        json!({ "description": "trace me" }),
    )
    .await;
    let task = str_at(&created, "/task/id");
    secrets.push(str_at(&created, "/agent_token"));
    for _ in 0..2 {
        let events = format!("/api/v1/tasks/{task}/events?after=0");
        let (status, _) = call(Method::GET, &events, &agent, None).await;
        assert_eq!(status, StatusCode::OK);
    }
    let rotate = format!("/api/v1/keys/{}/rotate", str_at(&made, "/key/id"));
    let (_, rotated) = call(Method::POST, &rotate, &operator, None).await;
    secrets.push(str_at(&rotated, "/secret"));
    let refused = http
        .post(api.url("/api/v1/tasks"))
        .header(DEV_KEY_HEADER, "msd_whatever-it-is-0123456789")
        .json(&json!({ "description": "x" }))
        .send()
        .await
        .expect("dev key");
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);

    let metrics = meatspace_tests::process_metrics(&http, &api)
        .await
        .text()
        .await
        .expect("text");
    let logs = api.logs();
    // Trace admits everything, the statements and request spans included.
    assert!(
        logs.contains("DEBUG sqlx::query"),
        "the statements are not logged"
    );
    for secret in &secrets {
        let random = secret.splitn(3, '_').nth(2).expect("secret part");
        for (place, text) in [("logs", &logs), ("metrics", &metrics)] {
            assert!(!text.contains(random), "a credential is in the {place}");
        }
    }
}
