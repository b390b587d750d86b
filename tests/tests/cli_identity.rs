//! Identity and access from the shell and the local MCP server:
//! the built `meatspace` binary against the real server on both backends.
//! An operator's key (made with the development key, the built-in
//! operator) creates an agent key per agent; each agent creates and lists
//! only its own tasks, reaches them without a stored token after losing
//! its state directory, and gets 404 for the other agent's; a rotated
//! key's old and new secrets both work; a revoked key is refused with a
//! hint; the operator suspends and reinstates a worker and reads the audit
//! trail; no API key secret is ever written to a state directory; and
//! `meatspace mcp` with `MEATSPACE_API_KEY` lists and reads the agent's
//! task without a local record.

use std::path::Path;
use std::process::Stdio;

use meatspace_tests::cli::{
    call_tool as call, call_tool_result, cli_at, json_of, mcp_session, refused, run,
};
use meatspace_tests::server::{Expect, TestServer, array_at};
use meatspace_tests::{Db, api_tests};
use reqwest::StatusCode;
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};
use tokio::process::Command;
use uuid::Uuid;

api_tests!(
    agents_have_their_own_keys_and_tasks,
    operators_manage_keys_and_workers,
    mcp_stdio_reaches_the_agents_tasks_with_its_key,
    a_disabled_dev_key_says_how_to_get_a_key,
    qualifications_requirements_and_blocks_from_the_shell,
);

/// Who a command runs as.
#[derive(Clone, Copy)]
enum As<'a> {
    /// The development key (the built-in operator).
    DevKey,
    /// An API key, with no development key in the environment.
    Key(&'a str),
}

/// A `meatspace` command against `server` with only `who`'s credential.
fn cli(server: &TestServer, state: &Path, who: As<'_>) -> Command {
    let mut cmd = cli_at(&server.base_url, state);
    match who {
        As::DevKey => cmd.env("MEATSPACE_DEV_KEY", &server.dev_key),
        As::Key(key) => cmd.env("MEATSPACE_API_KEY", key),
    };
    cmd
}

/// A new API key made by `who`: its id and secret.
async fn new_key(
    server: &TestServer,
    state: &Path,
    who: As<'_>,
    args: &[&str],
) -> (String, String) {
    let created = json_of(
        cli(server, state, who),
        &[&["key", "create"], args].concat(),
    )
    .await;
    let secret = created["secret"].as_str().expect("secret").to_owned();
    let id = created["key"]["id"].as_str().expect("key id").to_owned();
    let simple = Uuid::parse_str(&id).expect("key id").simple().to_string();
    assert!(
        secret.starts_with(&format!("msk_{simple}_")),
        "the secret embeds the key id: {secret} / {id}"
    );
    (id, secret)
}

/// The secret of an operator key "ops", made with the development key.
async fn operator_key(server: &TestServer, state: &Path) -> String {
    let (_, op) = new_key(
        server,
        state,
        As::DevKey,
        &["--name", "ops", "--kind", "operator"],
    )
    .await;
    op
}

/// An operator key (see [`operator_key`]), and with it the keys "agent-a"
/// and "agent-b": their secrets (operator, a, b).
async fn operator_and_two_agents(server: &TestServer, state: &Path) -> (String, String, String) {
    let op = operator_key(server, state).await;
    let (_, a) = new_key(server, state, As::Key(&op), &["--name", "agent-a"]).await;
    let (_, b) = new_key(server, state, As::Key(&op), &["--name", "agent-b"]).await;
    (op, a, b)
}

/// The item of the list at `pointer` in `list` whose id is `id`.
fn listed_with_id<'a>(list: &'a Value, pointer: &str, id: &str) -> &'a Value {
    array_at(list, pointer)
        .iter()
        .find(|item| item["id"] == id)
        .unwrap_or_else(|| panic!("{id} is not listed at {pointer}: {list}"))
}

fn listed_ids(list: &Value) -> Vec<String> {
    array_at(list, "/tasks")
        .iter()
        .map(|t| t["id"].as_str().expect("id").to_owned())
        .collect()
}

/// Every file under `dir`, read as text.
fn files_text(dir: &Path) -> String {
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            out.push_str(&files_text(&path));
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            out.push_str(&text);
        }
    }
    out
}

async fn worker_action(server: &TestServer, token: &str, task: &str, action: &str) {
    server
        .worker(token)
        .post(&format!("/api/v1/worker/tasks/{task}/{action}"))
        .json(&json!({}))
        .expect_json(StatusCode::OK)
        .await;
}

