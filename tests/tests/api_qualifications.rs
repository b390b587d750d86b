//! Reaching the right person, through the real server on both backends:
//! operators grant and revoke workers' qualifications (audited); a task's
//! requirements decide which workers see it in every list, can open it and
//! can claim it (404 otherwise, as for a task that does not exist); a
//! lapsed grant counts as absent; a worker who loses a qualification keeps
//! the task it holds; an agent's principal blocks a worker from all of its
//! tasks and only its own.

use chrono::TimeDelta;
use meatspace_tests::Db;
use meatspace_tests::server::{
    Expect, TestServer, array_at, str_at, task_and_token, uuid_at, worker_path,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

meatspace_tests::api_tests!(
    operators_grant_and_revoke_qualifications_and_the_trail_records_it,
    requirements_decide_who_sees_opens_and_claims_a_task,
    a_principal_blocks_a_worker_from_its_own_tasks_only,
);

fn grant_path(worker: Uuid, name: &str) -> String {
    format!("/api/v1/workers/{worker}/qualifications/{name}")
}

async fn grant(srv: &TestServer, worker: Uuid, name: &str, body: Value) -> Value {
    srv.dev(Method::PUT, &grant_path(worker, name))
        .json(&body)
        .expect_json(StatusCode::OK)
        .await
}

/// The ids of the open tasks a worker lists (the plain list and the
/// nearby one, which must agree on which tasks it may see).
async fn listed(srv: &TestServer, token: &str) -> Vec<Uuid> {
    let ids = |page: Value| -> Vec<Uuid> {
        array_at(&page, "/tasks")
            .iter()
            .map(|t| uuid_at(t, "/id"))
            .collect()
    };
    let plain = ids(srv
        .worker(token)
        .get_json("/api/v1/worker/tasks?limit=100")
        .await);
    let mut near = ids(srv
        .worker(token)
        .get_json("/api/v1/worker/tasks?near=52.5,13.4&limit=100")
        .await);
    let mut sorted = plain.clone();
    sorted.sort();
    near.sort();
    assert_eq!(sorted, near, "the nearby list shows the same tasks");
    plain
}

async fn operators_grant_and_revoke_qualifications_and_the_trail_records_it(db: Db) {
    let srv = TestServer::start(db).await;
    let (worker, token) = srv.register_worker("Ada").await;
    let granted = grant(&srv, worker, "language:de", json!({})).await;
    assert_eq!(granted["name"], "language:de");
    assert!(granted.get("value").is_none());
    grant(&srv, worker, "level", json!({ "value": 3 })).await;
    let expires = srv.now() + TimeDelta::days(30);
    grant(
        &srv,
        worker,
        "vehicle",
        json!({ "value": "car", "expires_at": expires }),
    )
    .await;
    // A grant again replaces the value.
    grant(&srv, worker, "level", json!({ "value": 4 })).await;

    let own = srv
        .worker(&token)
        .get_json("/api/v1/worker/qualifications")
        .await;
    let names: Vec<&str> = array_at(&own, "/qualifications")
        .iter()
        .map(|q| q["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["language:de", "level", "vehicle"]);
    assert_eq!(own["qualifications"][1]["value"], 4);
    assert_eq!(own["qualifications"][2]["value"], "car");
    let seen = srv
        .dev_get_json(&format!("/api/v1/workers/{worker}/qualifications"))
        .await;
    assert_eq!(seen, own, "the operator sees what the worker sees");

    let left = srv
        .dev(Method::DELETE, &grant_path(worker, "level"))
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(left["qualifications"].as_array().map(Vec::len), Some(2));
    srv.dev(Method::DELETE, &grant_path(worker, "level"))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;

    // Refusals: a bad name, an empty text, a past expiry, no such worker,
    // and a worker's token is not an operator's.
    for (path, body, status) in [
        (
            grant_path(worker, "Bad Name"),
            json!({}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            grant_path(worker, "a"),
            json!({ "value": " " }),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            grant_path(worker, "a"),
            json!({ "expires_at": srv.now() - TimeDelta::hours(1) }),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            grant_path(Uuid::new_v4(), "a"),
            json!({}),
            StatusCode::NOT_FOUND,
        ),
    ] {
        srv.dev(Method::PUT, &path)
            .json(&body)
            .expect_problem(status)
            .await;
    }
    srv.worker(&token)
        .request(Method::PUT, &grant_path(worker, "a"))
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;

    let trail = srv.dev_get_json("/api/v1/audit?limit=20").await;
    let actions: Vec<(String, String)> = array_at(&trail, "/entries")
        .iter()
        .map(|e| (str_at(e, "/action"), str_at(e, "/target")))
        .collect();
    let target = format!("worker:{worker}");
    for action in ["worker.qualified", "worker.unqualified"] {
        assert!(
            actions.contains(&(action.to_owned(), target.clone())),
            "{action} in {actions:?}"
        );
    }
    assert_eq!(
        actions
            .iter()
            .filter(|(a, _)| a == "worker.qualified")
            .count(),
        4,
        "one entry per grant, none for a refused one"
    );
}

async fn requirements_decide_who_sees_opens_and_claims_a_task(db: Db) {
    let srv = TestServer::start(db).await;
    let (driver, driver_token) = srv.register_worker("Driver").await;
    let (walker, walker_token) = srv.register_worker("Walker").await;
    grant(&srv, driver, "vehicle", json!({ "value": "car" })).await;
    grant(&srv, driver, "level", json!({ "value": 3 })).await;
    grant(&srv, walker, "level", json!({ "value": 5 })).await;

    let open = |body: Value| async {
        let created = srv.create_task_with(body).await;
        let (id, token) = task_and_token(&created);
        srv.publish(id, &token).await;
        (id, token)
    };
    let (by_car, car_token) = open(json!({
        "description": "Bring the boxes to the depot",
        "requirements": [{ "qualification": "vehicle", "in": ["car", "van"] },
                         { "qualification": "level", "at_least": 2 }],
    }))
    .await;
    let (senior, _) = open(json!({
        "description": "Check the inventory",
        "requirements": [{ "qualification": "level", "at_least": 4 }],
    }))
    .await;
    let (anyone, _) = srv.create_open_task("Water the plants").await;
    let task = srv.task(by_car, &car_token).await;
    assert_eq!(task["requirements"][0]["in"], json!(["car", "van"]));

    let mut driver_sees = listed(&srv, &driver_token).await;
    driver_sees.sort();
    let mut expected = vec![by_car, anyone];
    expected.sort();
    assert_eq!(driver_sees, expected);
    let mut walker_sees = listed(&srv, &walker_token).await;
    walker_sees.sort();
    let mut expected = vec![senior, anyone];
    expected.sort();
    assert_eq!(walker_sees, expected);

    // Not for the walker: it does not exist for it.
    srv.worker(&walker_token)
        .get(&worker_path(by_car, ""))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    srv.worker(&walker_token)
        .post(&worker_path(by_car, "/claim"))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    assert_eq!(srv.task(by_car, &car_token).await["state"], "open");

    // A lapsed grant counts as absent.
    let soon = srv.now() + TimeDelta::minutes(5);
    grant(
        &srv,
        walker,
        "vehicle",
        json!({ "value": "van", "expires_at": soon }),
    )
    .await;
    assert!(listed(&srv, &walker_token).await.contains(&by_car));
    srv.advance_clock_past(soon);
    assert!(!listed(&srv, &walker_token).await.contains(&by_car));

    // The driver claims it, then loses the qualification: the task stays
    // its own, to start and complete.
    srv.worker_post(by_car, &driver_token, "claim").await;
    srv.dev(Method::DELETE, &grant_path(driver, "vehicle"))
        .send()
        .await
        .expect("revoke");
    srv.worker(&driver_token)
        .get_json(&worker_path(by_car, ""))
        .await;
    srv.worker_post(by_car, &driver_token, "start").await;
    srv.worker_post(by_car, &driver_token, "complete").await;

    // Requirements outside the language are refused at create, nothing written.
    let before = srv.counts().await;
    for (requirements, says) in [
        (json!([{ "qualification": "Level" }]), "lowercase"),
        (
            json!([{ "qualification": "level", "equals": 1, "in": [1] }]),
            "not both",
        ),
        (
            json!([{ "qualification": "level", "at_least": 5, "at_most": 1 }]),
            "nobody",
        ),
        (
            json!([{ "qualification": "level", "more_than": 1 }]),
            "unknown field",
        ),
    ] {
        let problem = srv
            .dev(Method::POST, "/api/v1/tasks")
            .json(&json!({ "description": "x", "requirements": requirements }))
            .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
            .await;
        assert!(str_at(&problem, "/detail").contains(says), "{problem}");
    }
    assert_eq!(srv.counts().await.tasks, before.tasks);
}

async fn a_principal_blocks_a_worker_from_its_own_tasks_only(db: Db) {
    let srv = TestServer::start(db).await;
    let (worker, token) = srv.register_worker("Ada").await;
    let other_key = srv
        .dev(Method::POST, "/api/v1/keys")
        .json(&json!({ "name": "other agent" }))
        .expect_json(StatusCode::CREATED)
        .await;
    let other = str_at(&other_key, "/secret");
    let (mine, _) = srv
        .create_open_task("The development principal's task")
        .await;
    let theirs = {
        let created = srv
            .agent(&other)
            .post("/api/v1/tasks")
            .json(&json!({ "description": "Another principal's task" }))
            .expect_json(StatusCode::CREATED)
            .await;
        let (id, task_token) = task_and_token(&created);
        srv.publish(id, &task_token).await;
        id
    };

    let block = |method: Method| srv.dev(method, &format!("/api/v1/blocks/{worker}"));
    let answered = block(Method::PUT).expect_json(StatusCode::OK).await;
    let blocks = srv.dev_get_json("/api/v1/blocks").await;
    assert_eq!(blocks, answered);
    assert_eq!(blocks["blocks"][0]["worker_id"], json!(worker));
    let other_blocks = srv.agent(&other).get_json("/api/v1/blocks").await;
    assert_eq!(
        other_blocks["blocks"],
        json!([]),
        "a block list is per principal"
    );

    assert_eq!(listed(&srv, &token).await, vec![theirs]);
    srv.worker(&token)
        .post(&worker_path(mine, "/claim"))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;

    let after = block(Method::DELETE).expect_json(StatusCode::OK).await;
    assert_eq!(after["blocks"], json!([]));
    block(Method::DELETE)
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    srv.dev(Method::PUT, &format!("/api/v1/blocks/{}", Uuid::new_v4()))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    let mut sees = listed(&srv, &token).await;
    sees.sort();
    let mut both = vec![mine, theirs];
    both.sort();
    assert_eq!(sees, both);
    srv.worker_post(mine, &token, "claim").await;

    let trail = srv.dev_get_json("/api/v1/audit?limit=20").await;
    let actions: Vec<String> = array_at(&trail, "/entries")
        .iter()
        .map(|e| str_at(e, "/action"))
        .collect();
    assert!(
        actions.contains(&"worker.blocked".to_owned()),
        "{actions:?}"
    );
    assert!(
        actions.contains(&"worker.unblocked".to_owned()),
        "{actions:?}"
    );
}
