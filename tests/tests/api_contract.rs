//! The agent-facing contract: `GET /api/v1/capabilities` keeps every field
//! of the seed document with the same value, every endpoint it names is in
//! the OpenAPI document, every route of the OpenAPI document is served, and
//! the document describes responses as they are sent (errors as problem
//! documents, photos as binary strings, one operationId per operation).
//! `scripts/openapi-check.sh` goes further with a spec validator, a fuzzer
//! and a generated client.

use std::collections::BTreeSet;
use std::path::PathBuf;

use chrono::TimeDelta;
use meatspace_api::photo::PhotoLimits;
use meatspace_domain::Policy;
use meatspace_tests::Db;
use meatspace_tests::server::{Expect, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use uuid::Uuid;

meatspace_tests::api_tests!(
    capabilities_keep_every_field_of_the_seed,
    capabilities_report_the_configured_limits,
    capability_endpoints_are_in_the_openapi_document,
    every_openapi_route_is_served,
    the_openapi_document_describes_what_is_sent,
    each_part_of_the_api_takes_what_the_document_says,
);

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The seed contract, as checked into the repository.
fn seed() -> Value {
    let path = manifest_dir().join("fixtures/seed-capabilities.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("the seed is JSON")
}

/// Collects every place where `actual` does not contain `expected`: objects
/// may have extra keys, everything else must be equal.
fn missing_from(actual: &Value, expected: &Value, at: &str, out: &mut Vec<String>) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (key, e_value) in e {
                let here = format!("{at}/{key}");
                match a.get(key) {
                    Some(a_value) => missing_from(a_value, e_value, &here, out),
                    None => out.push(format!("{here}: missing (expected {e_value})")),
                }
            }
        }
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => {
            for (i, (a_item, e_item)) in a.iter().zip(e).enumerate() {
                missing_from(a_item, e_item, &format!("{at}/{i}"), out);
            }
        }
        _ if actual == expected => {}
        _ => out.push(format!("{at}: expected {expected}, got {actual}")),
    }
}

#[test]
fn superset_check_finds_changed_and_missing_fields() {
    let seed = serde_json::json!({"a": {"b": [1, 2]}, "c": "x"});
    let mut out = Vec::new();
    missing_from(
        &serde_json::json!({"a": {"b": [1, 2], "extra": 1}, "c": "x", "d": 0}),
        &seed,
        "",
        &mut out,
    );
    assert!(out.is_empty(), "{out:?}");
    missing_from(&serde_json::json!({"a": {"b": [1]}}), &seed, "", &mut out);
    assert_eq!(out.len(), 2, "{out:?}");
}

/// The checked-in copy is the contract the suite checks, so a fresh clone
/// passes on its own. It must not drift from the shared seed when that lies
/// next to the repository (`../shared`, as the development checkouts lay it
/// out): then the two must be equal. `MEATSPACE_SEED` names another path,
/// and a path named that way must exist.
#[test]
fn fixture_equals_the_shared_seed() {
    let (shared, named) = match std::env::var_os("MEATSPACE_SEED") {
        Some(p) => (PathBuf::from(p), true),
        None => (
            manifest_dir().join("../../shared/seed/capabilities.json"),
            false,
        ),
    };
    let text = match std::fs::read_to_string(&shared) {
        Ok(text) => text,
        Err(e) if !named && e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "no shared seed at {}: the checked-in copy is the contract",
                shared.display()
            );
            return;
        }
        Err(e) => panic!("cannot read the shared seed {}: {e}", shared.display()),
    };
    let parsed: Value = serde_json::from_str(&text).expect("the shared seed is JSON");
    assert_eq!(
        seed(),
        parsed,
        "tests/fixtures/seed-capabilities.json differs from {}",
        shared.display()
    );
}

async fn capabilities(srv: &TestServer) -> Value {
    let res = srv
        .get("/api/v1/capabilities")
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::OK);
    let content_type = res.headers()[reqwest::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    res.json().await.expect("capabilities are JSON")
}

