//! The agent-facing contract: `GET /api/v1/capabilities` keeps every field
//! of the seed document with the same value, every endpoint it names is in
//! the OpenAPI document, and every route of the OpenAPI document is served.

use std::path::PathBuf;

use meatspace_api::photo::PhotoLimits;
use meatspace_tests::Db;
use meatspace_tests::server::{Expect, ServerOptions, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use uuid::Uuid;

meatspace_tests::api_tests!(
    capabilities_keep_every_field_of_the_seed,
    capabilities_report_the_configured_limits,
    capability_endpoints_are_in_the_openapi_document,
    every_openapi_route_is_served,
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

/// The checked-in copy must not drift from the shared seed when the shared
/// directory is next to the repository (it is not in every checkout).
#[test]
fn fixture_equals_the_shared_seed() {
    let shared = manifest_dir().join("../../shared/seed/capabilities.json");
    let Ok(text) = std::fs::read_to_string(&shared) else {
        // Only the copy exists in this checkout; the other tests use it.
        return;
    };
    let shared: Value = serde_json::from_str(&text).expect("the shared seed is JSON");
    assert_eq!(
        seed(),
        shared,
        "tests/fixtures/seed-capabilities.json differs from {}",
        manifest_dir()
            .join("../../shared/seed/capabilities.json")
            .display()
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
    // Issue 9 made these two wake-ups real; every other seed value stays.
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
    let srv = TestServer::start_with(
        db,
        ServerOptions {
            photo_limits: PhotoLimits {
                max_bytes: 123_456,
                max_dimension: 777,
            },
            ..ServerOptions::default()
        },
    )
    .await;
    let doc = capabilities(&srv).await;
    assert_eq!(doc["limits"]["photo_bytes"], 123_456);
    assert_eq!(doc["limits"]["photo_max_dimension"], 777);
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
    srv.get("/api/v1/openapi.json")
        .expect_json(StatusCode::OK)
        .await
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
            checked += 1;
        }
    }
    // Capabilities, the agent API (7) and the worker API (11).
    assert!(checked >= 19, "only {checked} operations documented");
    // The probes are served too, outside the API document.
    for path in ["/livez", "/readyz", "/metrics", "/api/v1/openapi.json"] {
        let res = srv.get(path).send().await.expect("request");
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    // And the fallback really is what an unknown route gets.
    let body = srv
        .get("/api/v1/no-such-thing")
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    assert_eq!(body["detail"], "no such route");
}
