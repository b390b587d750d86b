//! The OpenAPI document types every event: a task is driven through every
//! event type on both backends (the worker's actions over HTTP, expiry and
//! a lapsed assignment through the store's own reconcile command), and each
//! event the feed serves must match exactly one branch of the served
//! `Event` schema (the one its `type` names), with every key of its `data`
//! declared there. `scripts/openapi-check.sh` checks the examples too.

use std::collections::BTreeSet;

use meatspace_domain::{Command, EventType, clock};
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
        .post(&path("messages"))
        .json(&json!({ "text": "At the pond" }))
        .expect_json(StatusCode::OK)
        .await;
    worker
        .post(&path("photos"))
        .header("content-type", "image/png")
        .body(images::png(8, 6))
        .expect_json(StatusCode::OK)
        .await;
    let issue = worker
        .post(&path("issues"))
        .json(&json!({ "kind": "needs_more_time", "text": "Many ducks" }))
        .expect_json(StatusCode::OK)
        .await;
    let issue_id = issue["events"][0]["id"].as_i64().unwrap();
    let agent = srv.agent(&a.agent_token);
    agent
        .post(&format!(
            "/api/v1/tasks/{}/issues/{issue_id}/respond",
            a.task_id
        ))
        .json(&json!({ "action": "acknowledge", "text": "Take your time" }))
        .expect_json(StatusCode::OK)
        .await;
    agent
        .post(&format!("/api/v1/tasks/{}/extend", a.task_id))
        .json(&json!({ "add_seconds": 60 }))
        .expect_json(StatusCode::OK)
        .await;
    worker
        .post(&path("complete"))
        .json(&json!({ "text": "Twelve" }))
        .expect_json(StatusCode::OK)
        .await;
    feeds.push((a.task_id, a.agent_token.clone()));

    // Stopped.
    let b = srv.active_task("Walk the dog").await;
    srv.worker(&b.worker_token)
        .post(&format!("/api/v1/worker/tasks/{}/stop", b.task_id))
        .json(&json!({ "text": "The dog bit me" }))
        .expect_json(StatusCode::OK)
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

    let doc = srv
        .get("/api/v1/openapi.json")
        .expect_json(StatusCode::OK)
        .await;
    let event_schema = json!({ "$ref": "#/components/schemas/Event" });
    let mut seen = BTreeSet::new();
    for (id, token) in &feeds {
        for event in srv.feed(*id, token).await {
            let kind = event["type"].as_str().unwrap().to_owned();
            if let Err(e) = validate(&event_schema, &event, &doc) {
                panic!("{kind} does not match the document: {e}\n{event}");
            }
            // Every key of data is described (a new key must be documented).
            let branch = &doc["components"]["schemas"]["Event"]["discriminator"]["mapping"][&kind];
            let branch = resolve(branch, &doc);
            let declared = &branch["properties"]["data"]["properties"];
            for key in event["data"].as_object().unwrap().keys() {
                assert!(
                    declared.get(key).is_some(),
                    "{kind}: data.{key} is not in the document"
                );
            }
            seen.insert(kind);
        }
    }
    let all: BTreeSet<String> = EventType::ALL
        .iter()
        .map(|t| t.as_str().to_owned())
        .collect();
    assert_eq!(seen, all, "the test produced every event type");
    srv.stop().await;
}

fn resolve<'a>(schema: &'a Value, root: &'a Value) -> &'a Value {
    match schema.as_str().or_else(|| schema["$ref"].as_str()) {
        Some(reference) => reference
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .unwrap_or_else(|| panic!("unresolvable reference {reference}")),
        None => schema,
    }
}

/// A structural JSON Schema check: types (with null), required
/// properties, enums, formats of ids and times, numeric bounds, string
/// lengths, references, and `oneOf` matching exactly one branch.
fn validate(schema: &Value, value: &Value, root: &Value) -> Result<(), String> {
    if schema.get("$ref").is_some() {
        return validate(resolve(schema, root), value, root);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        let matching = options
            .iter()
            .filter(|s| validate(s, value, root).is_ok())
            .count();
        if matching != 1 {
            let why: Vec<String> = options
                .iter()
                .filter_map(|s| validate(s, value, root).err())
                .collect();
            return Err(format!("matches {matching} branches of oneOf: {why:?}"));
        }
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(value)
    {
        return Err(format!("{value} is not one of {options:?}"));
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty()
        && !types.iter().any(|t| match *t {
            "object" => value.is_object(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "array" => value.is_array(),
            "null" => value.is_null(),
            _ => false,
        })
    {
        return Err(format!("{value} is not of type {types:?}"));
    }
    if let Some(s) = value.as_str() {
        match schema["format"].as_str() {
            Some("uuid") if s.parse::<Uuid>().is_err() => return Err(format!("{s} is no uuid")),
            Some("date-time") if chrono::DateTime::parse_from_rfc3339(s).is_err() => {
                return Err(format!("{s} is no date-time"));
            }
            _ => {}
        }
        let n = s.chars().count() as u64;
        if schema["minLength"].as_u64().is_some_and(|m| n < m)
            || schema["maxLength"].as_u64().is_some_and(|m| n > m)
        {
            return Err(format!("{s:?} has a length out of bounds"));
        }
    }
    if let Some(n) = value.as_f64()
        && (schema["minimum"].as_f64().is_some_and(|m| n < m)
            || schema["maximum"].as_f64().is_some_and(|m| n > m))
    {
        return Err(format!("{n} is out of bounds"));
    }
    if let Value::Object(map) = value {
        for required in schema["required"].as_array().into_iter().flatten() {
            let name = required.as_str().unwrap();
            if !map.contains_key(name) {
                return Err(format!("missing required property {name}"));
            }
        }
        if let Some(properties) = schema["properties"].as_object() {
            for (k, v) in map {
                if let Some(s) = properties.get(k) {
                    validate(s, v, root).map_err(|e| format!("{k}: {e}"))?;
                }
            }
        }
    }
    Ok(())
}