async fn capabilities_keep_every_field_of_the_seed(db: Db) {
    let srv = TestServer::start(db).await;
    let doc = capabilities(&srv).await;
    let mut missing = Vec::new();
    let mut expected = seed();
    // The server makes these two wake-ups real; every other seed value
    // stays as the seed has it.
    let wakeups = &mut expected["task_monitoring"]["wakeups"];
    for mechanism in ["webhook", "sse"] {
        assert_eq!(wakeups[mechanism], "not_yet_supported", "the seed changed");
        wakeups[mechanism] = "supported".into();
    }
    missing_from(&doc, &expected, "", &mut missing);
    assert!(
        missing.is_empty(),
        "the capabilities document breaks the seed contract:\n{}",
        missing.join("\n")
    );
    srv.stop().await;
}

/// The document is generated from configuration, so an agent learns the
/// limits this server enforces, not defaults.
async fn capabilities_report_the_configured_limits(db: Db) {
    let srv = TestServer::start_configured(db, |o| {
        o.photo_limits = PhotoLimits {
            max_pixels: 333_333,
            max_task_bytes: 4_444_444,
            ..PhotoLimits::new(123_456, 777)
        }
    })
    .await;
    let doc = capabilities(&srv).await;
    assert_eq!(doc["limits"]["photo_bytes"], 123_456);
    assert_eq!(doc["limits"]["photo_max_dimension"], 777);
    assert_eq!(doc["limits"]["photo_max_pixels"], 333_333);
    assert_eq!(doc["limits"]["photo_bytes_per_task"], 4_444_444);
    assert_eq!(doc["limits"]["description_chars"], 4000);
    let kinds = doc["issue_protocol"]["issue_kinds"]
        .as_array()
        .expect("issue kinds are listed");
    assert!(
        kinds.iter().any(|k| k == "unclear_instructions"),
        "{kinds:?}"
    );
}

async fn openapi(srv: &TestServer) -> Value {
    srv.get_json("/api/v1/openapi.json").await
}

/// Every `{method, path}` in the capabilities document.
fn endpoints(doc: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = doc["endpoints"]
        .as_object()
        .expect("endpoints object")
        .values()
        .map(|e| {
            let path = e["path"].as_str().expect("endpoint path");
            // Query templates are not part of the path.
            let path = path.split('?').next().unwrap_or_default();
            (
                e["method"].as_str().expect("endpoint method").to_owned(),
                path.to_owned(),
            )
        })
        .collect();
    let monitoring = doc["task_monitoring"]["endpoint"]
        .as_str()
        .expect("monitoring endpoint");
    out.push((
        "GET".into(),
        monitoring.split('?').next().unwrap_or_default().to_owned(),
    ));
    out
}

async fn capability_endpoints_are_in_the_openapi_document(db: Db) {
    let srv = TestServer::start(db).await;
    let caps = capabilities(&srv).await;
    let api = openapi(&srv).await;
    let listed = endpoints(&caps);
    assert!(listed.len() >= 6, "{listed:?}");
    let missing: Vec<String> = listed
        .iter()
        .filter(|(method, path)| api["paths"][path.as_str()][method.to_ascii_lowercase()].is_null())
        .map(|(method, path)| format!("{method} {path}"))
        .collect();
    assert!(
        missing.is_empty(),
        "capabilities name endpoints the OpenAPI document lacks: {missing:?}"
    );
}

/// Fills path templates with well-formed ids.
fn concrete(path: &str) -> String {
    path.replace("{task_id}", &Uuid::new_v4().to_string())
        .replace("{photo_id}", &Uuid::new_v4().to_string())
        .replace("{event_id}", "1")
}

