//! The CLI as an agent developer first drives it, on both backends: a task
//! created elsewhere (with curl) is adopted with `task import` (token from
//! a file or stdin, checked first) and then watched to its end; errors
//! carry their own exit statuses (2 bad argument, 3 credential refused, 4
//! not found, 5 unreachable) and, with `--output json`, come as one JSON
//! object on stderr; a URL without a scheme or with the API path says what
//! to write; hints name the id and the command of the side that failed;
//! listings are objects; worker actions print one line each.

use std::process::Stdio;

use meatspace_tests::cli::{Ran, dev_cli as cli, run};
use meatspace_tests::server::TestServer;
use meatspace_tests::{Db, api_tests};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

api_tests!(
    import_adopts_a_task_created_elsewhere,
    errors_have_exit_statuses_and_json,
);

/// The error object a `--output json` command wrote on stderr.
fn json_error(ran: &Ran) -> Value {
    assert!(
        ran.stdout.is_empty(),
        "stdout holds only results: {}",
        ran.stdout
    );
    let line = ran.stderr.trim();
    let v: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("stderr is not JSON ({e}): {line}"));
    assert_eq!(v["kind"], "error", "{v}");
    assert_eq!(v["exit_code"].as_i64(), ran.code().map(i64::from), "{v}");
    v
}