async fn agents_have_their_own_keys_and_tasks(db: Db) {
    let server = TestServer::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    let ops_state = dir.path().join("ops");
    let (a_state, a_lost, b_state) = (
        dir.path().join("a"),
        dir.path().join("a-again"),
        dir.path().join("b"),
    );
    let (op, a, b) = operator_and_two_agents(&server, &ops_state).await;

    // Agent A creates a task with its key alone (no development key).
    let created = json_of(
        cli(&server, &a_state, As::Key(&a)),
        &["task", "create", "--description", "A's errand", "--publish"],
    )
    .await;
    let task = created["task"]["id"].as_str().expect("task id").to_owned();
    let mine = json_of(cli(&server, &a_state, As::Key(&a)), &["task", "list"]).await;
    assert_eq!(listed_ids(&mine), [task.as_str()], "{mine}");
    assert_eq!(mine["tasks"][0]["local"], true, "{mine}");

    // Agent B neither lists nor reads it: 404 (exit 4), so ids cannot be probed.
    let theirs = json_of(cli(&server, &b_state, As::Key(&b)), &["task", "list"]).await;
    assert!(listed_ids(&theirs).is_empty(), "{theirs}");
    let err = refused(
        cli(&server, &b_state, As::Key(&b)),
        &["task", "get", &task],
        4,
    )
    .await;
    assert_eq!(err["status"], 404, "{err}");
    refused(
        cli(&server, &b_state, As::Key(&b)),
        &["task", "cancel", &task],
        4,
    )
    .await;
    // Nor registers a worker: an agent key has only the `tasks` scope.
    refused(
        cli(&server, &b_state, As::Key(&b)),
        &["worker", "register", "--name", "Mallory"],
        3,
    )
    .await;

    // A, having lost its state directory, finds the task again with its
    // key and follows it to the end without the task token.
    let found = json_of(cli(&server, &a_lost, As::Key(&a)), &["task", "list"]).await;
    assert_eq!(listed_ids(&found), [task.as_str()], "{found}");
    assert_eq!(found["tasks"][0]["local"], false, "{found}");
    let got = json_of(cli(&server, &a_lost, As::Key(&a)), &["task", "get", &task]).await;
    assert_eq!(got["state"], "open", "{got}");
    let (_, wtoken) = server.register_worker("Ada").await;
    for action in ["claim", "start", "complete"] {
        worker_action(&server, &wtoken, &task, action).await;
    }
    let watched = run(
        cli(&server, &a_lost, As::Key(&a)),
        &["--output", "json", "task", "watch", &task],
    )
    .await;
    assert!(watched.status.success(), "{}", watched.stderr);
    let last: Value =
        serde_json::from_str(watched.stdout.lines().last().expect("output")).expect("JSON line");
    assert_eq!(last["kind"], "final", "{last}");
    assert_eq!(last["task"]["state"], "completed", "{last}");
    let completed = json_of(
        cli(&server, &a_lost, As::Key(&a)),
        &["task", "list", "--state", "completed"],
    )
    .await;
    assert_eq!(listed_ids(&completed), [task.as_str()], "{completed}");
    let open = json_of(
        cli(&server, &a_lost, As::Key(&a)),
        &["task", "list", "--state", "open"],
    )
    .await;
    assert!(listed_ids(&open).is_empty(), "{open}");

    // The record kept for the adopted task has no token, and no API key
    // secret is in any state directory.
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(a_lost.join(format!("tasks/{task}.json"))).unwrap(),
    )
    .unwrap();
    assert!(record.get("agent_token").is_none(), "{record}");
    assert!(record["cursor"].as_i64().unwrap() > 0, "{record}");
    for state in [&ops_state, &a_state, &a_lost, &b_state] {
        let text = files_text(state);
        for secret in [&op, &a, &b] {
            assert!(
                !text.contains(secret.as_str()),
                "{} holds an API key secret",
                state.display()
            );
        }
    }
}

