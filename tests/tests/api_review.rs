//! Typed results and review, through the real server on both backends: a
//! result schema in the subset kept and one outside it refused at create
//! with pointers, a worker's result checked field by field (photo fields
//! counting this task's photos), and review: accept, revise then accept,
//! reject, the revision limit, the controller's auto-accept on a moved
//! clock (never lost to the active time limit), and the race of every way a
//! waiting submission can end.

mod controller_support;

use chrono::{DateTime, TimeDelta, Utc};
use meatspace_domain::Policy;
use meatspace_tests::Db;
use meatspace_tests::server::{
    ActiveTask, Expect, TestServer, images, str_at, task_and_token, task_path, types, worker_path,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

meatspace_tests::api_tests!(
    schemas_in_the_subset_are_kept_and_others_refused_with_pointers,
    a_result_is_checked_field_by_field_and_photo_fields_count_this_tasks_photos,
    a_typed_result_without_review_completes_the_task,
    accept_and_revise_then_accept,
    reject_and_the_revision_limit,
    the_controller_accepts_a_silent_review_past_the_active_time_limit,
    every_way_a_waiting_submission_ends_gives_one_end,
);

/// Every field type of the subset.
fn gate_schema() -> Value {
    json!({
        "type": "object",
        "title": "Gate check",
        "properties": {
            "locked": { "type": "boolean", "title": "Was the gate locked?" },
            "note": { "type": "string", "title": "Anything else", "maxLength": 200 },
            "plate": { "type": "string", "title": "Plate", "pattern": "^[A-Z]{2}[0-9]{3}$" },
            "colour": { "type": "string", "title": "Gate colour", "enum": ["red", "green", "blue"] },
            "queue": { "type": "integer", "title": "People waiting", "minimum": 0, "maximum": 500 },
            "price": { "type": "number", "title": "Parking price", "minimum": 0.5 },
            "signs": { "type": "array", "title": "Signs",
                       "items": { "type": "string", "enum": ["open", "closed", "sale"] },
                       "uniqueItems": true },
            "photos": { "type": "array", "title": "Photos of the gate",
                        "items": { "type": "string", "format": "photo" },
                        "minItems": 1, "maxItems": 2 }
        },
        "required": ["locked", "photos"]
    })
}

/// A reviewed task with a one-boolean schema, started.
async fn reviewed(srv: &TestServer, auto_accept_seconds: u32) -> ActiveTask {
    srv.active_task_with(json!({
        "description": "Check whether the gate is locked",
        "result_schema": { "type": "object",
            "properties": { "locked": { "type": "boolean", "title": "Locked?" } },
            "required": ["locked"] },
        "review": { "auto_accept_seconds": auto_accept_seconds },
    }))
    .await
}

/// The worker sends a photo; returns its id.
async fn photo(srv: &TestServer, t: &ActiveTask) -> String {
    let change = srv
        .worker(&t.worker_token)
        .send_png(t.task_id, images::png(4, 3))
        .expect_json(StatusCode::OK)
        .await;
    str_at(&change, "/events/0/data/photo_id")
}

/// `POST …/complete` with `body` as the task's worker.
fn complete(srv: &TestServer, t: &ActiveTask, body: Value) -> reqwest::RequestBuilder {
    srv.worker(&t.worker_token)
        .post(&worker_path(t.task_id, "/complete"))
        .json(&body)
}

/// `POST …/review` with `body` as the task's agent.
fn review(srv: &TestServer, t: &ActiveTask, body: Value) -> reqwest::RequestBuilder {
    srv.agent(&t.agent_token)
        .post(&task_path(t.task_id, "/review"))
        .json(&body)
}

/// The pointers of a problem's `errors`, sorted.
fn pointers(problem: &Value) -> Vec<String> {
    let mut got: Vec<String> = problem["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("errors in {problem}"))
        .iter()
        .map(|e| {
            assert!(!str_at(e, "/message").is_empty(), "{e}");
            str_at(e, "/pointer")
        })
        .collect();
    got.sort();
    got
}

fn time_at(v: &Value, pointer: &str) -> DateTime<Utc> {
    str_at(v, pointer)
        .parse()
        .unwrap_or_else(|e| panic!("{pointer} in {v}: {e}"))
}

async fn schemas_in_the_subset_are_kept_and_others_refused_with_pointers(db: Db) {
    let srv = TestServer::start(db).await;
    let created = srv
        .create_task_with(
            json!({ "description": "Check the gate", "result_schema": gate_schema() }),
        )
        .await;
    let mut kept = gate_schema();
    kept["additionalProperties"] = json!(false);
    assert_eq!(created["task"]["result_schema"], kept);
    let (id, token) = task_and_token(&created);
    assert_eq!(srv.task(id, &token).await["result_schema"], kept);
    // A task without one has no such field.
    let (id, token) = srv.create_task("Anything").await;
    let plain = srv.task(id, &token).await;
    assert!(plain.get("result_schema").is_none() && plain.get("review").is_none());

    let before = srv.counts().await;
    let mut outside = gate_schema();
    outside["properties"]["note"]["format"] = json!("email");
    outside["properties"]["nested"] = json!({ "type": "object", "properties": {} });
    outside["properties"]["queue"]["multipleOf"] = json!(5);
    outside["allOf"] = json!([]);
    for (schema, expected) in [
        (
            outside,
            vec![
                "/allOf",
                "/properties/nested/type",
                "/properties/note/format",
                "/properties/queue/multipleOf",
            ],
        ),
        (json!({ "type": "string" }), vec!["/properties", "/type"]),
        (
            json!({ "type": "object", "properties": { "a": { "type": "boolean" } },
                    "additionalProperties": true }),
            vec!["/additionalProperties"],
        ),
        (
            json!({ "type": "object", "properties": { "p": { "type": "string", "pattern": "(a)\\1" } } }),
            vec!["/properties/p/pattern"],
        ),
    ] {
        let problem = srv
            .dev(Method::POST, "/api/v1/tasks")
            .json(&json!({ "description": "x", "result_schema": schema }))
            .expect_problem_type(StatusCode::UNPROCESSABLE_ENTITY, "invalid-result-schema")
            .await;
        assert_eq!(pointers(&problem), expected, "{problem}");
    }
    // Review terms out of bounds are refused with the bounds.
    let problem = srv
        .dev(Method::POST, "/api/v1/tasks")
        .json(&json!({ "description": "x", "review": { "auto_accept_seconds": 59 } }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert!(str_at(&problem, "/detail").contains("between 60 and 2592000"));
    assert_eq!(
        srv.counts().await.tasks,
        before.tasks,
        "nothing was written"
    );

    let caps = srv.capabilities().await;
    assert_eq!(caps["review_protocol"]["max_revisions"], 3);
    assert_eq!(
        caps["review_protocol"]["auto_accept_seconds"]["default"],
        172_800
    );
    assert!(caps["typed_results"]["field_types"]["array of photos"].is_string());
    assert_eq!(
        caps["endpoints"]["review_submission"]["path"],
        "/api/v1/tasks/{task_id}/review"
    );
}

async fn a_result_is_checked_field_by_field_and_photo_fields_count_this_tasks_photos(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv
        .active_task_with(
            json!({ "description": "Check the gate", "result_schema": gate_schema() }),
        )
        .await;
    let other = srv
        .active_task_with(json!({ "description": "Another gate", "result_schema": gate_schema() }))
        .await;
    let mine = photo(&srv, &t).await;
    let theirs = photo(&srv, &other).await;

    // Each misfit at its pointer; nothing changes.
    let problem = complete(
        &srv,
        &t,
        json!({ "result": {
            "locked": "yes", "plate": "ab123", "colour": "pink", "queue": 1.5,
            "price": 0, "signs": ["open", "open"], "photos": [mine], "extra": 1
        } }),
    )
    .expect_problem_type(StatusCode::UNPROCESSABLE_ENTITY, "invalid-result")
    .await;
    assert_eq!(
        pointers(&problem),
        [
            "", "/colour", "/locked", "/plate", "/price", "/queue", "/signs"
        ]
    );
    // Photo fields: this task's photos only, each once, within the counts.
    for (photos, at) in [
        (json!([]), "/photos"),
        (json!([theirs]), "/photos/0"),
        (json!([mine, mine]), "/photos/1"),
        (json!(["not-a-photo"]), "/photos/0"),
    ] {
        let problem = complete(
            &srv,
            &t,
            json!({ "result": { "locked": true, "photos": photos } }),
        )
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
        assert_eq!(pointers(&problem), [at], "{photos}: {problem}");
    }
    // A schema asks for a result; a stop takes none.
    let problem = complete(&srv, &t, json!({ "text": "done" }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert!(
        str_at(&problem, "/detail").contains("result_schema"),
        "{problem}"
    );
    srv.worker(&t.worker_token)
        .post(&worker_path(t.task_id, "/stop"))
        .json(&json!({ "result": { "locked": true } }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert_eq!(srv.task(t.task_id, &t.agent_token).await["state"], "active");

    // A task without a schema refuses a result.
    let plain = srv.active_task("Plain work").await;
    let problem = complete(&srv, &plain, json!({ "result": { "locked": true } }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert!(
        str_at(&problem, "/detail").contains("no result_schema"),
        "{problem}"
    );

    // Every type filled in right passes.
    let result = json!({
        "locked": false, "note": "Chained", "plate": "AB123", "colour": "green", "queue": 3,
        "price": 2.5, "signs": ["open", "sale"], "photos": [mine]
    });
    let done = complete(&srv, &t, json!({ "result": result }))
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(done["task"]["state"], "completed");
    assert_eq!(done["task"]["result"], result);
}

async fn a_typed_result_without_review_completes_the_task(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv
        .active_task_with(json!({ "description": "Count the queue",
                "result_schema": { "type": "object",
                    "properties": { "queue": { "type": "integer", "minimum": 0 } },
                    "required": ["queue"] } }))
        .await;
    complete(
        &srv,
        &t,
        json!({ "text": "busy", "result": { "queue": 7 } }),
    )
    .expect_json(StatusCode::OK)
    .await;
    let feed = srv.feed(t.task_id, &t.agent_token).await;
    let end = feed.last().expect("events");
    assert_eq!(end["type"], "task.completed");
    assert_eq!(end["data"]["result"], json!({ "queue": 7 }));
    assert_eq!(end["data"]["note"], "busy");
    assert_eq!(end["untrusted"], true, "a result is the worker's");
    assert_eq!(
        srv.task(t.task_id, &t.agent_token).await["result"],
        json!({ "queue": 7 })
    );
}

async fn accept_and_revise_then_accept(db: Db) {
    let srv = TestServer::start(db).await;
    let t = reviewed(&srv, 3600).await;
    // Nothing to review yet.
    review(&srv, &t, json!({ "action": "accept" }))
        .expect_problem_type(StatusCode::CONFLICT, "nothing-to-review")
        .await;

    let submitted = complete(
        &srv,
        &t,
        json!({ "text": "first try", "result": { "locked": true } }),
    )
    .expect_json(StatusCode::OK)
    .await;
    assert_eq!(
        submitted["task"]["state"], "active",
        "a submission keeps the task active"
    );
    assert_eq!(submitted["task"]["review"]["state"], "submitted");
    let event = &submitted["events"][0];
    assert_eq!(event["type"], "task.submitted");
    assert_eq!(event["untrusted"], true);
    assert_eq!(event["data"]["result"], json!({ "locked": true }));
    assert_eq!(event["data"]["revision"], 0);
    let auto_accept_at = time_at(event, "/data/auto_accept_at");
    assert_eq!(
        time_at(&submitted, "/task/review/auto_accept_at"),
        auto_accept_at
    );
    // A second submission waits for the answer to the first.
    complete(&srv, &t, json!({ "result": { "locked": false } }))
        .expect_problem_type(StatusCode::CONFLICT, "already-submitted")
        .await;
    // A revision needs a text.
    review(&srv, &t, json!({ "action": "revise" }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;

    let revised = review(
        &srv,
        &t,
        json!({ "action": "revise", "text": "Check the side gate too" }),
    )
    .expect_json(StatusCode::OK)
    .await;
    let event = &revised["events"][0];
    assert_eq!(event["type"], "task.revision_requested");
    assert_eq!(event["actor"], "agent");
    assert_eq!(event["untrusted"], false, "the agent wrote it");
    assert_eq!(event["data"]["text"], "Check the side gate too");
    assert_eq!(revised["task"]["review"]["state"], "revision_requested");
    assert_eq!(
        revised["task"]["review"]["feedback"],
        "Check the side gate too"
    );
    // The worker sees the request in its feed.
    let worker_feed = srv
        .worker(&t.worker_token)
        .get_json(&worker_path(t.task_id, "/events?after=0"))
        .await;
    assert!(
        types(worker_feed["events"].as_array().expect("events"))
            .contains(&"task.revision_requested")
    );

    complete(&srv, &t, json!({ "result": { "locked": false } }))
        .expect_json(StatusCode::OK)
        .await;
    let accepted = review(&srv, &t, json!({ "action": "accept" }))
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(accepted["task"]["state"], "completed");
    assert_eq!(accepted["task"]["review"]["state"], "accepted");
    assert_eq!(accepted["task"]["result"], json!({ "locked": false }));
    let end = &accepted["events"][0];
    assert_eq!(end["type"], "task.completed");
    assert_eq!(end["actor"], "agent");
    assert_eq!(end["data"]["result"], json!({ "locked": false }));
    assert_eq!(end["data"]["automatic"], false);
    let feed = srv.feed(t.task_id, &t.agent_token).await;
    assert_eq!(
        types(&feed)[types(&feed).len() - 4..],
        [
            "task.submitted",
            "task.revision_requested",
            "task.submitted",
            "task.completed"
        ]
    );
    // Terminal now: a late answer is refused.
    review(&srv, &t, json!({ "action": "reject", "text": "no" }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
}

async fn reject_and_the_revision_limit(db: Db) {
    let srv = TestServer::start(db).await;
    let t = reviewed(&srv, 3600).await;
    for n in 1..=3 {
        complete(&srv, &t, json!({ "result": { "locked": true } }))
            .expect_json(StatusCode::OK)
            .await;
        let revised = review(
            &srv,
            &t,
            json!({ "action": "revise", "text": format!("again {n}") }),
        )
        .expect_json(StatusCode::OK)
        .await;
        assert_eq!(revised["task"]["review"]["revisions"], n);
    }
    complete(&srv, &t, json!({ "result": { "locked": true } }))
        .expect_json(StatusCode::OK)
        .await;
    review(&srv, &t, json!({ "action": "revise", "text": "once more" }))
        .expect_problem_type(StatusCode::CONFLICT, "revision-limit")
        .await;
    // A rejection needs a reason, and cancels the task with it.
    review(&srv, &t, json!({ "action": "reject" }))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    let rejected = review(
        &srv,
        &t,
        json!({ "action": "reject", "text": "That is the wrong gate" }),
    )
    .expect_json(StatusCode::OK)
    .await;
    assert_eq!(rejected["task"]["state"], "cancelled");
    assert_eq!(rejected["task"]["review"]["state"], "rejected");
    let end = &rejected["events"][0];
    assert_eq!(end["type"], "task.cancelled");
    assert_eq!(end["data"]["reason"], "That is the wrong gate");
    assert_eq!(end["data"]["review"], "rejected");
    // The worker's later complete finds the task ended.
    complete(&srv, &t, json!({ "result": { "locked": true } }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
}

async fn the_controller_accepts_a_silent_review_past_the_active_time_limit(db: Db) {
    // An active time limit of a minute, a review delay of an hour: the
    // submission outlives the limit and is still accepted, not expired.
    let policy = Policy {
        active_time_limit: TimeDelta::seconds(60),
        ..Policy::default()
    };
    let srv = TestServer::start_with_policy(db, policy).await;
    let controller = controller_support::InProcess::start(
        &srv.store,
        meatspace_controller::ControllerConfig {
            clock: srv.options.clock.clone(),
            ..controller_support::config()
        },
    );
    let t = reviewed(&srv, 3600).await;
    let submitted = complete(&srv, &t, json!({ "result": { "locked": true } }))
        .expect_json(StatusCode::OK)
        .await;
    let cursor = submitted["events"][0]["id"].as_i64().expect("id");
    let auto_accept_at = time_at(&submitted, "/task/review/auto_accept_at");
    let active_until = time_at(&submitted, "/task/active_until");
    assert!(active_until < auto_accept_at);

    srv.advance_clock_past(active_until);
    // The controller applies deadlines that are due; nothing is, so the
    // store's own reconcile finds nothing either.
    assert!(
        srv.store
            .reconcile_due(srv.now(), 10)
            .await
            .expect("reconcile")
            .is_empty()
    );
    assert_eq!(srv.task(t.task_id, &t.agent_token).await["state"], "active");

    srv.advance_clock_past(auto_accept_at);
    // The agent's long poll wakes with the controller's acceptance.
    let page = srv
        .agent(&t.agent_token)
        .get_json(&format!(
            "/api/v1/tasks/{}/events?after={cursor}&wait=25",
            t.task_id
        ))
        .await;
    let end = &page["events"][0];
    assert_eq!(end["type"], "task.completed", "{page}");
    assert_eq!(end["actor"], "system");
    assert_eq!(end["data"]["automatic"], true);
    assert_eq!(end["data"]["review"], "auto_accepted");
    assert_eq!(end["data"]["result"], json!({ "locked": true }));
    let task = srv.task(t.task_id, &t.agent_token).await;
    assert_eq!(task["state"], "completed");
    assert_eq!(task["review"]["state"], "auto_accepted");
    controller.stop().await;
}

/// Accept, reject, the controller's auto-accept, the worker's stop and the
/// agent's cancel, all sent at once on a submission whose delay has run
/// out: exactly one terminal state, one terminal event, and every other
/// request refused (409) or, for the controller, finding nothing due.
async fn every_way_a_waiting_submission_ends_gives_one_end(db: Db) {
    let srv = TestServer::start(db).await;
    for round in 0..6 {
        let t = reviewed(&srv, 60).await;
        let submitted = complete(&srv, &t, json!({ "result": { "locked": true } }))
            .expect_json(StatusCode::OK)
            .await;
        // Every other round the delay has run out, so the controller's
        // reconcile competes and the agent's answers find the deadline passed.
        if round % 2 == 1 {
            srv.advance_clock_past(time_at(&submitted, "/task/review/auto_accept_at"));
        }
        let send =
            |req: reqwest::RequestBuilder| async move { req.send().await.expect("send").status() };
        let (accept, reject, stop, cancel, reconciled) = tokio::join!(
            send(review(&srv, &t, json!({ "action": "accept" }))),
            send(review(
                &srv,
                &t,
                json!({ "action": "reject", "text": "no" })
            )),
            send(
                srv.worker(&t.worker_token)
                    .post(&worker_path(t.task_id, "/stop"))
            ),
            send(
                srv.agent(&t.agent_token)
                    .post(&task_path(t.task_id, "/cancel"))
            ),
            srv.store.reconcile_due(srv.now(), 10),
        );
        let applied = reconciled.expect("reconcile").len();
        let won: Vec<StatusCode> = [accept, reject, stop, cancel]
            .into_iter()
            .filter(|s| *s == StatusCode::OK)
            .collect();
        for s in [accept, reject, stop, cancel] {
            assert!(
                s == StatusCode::OK || s == StatusCode::CONFLICT,
                "round {round}: {s}"
            );
        }
        assert_eq!(won.len() + applied, 1, "round {round}: one winner");
        let feed = srv.feed(t.task_id, &t.agent_token).await;
        let ends: Vec<&Value> = feed
            .iter()
            .filter(|e| {
                matches!(
                    e["type"].as_str(),
                    Some("task.completed" | "task.cancelled" | "task.stopped" | "task.expired")
                )
            })
            .collect();
        assert_eq!(ends.len(), 1, "round {round}: {feed:?}");
        let state = srv.task(t.task_id, &t.agent_token).await["state"].clone();
        let expected = match ends[0]["type"].as_str() {
            Some("task.completed") => "completed",
            Some("task.cancelled") => "cancelled",
            _ => "stopped",
        };
        assert_eq!(state, expected, "round {round}");
    }
}
