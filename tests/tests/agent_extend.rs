//! `POST /api/v1/tasks/{id}/extend`: an agent gives a slow task more time.
//! Extend only, bounded by the longest lifetime, refused on terminal tasks,
//! recorded as `task.extended`, and the controller expires the task at the
//! new deadline, not the old one.

mod controller_support;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use meatspace_domain::Policy;
use meatspace_tests::server::{Expect, TestServer, str_at, task_and_token, types};
use meatspace_tests::{Db, eventually};
use reqwest::StatusCode;
use serde_json::json;

use controller_support::{InProcess, config};

meatspace_tests::api_tests!(
    extending_moves_the_deadline_and_records_an_event,
    extensions_are_bounded_and_checked,
    a_terminal_task_cannot_be_extended,
    the_controller_expires_at_the_new_deadline,
);

fn time_at(v: &serde_json::Value, pointer: &str) -> DateTime<Utc> {
    str_at(v, pointer)
        .parse()
        .unwrap_or_else(|e| panic!("{pointer} in {v}: {e}"))
}

async fn create(server: &TestServer, lifetime: i64) -> (uuid::Uuid, String, DateTime<Utc>) {
    let created = server
        .create_task_with(
            json!({ "description": "Check the mailbox", "expires_in_seconds": lifetime }),
        )
        .await;
    let (id, token) = task_and_token(&created);
    (id, token, time_at(&created, "/task/expires_at"))
}

async fn extending_moves_the_deadline_and_records_an_event(db: Db) {
    let server = TestServer::start(db).await;
    let (id, token, expires_at) = create(&server, 3600).await;
    server.publish(id, &token).await;
    let agent = server.agent(&token);
    let path = format!("/api/v1/tasks/{id}/extend");

    let change = agent.post_json(&path, &json!({ "add_seconds": 600 })).await;
    let after_add = time_at(&change, "/task/expires_at");
    assert_eq!(after_add, expires_at + TimeDelta::seconds(600));
    assert_eq!(
        types(change["events"].as_array().unwrap()),
        ["task.extended"]
    );
    let event = &change["events"][0];
    assert_eq!(event["actor"], "agent");
    assert_eq!(time_at(event, "/data/previous_expires_at"), expires_at);
    assert_eq!(time_at(event, "/data/expires_at"), after_add);

    let target = after_add + TimeDelta::seconds(60);
    let change = agent
        .post_json(&path, &json!({ "expires_at": target.to_rfc3339() }))
        .await;
    assert_eq!(time_at(&change, "/task/expires_at"), target);
    assert_eq!(change["task"]["state"], "open");

    // The task resource and the feed agree.
    let task = server.task(id, &token).await;
    assert_eq!(time_at(&task, "/expires_at"), target);
    let feed = server.feed(id, &token).await;
    assert_eq!(
        types(&feed),
        ["task.published", "task.extended", "task.extended"]
    );
}

async fn extensions_are_bounded_and_checked(db: Db) {
    let server = TestServer::start(db).await;
    let (id, token, expires_at) = create(&server, 3600).await;
    let agent = server.agent(&token);
    let path = format!("/api/v1/tasks/{id}/extend");
    let max = Policy::default().max_lifetime;
    let created_at = time_at(&server.task(id, &token).await, "/created_at");
    for body in [
        // Not later.
        json!({ "expires_at": expires_at.to_rfc3339() }),
        json!({ "expires_at": (expires_at - TimeDelta::seconds(1)).to_rfc3339() }),
        // Past the longest lifetime counted from creation.
        json!({ "expires_at": (created_at + max + TimeDelta::seconds(1)).to_rfc3339() }),
        json!({ "add_seconds": 0 }),
        json!({ "add_seconds": -5 }),
        json!({ "add_seconds": max.num_seconds() + 1 }),
        // Exactly one of the two.
        json!({}),
        json!({ "add_seconds": 5, "expires_at": (expires_at + TimeDelta::hours(1)).to_rfc3339() }),
    ] {
        agent
            .post(&path)
            .json(&body)
            .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
            .await;
    }
    // Unchanged, and no event appended.
    assert_eq!(
        time_at(&server.task(id, &token).await, "/expires_at"),
        expires_at
    );
    assert!(server.feed(id, &token).await.is_empty());
    // The maximum itself is allowed.
    agent
        .post_json(
            &path,
            &json!({ "expires_at": (created_at + max).to_rfc3339() }),
        )
        .await;
    // Another task's token: 404; no token: 401.
    let (_, other, _) = create(&server, 3600).await;
    server
        .agent(&other)
        .post(&path)
        .json(&json!({ "add_seconds": 5 }))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    server
        .post(&path)
        .json(&json!({ "add_seconds": 5 }))
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
}

async fn a_terminal_task_cannot_be_extended(db: Db) {
    let server = TestServer::start(db).await;
    let (id, token, _) = create(&server, 3600).await;
    let agent = server.agent(&token);
    agent
        .post(&format!("/api/v1/tasks/{id}/cancel"))
        .expect_json(StatusCode::OK)
        .await;
    let problem = agent
        .post(&format!("/api/v1/tasks/{id}/extend"))
        .json(&json!({ "add_seconds": 60 }))
        .expect_problem(StatusCode::CONFLICT)
        .await;
    assert_eq!(problem["task_state"], "cancelled");
    assert_eq!(types(&server.feed(id, &token).await), ["task.cancelled"]);
}

/// A task created with a 2 s lifetime and extended by 3 s is still open
/// after its old deadline and expires at the new one.
async fn the_controller_expires_at_the_new_deadline(db: Db) {
    let server = TestServer::start(db).await;
    let controller = InProcess::start(
        &server.store,
        meatspace_controller::ControllerConfig {
            clock: server.options.clock.clone(),
            ..config()
        },
    );
    let (id, token, old) = create(&server, 2).await;
    server.publish(id, &token).await;
    let change = server
        .agent(&token)
        .post_json(
            &format!("/api/v1/tasks/{id}/extend"),
            &json!({ "add_seconds": 3 }),
        )
        .await;
    let new = time_at(&change, "/task/expires_at");
    assert_eq!(new, old + TimeDelta::seconds(3));
    server.advance_clock_past(new);
    let task = eventually(
        Duration::from_secs(30),
        "expired at the new deadline",
        || async {
            let task = server.task(id, &token).await;
            (task["state"] == "expired").then_some(task)
        },
    )
    .await;
    let ended = time_at(&task, "/ended_at");
    assert!(
        ended >= new,
        "expired at {ended}, before the new deadline {new}"
    );
    let feed = server.feed(id, &token).await;
    assert_eq!(
        types(&feed),
        ["task.published", "task.extended", "task.expired"]
    );
    controller.stop().await;
}
