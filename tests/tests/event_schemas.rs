//! The OpenAPI document types every event: a task is driven through every
//! event type on both backends (the worker's actions over HTTP, expiry and
//! a lapsed assignment through the store's own reconcile command), and each
//! event the feed serves must match exactly one branch of the served
//! `Event` schema (the one its `type` names), with every key of its `data`
//! declared there. `scripts/openapi-check.sh` checks the examples too.

use std::collections::BTreeSet;

use meatspace_domain::{Command, EventType, clock};
use meatspace_tests::schema::{mismatch, validator};
use meatspace_tests::server::{Expect, TestServer, images};
use meatspace_tests::{Db, api_tests};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

api_tests!(every_served_event_matches_its_schema);

async fn every_served_event_matches_its_schema(db: Db) {
    let srv = TestServer::start(db).await;
    let mut feeds: Vec<(Uuid, String)> = Vec::new();

    // Published, assigned, started, message, photo, issue, answer,
    // extended, completed.
    let a = srv.active_task("Count the ducks").await;
    let worker = srv.worker(&a.worker_token);
    let path = |p: &str| format!("/api/v1/worker/tasks/{}/{p}", a.task_id);
    worker
        .post_json(&path("messages"), &json!({ "text": "At the pond" }))
        .await;
    worker
        .post(&path("photos"))
        .header("content-type", "image/png")
        .body(images::png(8, 6))
        .expect_json(StatusCode::OK)
        .await;
    let issue = worker
        .post_json(
            &path("issues"),
            &json!({ "kind": "needs_more_time", "text": "Many ducks" }),
        )
        .await;
    let issue_id = issue["events"][0]["id"].as_i64().unwrap();
    let agent = srv.agent(&a.agent_token);
    agent
        .post_json(
            &format!("/api/v1/tasks/{}/issues/{issue_id}/respond", a.task_id),
            &json!({ "action": "acknowledge", "text": "Take your time" }),
        )
        .await;
    agent
        .post_json(
            &format!("/api/v1/tasks/{}/extend", a.task_id),
            &json!({ "add_seconds": 60 }),
        )
        .await;
    worker
        .post_json(&path("complete"), &json!({ "text": "Twelve" }))
        .await;
    feeds.push((a.task_id, a.agent_token.clone()));

    // Stopped.
    let b = srv.active_task("Walk the dog").await;
    srv.worker(&b.worker_token)
        .post_json(
            &format!("/api/v1/worker/tasks/{}/stop", b.task_id),
            &json!({ "text": "The dog bit me" }),
        )
        .await;
    feeds.push((b.task_id, b.agent_token));

    // Cancelled by answering an issue with `cancel`.
    let c = srv.active_task("Fix the gate").await;
    let issue_id = srv
        .raise_issue(c.task_id, &c.worker_token, "safety_concern", "Live wires")
        .await;
    srv.respond_to_issue(
        c.task_id,
        &c.agent_token,
        issue_id,
        json!({ "action": "cancel" }),
    )
    .expect_json(StatusCode::OK)
    .await;
    feeds.push((c.task_id, c.agent_token));

    // Cancelled by the agent; expired; a lapsed assignment.
    let (d, d_token) = srv.create_open_task("Buy bread").await;
    srv.agent_post(d, &d_token, "cancel").await;
    feeds.push((d, d_token));
    let (e, e_token) = srv.create_open_task("Read the meter").await;
    let (_, w) = srv.register_worker("Lin").await;
    srv.worker_post(e, &w, "claim").await;
    let task = srv.task(e, &e_token).await;
    let start_by: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(task["start_by"].clone()).unwrap();
    srv.store
        .apply(
            e,
            Command::Reconcile,
            start_by + chrono::TimeDelta::seconds(1),
        )
        .await
        .expect("the lapsed assignment is undone");
    srv.store
        .apply(
            e,
            Command::Reconcile,
            clock::now() + chrono::TimeDelta::days(400),
        )
        .await
        .expect("the task expires");
    feeds.push((e, e_token));

    // Review: submitted, revision requested, accepted, rejected and
    // accepted by the controller's reconcile, each with a typed result.
    for verdict in ["accept", "reject", "silence"] {
        let created = srv
            .create_task_with(json!({
                "description": "Check the lock",
                "result_schema": { "type": "object",
                    "properties": { "locked": { "type": "boolean" } }, "required": ["locked"] },
                "review": { "auto_accept_seconds": 60 },
            }))
            .await;
        let id: Uuid = created["task"]["id"].as_str().unwrap().parse().unwrap();
        let token = created["agent_token"].as_str().unwrap().to_owned();
        srv.publish(id, &token).await;
        let (_, w) = srv.claim_and_start(id).await;
        let complete = || {
            srv.worker(&w)
                .post(&format!("/api/v1/worker/tasks/{id}/complete"))
                .json(&json!({ "text": "Checked", "result": { "locked": true } }))
                .expect_json(StatusCode::OK)
        };
        let review = |body: Value| {
            srv.agent(&token)
                .post(&format!("/api/v1/tasks/{id}/review"))
                .json(&body)
                .expect_json(StatusCode::OK)
        };
        complete().await;
        review(json!({ "action": "revise", "text": "Look again" })).await;
        let submitted = complete().await;
        match verdict {
            "accept" => {
                review(json!({ "action": "accept" })).await;
            }
            "reject" => {
                review(json!({ "action": "reject", "text": "Wrong lock" })).await;
            }
            _ => {
                let at: chrono::DateTime<chrono::Utc> =
                    serde_json::from_value(submitted["task"]["review"]["auto_accept_at"].clone())
                        .unwrap();
                srv.store
                    .apply(id, Command::Reconcile, at)
                    .await
                    .expect("the submission is accepted");
            }
        }
        feeds.push((id, token));
    }

    let doc = srv.get_json("/api/v1/openapi.json").await;
    // The document is the root its references resolve in.
    let mut event_schema = doc.clone();
    event_schema["$ref"] = json!("#/components/schemas/Event");
    let event_schema = validator(&event_schema);
    let mut seen = BTreeSet::new();
    for (id, token) in &feeds {
        for event in srv.feed(*id, token).await {
            let kind = event["type"].as_str().unwrap().to_owned();
            if let Some(e) = mismatch(&event_schema, &event) {
                panic!("{kind} does not match the document: {e}\n{event}");
            }
            // Every key of data is described (a new key must be documented).
            let branch = &doc["components"]["schemas"]["Event"]["discriminator"]["mapping"][&kind];
            let reference = branch.as_str().expect("a mapping to a reference");
            let branch = reference
                .strip_prefix('#')
                .and_then(|pointer| doc.pointer(pointer))
                .unwrap_or_else(|| panic!("{reference} names nothing"));
            let declared = &branch["properties"]["data"]["properties"];
            for key in event["data"].as_object().unwrap().keys() {
                assert!(
                    declared.get(key).is_some(),
                    "{kind}: data.{key} is not in the document"
                );
            }
            seen.insert(kind);
            // And the check can fail: the event with a time that is none,
            // or with data that is no object, is refused.
            let mut bad_time = event.clone();
            bad_time["created_at"] = json!("yesterday");
            let mut bad_data = event.clone();
            bad_data["data"] = json!("a text");
            for bad in [bad_time, bad_data] {
                assert!(mismatch(&event_schema, &bad).is_some(), "{bad}");
            }
        }
    }
    let all: BTreeSet<String> = EventType::ALL
        .iter()
        .map(|t| t.as_str().to_owned())
        .collect();
    assert_eq!(seen, all, "the test produced every event type");
    srv.stop().await;
}