async fn import_adopts_a_task_created_elsewhere(db: Db) {
    let server = TestServer::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // Created and published with plain HTTP, as curl would.
    let (id, token) = server.create_open_task("Feed the cat").await;
    let sid = id.to_string();

    // A wrong token is refused before anything is stored.
    let bad = dir.path().join("bad");
    std::fs::write(&bad, format!("mst_{}_notthetoken\n", id.simple())).unwrap();
    let ran = run(
        cli(&server, &state),
        &[
            "task",
            "import",
            &sid,
            "--token-file",
            bad.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(ran.code(), Some(3), "401 is exit 3: {}", ran.stderr);
    assert!(!state.join(format!("tasks/{id}.json")).exists());

    // From stdin, with the newline a file or echo leaves.
    let mut cmd = cli(&server, &state);
    cmd.args(["--output", "json", "task", "import", &sid])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(format!("{token}\n").as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let imported: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(imported["task"]["id"], sid, "{imported}");
    assert_eq!(imported["task"]["state"], "open", "{imported}");

    // It is a local task now: listed, and watchable to its end.
    let list = run(cli(&server, &state), &["--output", "json", "task", "list"]).await;
    let list: Value = serde_json::from_str(list.stdout.trim()).unwrap();
    assert_eq!(list["tasks"][0]["id"], sid, "listings are objects: {list}");
    let (_, wtoken) = server.register_worker("Ada").await;
    for step in ["claim", "start"] {
        server
            .worker(&wtoken)
            .post(&format!("/api/v1/worker/tasks/{id}/{step}"))
            .send()
            .await
            .unwrap();
    }
    server
        .worker(&wtoken)
        .post(&format!("/api/v1/worker/tasks/{id}/complete"))
        .json(&json!({ "text": "Fed" }))
        .send()
        .await
        .unwrap();
    let watched = run(
        cli(&server, &state),
        &["--output", "json", "task", "watch", &sid],
    )
    .await;
    assert_eq!(watched.code(), Some(0), "{}", watched.stderr);
    let last: Value = serde_json::from_str(watched.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], "final");
    assert_eq!(last["task"]["state"], "completed");
    // For people, a finished task says when it ended.
    let human = run(cli(&server, &state), &["task", "get", &sid]).await;
    assert!(human.stdout.contains("ended at:"), "{}", human.stdout);
    assert!(!human.stdout.contains("expires at"), "{}", human.stdout);
    server.stop().await;
}

async fn errors_have_exit_statuses_and_json(db: Db) {
    let server = TestServer::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");

    // URL slips say what to write, and are bad arguments (2).
    let host = server.base_url.trim_start_matches("http://").to_owned();
    let mut no_scheme = cli(&server, &state);
    no_scheme.env("MEATSPACE_URL", &host);
    let ran = run(no_scheme, &["task", "create", "--description", "x"]).await;
    assert_eq!(ran.code(), Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("add http://"), "{}", ran.stderr);
    let mut api_path = cli(&server, &state);
    api_path.env("MEATSPACE_URL", format!("{}/api/v1", server.base_url));
    let ran = run(api_path, &["worker", "register", "--name", "Ada"]).await;
    assert_eq!(ran.code(), Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains(&format!("use the base URL (--url {})", server.base_url)),
        "{}",
        ran.stderr
    );

    // A task this directory does not know: 2, as JSON on stderr.
    let unknown = uuid::Uuid::new_v4().to_string();
    let ran = run(
        cli(&server, &state),
        &["--output", "json", "task", "get", &unknown],
    )
    .await;
    assert_eq!(ran.code(), Some(2));
    let e = json_error(&ran);
    assert!(
        e["message"].as_str().unwrap().contains("task import"),
        "{e}"
    );

    // A wrong dev key: 3, with the problem document.
    let mut wrong_key = cli(&server, &state);
    wrong_key.env("MEATSPACE_DEV_KEY", "msd_not_the_key_of_this_server");
    let ran = run(
        wrong_key,
        &["-o", "json", "task", "create", "--description", "x"],
    )
    .await;
    assert_eq!(ran.code(), Some(3));
    let e = json_error(&ran);
    assert_eq!(e["status"], 401, "{e}");
    assert_eq!(e["problem"]["status"], 401, "{e}");
    assert!(e["problem"]["type"].as_str().unwrap().contains('/'), "{e}");
    assert!(
        e["hint"].as_str().unwrap().contains("development key"),
        "{e}"
    );

    let created = run(
        cli(&server, &state),
        &[
            "-o",
            "json",
            "task",
            "create",
            "--description",
            "Post a letter",
            "--publish",
        ],
    )
    .await;
    let created: Value = serde_json::from_str(created.stdout.trim()).unwrap();
    let id = created["task"]["id"].as_str().unwrap().to_owned();
    let worker_state = dir.path().join("worker");
    run(
        cli(&server, &worker_state),
        &["worker", "register", "--name", "Lin"],
    )
    .await;

    // Worker actions print one line (and what to do next), not the task.
    let claimed = run(cli(&server, &worker_state), &["worker", "claim", &id]).await;
    assert_eq!(claimed.code(), Some(0), "{}", claimed.stderr);
    let first = claimed.stdout.lines().next().unwrap();
    assert!(
        first.starts_with(&format!(
            "claimed: task {id} is assigned (event task.assigned #"
        )),
        "{}",
        claimed.stdout
    );
    assert!(
        claimed
            .stdout
            .contains(&format!("meatspace worker start {id}")),
        "{}",
        claimed.stdout
    );
    assert!(
        !claimed.stdout.contains("description:"),
        "{}",
        claimed.stdout
    );

    // Completing before starting: 1, and the worker is pointed at the
    // worker's command with the real id.
    let ran = run(cli(&server, &worker_state), &["worker", "complete", &id]).await;
    assert_eq!(ran.code(), Some(1), "{}", ran.stderr);
    assert!(ran.stderr.contains("409"), "{}", ran.stderr);
    assert!(
        ran.stderr.contains(&format!("meatspace worker get {id}")),
        "{}",
        ran.stderr
    );
    assert!(
        !ran.stderr.contains(" ID`"),
        "no placeholder: {}",
        ran.stderr
    );

    // Not found on the server: 4.
    let ran = run(
        cli(&server, &worker_state),
        &["-o", "json", "worker", "get", &unknown],
    )
    .await;
    assert_eq!(ran.code(), Some(4), "{}", ran.stderr);
    assert_eq!(json_error(&ran)["status"], 404);

    // Nobody listening: 5, the cause said once.
    let mut dead = cli(&server, &state);
    dead.env(
        "MEATSPACE_URL",
        format!("http://127.0.0.1:{}", meatspace_tests::process::free_port()),
    );
    let ran = run(dead, &["task", "get", &id]).await;
    assert_eq!(ran.code(), Some(5), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("is the server running"),
        "{}",
        ran.stderr
    );
    let first_line = ran.stderr.lines().next().unwrap();
    let request_part = "error sending request";
    assert!(
        first_line.matches(request_part).count() <= 1,
        "the cause is said once: {first_line}"
    );

    // The help names the values as they are typed.
    let help = run(cli(&server, &state), &["--help"]).await;
    assert!(help.stdout.contains("`human`"), "{}", help.stdout);
    assert!(help.stdout.contains("Exit status"), "{}", help.stdout);
    server.stop().await;
}