async fn every_openapi_route_is_served(db: Db) {
    let srv = TestServer::start(db).await;
    let api = openapi(&srv).await;
    let paths = api["paths"].as_object().expect("paths object");
    let mut checked = 0;
    for (template, item) in paths {
        assert!(
            !template.contains('{') || template.contains("_id}"),
            "unexpected path parameter in {template}"
        );
        for method in ["get", "post", "put", "patch", "delete"] {
            if item[method].is_null() {
                continue;
            }
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let res = srv
                .request(method.clone(), &concrete(template))
                .send()
                .await
                .expect("request");
            let status = res.status();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            assert!(
                status != StatusCode::METHOD_NOT_ALLOWED
                    && !(status == StatusCode::NOT_FOUND && body["detail"] == "no such route"),
                "{method} {template} is documented but not routed: {status} {body}"
            );
            assert!(
                !status.is_server_error(),
                "{method} {template}: {status} {body}"
            );
            // What an anonymous call gets (mostly 401) is documented.
            let documented = &item[method.as_str().to_ascii_lowercase()]["responses"];
            assert!(
                !documented[status.as_str()].is_null(),
                "{method} {template} answers {status}, which its responses do not list"
            );
            checked += 1;
        }
    }
    // Capabilities, the agent API (7) and the worker API (11).
    assert!(checked >= 19, "only {checked} operations documented");
    // The probes are served too, outside the API document; the metrics
    // on their own listener only.
    for path in ["/livez", "/readyz", "/api/v1/openapi.json"] {
        let res = srv.get(path).send().await.expect("request");
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    let res = srv.metrics().send().await.expect("request");
    assert_eq!(res.status(), StatusCode::OK, "/metrics");
    let res = srv.get("/metrics").send().await.expect("request");
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "/metrics on the API port"
    );
    // And the fallback really is what an unknown route gets.
    let body = srv
        .get("/api/v1/no-such-thing")
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    assert_eq!(body["detail"], "no such route");
}

/// Every operation of the document, as `(label, operation)`.
fn operations(api: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for (path, item) in api["paths"].as_object().expect("paths object") {
        for (method, op) in item.as_object().expect("path item") {
            out.push((format!("{} {path}", method.to_ascii_uppercase()), op));
        }
    }
    out
}

/// Fills every path parameter: `{task_id}` with `task`, the others with a
/// well-formed value that names nothing.
fn filled(template: &str, task: Uuid) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let end = rest[start..].find('}').expect("a closed parameter") + start;
        out.push_str(&rest[..start]);
        out.push_str(&match &rest[start + 1..end] {
            "task_id" => task.to_string(),
            "name" => "no-such-name".to_owned(),
            _ => Uuid::nil().to_string(),
        });
        rest = &rest[end + 1..];
    }
    out + rest
}

/// The document says what the operator API (its tag), the worker API and
/// a task's routes (their paths) take, and the handlers agree. A credential
/// of the wrong kind is refused: an agent's API key gets 403 from the
/// operator API and 401 from the worker API, a worker token 401 from a
/// task's routes. The right one is let through (whatever the call answers
/// then, it is not 401 or 403): the development key, a worker token, the
/// task's agent token.
async fn each_part_of_the_api_takes_what_the_document_says(db: Db) {
    let srv = TestServer::start(db).await;
    let api = openapi(&srv).await;
    let created = srv
        .dev(Method::POST, "/api/v1/keys")
        .json(&serde_json::json!({ "name": "an agent" }))
        .expect_json(StatusCode::CREATED)
        .await;
    let agent_key = created["secret"].as_str().expect("the key's secret");
    let (_, worker_token) = srv.register_worker("Ada").await;
    let (task, agent_token) = srv.create_task("Count the benches in the park").await;
    let operator_security = serde_json::json!([{ "api_key": ["operator"] }, { "dev_key": [] }]);
    let worker_security = serde_json::json!([{ "worker_token": [] }]);
    let task_security = serde_json::json!([{ "agent_token": [] }, { "api_key": ["tasks"] }]);
    let mut checked = [0; 3];
    for (label, op) in operations(&api) {
        let (method, template) = label.split_once(' ').expect("METHOD path");
        let operator = op["tags"]
            .as_array()
            .expect("tags")
            .contains(&"operator".into());
        let worker = template.starts_with("/api/v1/worker/");
        // The event stream says on its own that it takes the agent token.
        let task_route = template.starts_with("/api/v1/tasks/{task_id}")
            && !template.ends_with("/events/stream");
        assert_eq!(operator, op["security"] == operator_security, "{label}");
        assert_eq!(worker, op["security"] == worker_security, "{label}");
        assert_eq!(task_route, op["security"] == task_security, "{label}");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let path = filled(template, task);
        let (part, wrong, refusal, right) = match (operator, worker, task_route) {
            (true, _, _) => (
                0,
                agent_key,
                StatusCode::FORBIDDEN,
                srv.dev(method.clone(), &path),
            ),
            (_, true, _) => {
                let right = srv.worker(&worker_token).request(method.clone(), &path);
                (1, agent_key, StatusCode::UNAUTHORIZED, right)
            }
            (_, _, true) => {
                let right = srv.agent(&agent_token).request(method.clone(), &path);
                (2, worker_token.as_str(), StatusCode::UNAUTHORIZED, right)
            }
            _ => continue,
        };
        checked[part] += 1;
        srv.bearer(wrong)
            .request(method, &path)
            .expect_problem(refusal)
            .await;
        let status = right.send().await.expect("request").status();
        assert!(
            ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status),
            "{label}, let through: {status}"
        );
    }
    // Keys (5), workers (4), invites (2), qualifications (3), the audit
    // trail; tasks (10), qualifications, preferences, push (3); a task (8).
    assert!(
        checked[0] >= 15 && checked[1] >= 16 && checked[2] >= 8,
        "only {checked:?} operations"
    );
    srv.stop().await;
}