async fn operators_manage_keys_and_workers(db: Db) {
    let server = TestServer::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ops");
    let op = operator_key(&server, &state).await;
    let op_key = json_of(cli(&server, &state, As::Key(&op)), &["key", "list"]).await;
    let op_principal = array_at(&op_key, "/keys")
        .iter()
        .find(|k| k["name"] == "ops")
        .expect("the operator's key is listed")["principal"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The secret is printed once in the human output.
    let ran = run(
        cli(&server, &state, As::Key(&op)),
        &["key", "create", "--name", "agent-a"],
    )
    .await;
    assert!(ran.status.success(), "{}", ran.stderr);
    let secret_line = ran
        .stdout
        .lines()
        .find(|l| l.starts_with("secret"))
        .expect("a secret line");
    let a = secret_line.rsplit(' ').next().unwrap().to_owned();
    assert!(a.starts_with("msk_"), "{secret_line}");
    assert_eq!(ran.stdout.matches(&a).count(), 1, "{}", ran.stdout);
    let a_id = Uuid::parse_str(a.split('_').nth(1).unwrap()).unwrap();

    // An agent key is no operator's: 403, exit 3, with a hint.
    let err = refused(cli(&server, &state, As::Key(&a)), &["key", "list"], 3).await;
    assert_eq!(err["status"], 403, "{err}");
    assert!(
        err["hint"].as_str().unwrap_or("").contains("operator"),
        "{err}"
    );

    // Rotation: the old secret works through the grace period, the new one too.
    let rotated = json_of(
        cli(&server, &state, As::Key(&op)),
        &["key", "rotate", &a_id.to_string(), "--grace-seconds", "600"],
    )
    .await;
    let a2 = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(a2, a);
    assert!(a2.starts_with(&format!("msk_{}_", a_id.simple())), "{a2}");
    assert!(
        rotated["key"]["previous_valid_until"].is_string(),
        "{rotated}"
    );
    for secret in [&a, &a2] {
        json_of(cli(&server, &state, As::Key(secret)), &["task", "list"]).await;
    }

    // Revocation: refused at once, with a hint that says what to do.
    let revoked = json_of(
        cli(&server, &state, As::Key(&op)),
        &["key", "revoke", &a_id.simple().to_string()],
    )
    .await;
    assert!(revoked["key"]["revoked_at"].is_string(), "{revoked}");
    for secret in [&a, &a2] {
        let err = refused(cli(&server, &state, As::Key(secret)), &["task", "list"], 3).await;
        assert_eq!(err["status"], 401, "{err}");
        assert!(
            err["hint"].as_str().unwrap_or("").contains("API key"),
            "{err}"
        );
    }

    // Workers: suspend and reinstate; the suspended worker's own commands
    // are refused meanwhile, with a hint that says why that may be.
    let worker_state = dir.path().join("worker");
    let registered = json_of(
        cli(&server, &worker_state, As::DevKey),
        &["worker", "register", "--name", "Ada"],
    )
    .await;
    let worker = Uuid::parse_str(registered["worker"]["id"].as_str().unwrap()).unwrap();
    json_of(
        cli(&server, &worker_state, As::DevKey),
        &["worker", "tasks"],
    )
    .await;
    let suspended = json_of(
        cli(&server, &state, As::Key(&op)),
        &["worker", "suspend", &worker.to_string(), "--reason", "test"],
    )
    .await;
    assert!(suspended["suspended_at"].is_string(), "{suspended}");
    let workers = json_of(cli(&server, &state, As::Key(&op)), &["worker", "list"]).await;
    let listed = listed_with_id(&workers, "/workers", &worker.to_string());
    assert!(listed["suspended_at"].is_string(), "{listed}");
    let err = refused(
        cli(&server, &worker_state, As::DevKey),
        &["worker", "tasks"],
        3,
    )
    .await;
    assert!(
        err["hint"].as_str().unwrap_or("").contains("suspended"),
        "{err}"
    );
    let reinstated = json_of(
        cli(&server, &state, As::Key(&op)),
        &["worker", "reinstate", &worker.to_string()],
    )
    .await;
    assert!(
        reinstated.get("suspended_at").is_none_or(Value::is_null),
        "{reinstated}"
    );
    json_of(
        cli(&server, &worker_state, As::DevKey),
        &["worker", "tasks"],
    )
    .await;

    // Invites: listed with their creator, revoked.
    let invite = server
        .dev(reqwest::Method::POST, "/api/v1/workers/invites")
        .expect_json(StatusCode::CREATED)
        .await;
    let invite_id = invite["id"].as_str().expect("invite id").to_owned();
    let invites = json_of(cli(&server, &state, As::Key(&op)), &["invite", "list"]).await;
    let listed = listed_with_id(&invites, "/invites", &invite_id);
    assert_eq!(
        listed["created_by"],
        meatspace_domain::identity::DEVELOPMENT_PRINCIPAL.to_string(),
        "{listed}"
    );
    let revoked = json_of(
        cli(&server, &state, As::Key(&op)),
        &["invite", "revoke", &invite_id],
    )
    .await;
    assert!(revoked["revoked_at"].is_string(), "{revoked}");

    // The audit trail has each action, attributed to the operator.
    let audit = json_of(
        cli(&server, &state, As::Key(&op)),
        &["audit", "--principal", &op_principal],
    )
    .await;
    let entries = array_at(&audit, "/entries");
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for want in [
        "key.created",
        "key.rotated",
        "key.revoked",
        "worker.suspended",
        "worker.reinstated",
        "invite.revoked",
    ] {
        assert!(actions.contains(&want), "no {want} in {actions:?}");
    }
    assert!(
        entries
            .iter()
            .all(|e| e["principal"]["id"] == op_principal.as_str()),
        "{audit}"
    );
    let human = run(cli(&server, &state, As::Key(&op)), &["audit"]).await;
    assert!(human.status.success(), "{}", human.stderr);
    assert!(human.stdout.contains("key.revoked"), "{}", human.stdout);
}

/// `meatspace mcp` over its stdio, with `MEATSPACE_API_KEY` only.
async fn mcp(server: &TestServer, state: &Path, key: &str) -> RunningService<RoleClient, ()> {
    let mut cmd = cli(server, state, As::Key(key));
    cmd.arg("mcp");
    mcp_session(cmd, Stdio::null()).await
}

async fn mcp_stdio_reaches_the_agents_tasks_with_its_key(db: Db) {
    let server = TestServer::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    let ops = dir.path().join("ops");
    let (_, a, b) = operator_and_two_agents(&server, &ops).await;
    // A task of A, created with the CLI in another state directory.
    let created = json_of(
        cli(&server, &dir.path().join("cli"), As::Key(&a)),
        &["task", "create", "--description", "fetch milk", "--publish"],
    )
    .await;
    let task = created["task"]["id"].as_str().unwrap().to_owned();

    // The MCP server of A, on an empty state directory, lists and reads it.
    let empty = dir.path().join("mcp-a");
    let client = mcp(&server, &empty, &a).await;
    let listed = call(&client, "list_my_tasks", json!({})).await;
    let ids: Vec<&str> = array_at(&listed, "/tasks")
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [task.as_str()], "{listed}");
    let got = call(&client, "get_task", json!({ "task_id": task })).await;
    assert_eq!(got["task"]["state"], "open", "{got}");
    let page = call(
        &client,
        "wait_for_events",
        json!({ "task_id": task, "cursor": 0, "wait_seconds": 0 }),
    )
    .await;
    assert!(
        !array_at(&page, "/events").is_empty(),
        "the published task has events: {page}"
    );
    // A task it creates belongs to A: the CLI with A's key lists it.
    let made = call(
        &client,
        "create_task",
        json!({ "description": "post a letter" }),
    )
    .await;
    let made_id = made["task"]["id"].as_str().unwrap().to_owned();
    client.cancel().await.ok();
    let mine = json_of(
        cli(&server, &dir.path().join("cli"), As::Key(&a)),
        &["task", "list"],
    )
    .await;
    assert!(listed_ids(&mine).contains(&made_id), "{mine}");
    assert!(
        !files_text(&empty).contains(&a),
        "the MCP server stored the API key"
    );

    // B's MCP server cannot reach A's task: a tool error with 404.
    let client = mcp(&server, &dir.path().join("mcp-b"), &b).await;
    let result = call_tool_result(&client, "get_task", json!({ "task_id": task })).await;
    assert_eq!(result.is_error, Some(true), "{result:?}");
    // The tool's structured problem: the API's status and kind, not a text
    // that merely mentions 404 somewhere.
    let problem = result
        .structured_content
        .as_ref()
        .and_then(|v| v.get("problem"))
        .unwrap_or_else(|| panic!("a structured problem: {result:?}"));
    assert_eq!(problem["status"], 404, "{problem}");
    assert!(
        problem["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("not-found")),
        "{problem}"
    );
    client.cancel().await.ok();
}

async fn a_disabled_dev_key_says_how_to_get_a_key(db: Db) {
    let server = TestServer::start_without_dev_key(db).await;
    let dir = tempfile::tempdir().unwrap();
    let err = refused(
        cli(&server, dir.path(), As::DevKey),
        &["task", "create", "--description", "x"],
        3,
    )
    .await;
    assert_eq!(err["status"], 401, "{err}");
    assert!(
        err["problem"]["type"]
            .as_str()
            .unwrap_or("")
            .ends_with("/dev-key-disabled"),
        "{err}"
    );
    let hint = err["hint"].as_str().unwrap_or("");
    assert!(
        hint.contains("meatspace key create") && hint.contains("MEATSPACE_API_KEY"),
        "{err}"
    );
    // In words for people, too.
    let ran = run(
        cli(&server, dir.path(), As::DevKey),
        &["worker", "register", "--name", "Ada"],
    )
    .await;
    assert_eq!(ran.status.code(), Some(3), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("ask an operator for an API key"),
        "{}",
        ran.stderr
    );
}

/// An operator qualifies a worker from the shell; an agent's task with
/// `--require` reaches only qualified workers; unqualifying shows in the
/// list; the agent blocks a worker from its tasks and lifts the block.
async fn qualifications_requirements_and_blocks_from_the_shell(db: Db) {
    let server = TestServer::start(db).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let (op, agent, _) = operator_and_two_agents(&server, dir.path()).await;
    let (worker, token) = server.register_worker("Ada").await;
    let worker = worker.to_string();
    let as_op = || cli(&server, dir.path(), As::Key(&op));
    let as_agent = || cli(&server, dir.path(), As::Key(&agent));

    let q = json_of(
        as_op(),
        &["worker", "qualify", &worker, "level", "--value", "3"],
    )
    .await;
    assert_eq!(q["value"], 3, "an integer value is typed as one");
    json_of(
        as_op(),
        &["worker", "qualify", &worker, "vehicle", "--value", "car"],
    )
    .await;
    let bad = run(as_op(), &["worker", "qualify", &worker, "Bad Name"]).await;
    assert!(!bad.status.success());
    assert!(bad.stderr.contains("lowercase"), "{}", bad.stderr);

    let created = json_of(
        as_agent(),
        &[
            "task",
            "create",
            "--publish",
            "--description",
            "Carry the boxes",
            "--require",
            "vehicle=car|van",
            "--require",
            "level>=2",
        ],
    )
    .await;
    assert_eq!(
        created["task"]["requirements"][0]["in"],
        json!(["car", "van"])
    );
    assert_eq!(created["task"]["requirements"][1]["at_least"], 2);
    let task = created["task"]["id"].as_str().expect("id").to_owned();
    let refused_rule = run(
        as_agent(),
        &["task", "create", "-d", "x", "--require", "level>=two"],
    )
    .await;
    assert_eq!(
        refused_rule.status.code(),
        Some(2),
        "{}",
        refused_rule.stderr
    );

    assert!(
        worker_sees(&server, &token, &task).await,
        "a qualified worker sees it"
    );
    let left = json_of(as_op(), &["worker", "unqualify", &worker, "vehicle"]).await;
    assert_eq!(left["qualifications"].as_array().map(Vec::len), Some(1));
    assert!(
        !worker_sees(&server, &token, &task).await,
        "without the vehicle it does not"
    );
    let listed = run(
        cli(&server, dir.path(), As::Key(&op)),
        &["--output", "human", "worker", "qualifications", &worker],
    )
    .await;
    assert!(listed.stdout.contains("level = 3"), "{}", listed.stdout);

    json_of(
        as_op(),
        &["worker", "qualify", &worker, "vehicle", "--value", "van"],
    )
    .await;
    assert!(worker_sees(&server, &token, &task).await);
    let blocked = json_of(as_agent(), &["worker", "block", &worker]).await;
    assert_eq!(blocked["blocks"][0]["worker_id"], json!(worker));
    assert!(
        !worker_sees(&server, &token, &task).await,
        "a blocked worker does not see the agent's task"
    );
    json_of(as_agent(), &["worker", "block", &worker, "--undo"]).await;
    assert!(worker_sees(&server, &token, &task).await);
}

/// Whether the worker with `token` lists the open task `task`.
async fn worker_sees(server: &TestServer, token: &str, task: &str) -> bool {
    let page = server.worker(token).get_json("/api/v1/worker/tasks").await;
    array_at(&page, "/tasks")
        .iter()
        .any(|t| t["id"] == json!(task))
}