/// What each operation of the document promises, checked against what the
/// handlers do: the errors they can send are listed, each as a problem
/// document; photos travel as binary strings; operationIds are unique (spec
/// validators reject duplicates, and client generators name methods by
/// them); configured limits are written in.
async fn the_openapi_document_describes_what_is_sent(db: Db) {
    let policy = Policy {
        min_lifetime: TimeDelta::seconds(90),
        max_lifetime: TimeDelta::hours(5),
        ..Policy::default()
    };
    let srv = TestServer::start_with_policy(db, policy).await;
    let api = openapi(&srv).await;
    let ops = operations(&api);
    assert!(ops.len() >= 20, "only {} operations", ops.len());

    let mut ids = BTreeSet::new();
    for (label, op) in &ops {
        let id = op["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{label}: no operationId"));
        assert!(
            ids.insert(id.to_owned()),
            "{label}: operationId {id} is used twice"
        );

        let responses = op["responses"].as_object().expect("responses");
        for (status, response) in responses {
            let content = response["content"].as_object();
            if status.starts_with('4') || status.starts_with('5') {
                let content = content.unwrap_or_else(|| panic!("{label} {status}: no content"));
                assert_eq!(
                    content.keys().collect::<Vec<_>>(),
                    ["application/problem+json"],
                    "{label} {status}"
                );
                assert_eq!(
                    content["application/problem+json"]["schema"]["$ref"],
                    "#/components/schemas/Problem",
                    "{label} {status}"
                );
            } else {
                assert!(
                    content.is_some_and(|c| !c.is_empty()),
                    "{label} {status}: no body"
                );
            }
        }
        let has = |status: &str| responses.contains_key(status);
        if op["security"].is_array() {
            // Every credential is checked against the database.
            assert!(has("401") && has("503"), "{label}: 401 or 503 missing");
        }
        if op["requestBody"]["content"]["application/json"].is_object() {
            for status in ["400", "413", "415", "422"] {
                assert!(has(status), "{label}: a JSON body can be answered {status}");
            }
        }
        if label.contains("{task_id}") {
            assert!(has("404"), "{label}: 404 missing");
        }
    }
    for id in [
        "get_task",
        "worker_get_task",
        "task_events",
        "worker_task_events",
    ] {
        assert!(ids.contains(id), "no operation {id}: {ids:?}");
    }

    let binary_images = |content: &Value, label: &str| {
        let types: Vec<&String> = content.as_object().expect("content").keys().collect();
        assert_eq!(types, ["image/jpeg", "image/png", "image/webp"], "{label}");
        for (_, media) in content.as_object().unwrap() {
            let schema = match media["schema"]["$ref"].as_str() {
                Some(r) => &api["components"]["schemas"][r.rsplit('/').next().unwrap()],
                None => &media["schema"],
            };
            assert_eq!(
                (&schema["type"], &schema["format"]),
                (&Value::from("string"), &Value::from("binary")),
                "{label}: {schema}"
            );
        }
    };
    let upload = &api["paths"]["/api/v1/worker/tasks/{task_id}/photos"]["post"];
    binary_images(&upload["requestBody"]["content"], "photo upload");
    let download = &api["paths"]["/api/v1/tasks/{task_id}/photos/{photo_id}"]["get"];
    binary_images(&download["responses"]["200"]["content"], "photo download");

    let lifetime =
        &api["components"]["schemas"]["CreateTaskRequest"]["properties"]["expires_in_seconds"];
    assert_eq!(
        (&lifetime["minimum"], &lifetime["maximum"]),
        (&90.into(), &(5 * 3600).into())
    );
    srv.stop().await;
}
