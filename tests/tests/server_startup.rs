//! The API server binary's start, as a new user meets it: the generated
//! development key survives a restart in the same directory (and a
//! configured one wins); each usual configuration mistake is refused before
//! anything is created, printed or opened, with a message that says what to
//! set; a second server on the same SQLite directory is refused and told
//! where the first one listens; the log written to a file carries no colour
//! codes and no Rust `Debug` of durations; `GET /` points a browser at the
//! worker app and an API client at the capabilities document.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use meatspace_tests::process::{Binary, ServerProcess, free_port};
use reqwest::StatusCode;
use serde_json::json;

fn local_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Creates a task with `key`; the status the server answers.
async fn create_with(base: &str, key: &str) -> StatusCode {
    reqwest::Client::new()
        .post(format!("{base}/api/v1/tasks"))
        .header("x-meatspace-dev-key", key)
        .json(&json!({ "description": "Water the plants" }))
        .send()
        .await
        .expect("create request")
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_generated_dev_key() {
    let dir = tempfile::tempdir().unwrap();
    let addr = local_addr();
    let mut first = ServerProcess::start_in(Binary::ApiServer, dir.path(), "first", &addr, &[]);
    first.ready().await;
    let key = first.printed_dev_key().expect("a generated key is printed");
    assert!(key.starts_with("msd_"), "{key}");
    assert_eq!(
        create_with(&first.base_url(), &key).await,
        StatusCode::CREATED
    );
    let file = dir.path().join(".meatspace/dev.key");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), key);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    first.kill().await;

    // The same directory: the exported key still works, and is printed again.
    let mut second = ServerProcess::start_in(Binary::ApiServer, dir.path(), "second", &addr, &[]);
    second.ready().await;
    assert_eq!(second.printed_dev_key().as_deref(), Some(key.as_str()));
    assert_eq!(
        create_with(&second.base_url(), &key).await,
        StatusCode::CREATED,
        "the key from before the restart is accepted"
    );
    second.kill().await;

    // A configured key wins over the kept one, and nothing is printed.
    let configured = "msd_configured_key_of_the_test";
    let mut third = ServerProcess::start_in(
        Binary::ApiServer,
        dir.path(),
        "third",
        &addr,
        &[("MEATSPACE_DEV_KEY", configured)],
    );
    third.ready().await;
    assert_eq!(third.printed_dev_key(), None, "{}", third.stdout());
    assert_eq!(
        create_with(&third.base_url(), configured).await,
        StatusCode::CREATED
    );
    assert_eq!(
        create_with(&third.base_url(), &key).await,
        StatusCode::UNAUTHORIZED
    );

    // Whoever opens the bare address is told where to go.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let browser = client
        .get(format!("{}/", third.base_url()))
        .header("accept", "text/html,application/xhtml+xml")
        .send()
        .await
        .unwrap();
    assert_eq!(browser.status(), StatusCode::SEE_OTHER);
    assert_eq!(browser.headers()["location"], "/app");
    let api: serde_json::Value = client
        .get(format!("{}/", third.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .expect("GET / answers JSON to an API client");
    assert_eq!(api["capabilities"], "/api/v1/capabilities", "{api}");
    assert_eq!(api["worker_app"], "/app", "{api}");

    // The log went to a file: no colour codes, and settings as numbers.
    let log = third.stderr();
    assert!(log.contains("controller running"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file: {log}");
    assert!(!log.contains("TimeDelta"), "Rust Debug in the log: {log}");
    third.kill().await;
}

/// Starts a server that must refuse to start; its stderr, after checking
/// that it exited non-zero and created nothing in `dir`.
async fn refused(dir: &Path, name: &str, addr: &str, env: &[(&str, &str)]) -> (String, String) {
    let mut server = ServerProcess::start_in(Binary::ApiServer, dir, name, addr, env);
    let status = server.exit().await;
    assert!(!status.success(), "{name}: started anyway");
    let (stdout, stderr) = (server.stdout(), server.stderr());
    assert!(
        !stdout.contains("dev key"),
        "{name}: a dev key was printed before the refusal: {stdout}"
    );
    assert!(!stderr.contains('\u{1b}'), "{name}: colour codes: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{name}: one error line: {stderr}");
    (errors[0].to_owned(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_startup_mistake_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let addr = local_addr();
    let dev = ("MEATSPACE_DEV_KEY", "msd_a_long_enough_dev_key");
    let secret = (
        "MEATSPACE_SECRET_KEY",
        "a-server-key-of-at-least-thirty-two-characters",
    );

    let (e, _) = refused(
        d,
        "mysql",
        &addr,
        &[("DATABASE_URL", "mysql://u:hunter2@h/db")],
    )
    .await;
    assert!(
        e.contains("uses mysql://") && e.contains("postgres://"),
        "{e}"
    );
    assert!(
        !e.contains("MEATSPACE_DEV_KEY") && !e.contains("hunter2"),
        "{e}"
    );

    let missing = d.join("no-such-dir/tasks.db");
    let url = format!("sqlite://{}", missing.display());
    let (e, all) = refused(d, "nodir", &addr, &[("DATABASE_URL", &url)]).await;
    assert!(
        e.contains("does not exist") && e.contains("mkdir -p"),
        "{e}"
    );
    assert!(!all.contains("unable to open database file"), "{all}");

    // One setting wrong: the refusal names it and what to do.
    for (name, setting, says) in [
        (
            "bare",
            ("DATABASE_URL", "data.db"),
            &["write sqlite://data.db"][..],
        ),
        (
            "short-secret",
            ("MEATSPACE_SECRET_KEY", "too short"),
            &["MEATSPACE_SECRET_KEY", "32"],
        ),
        (
            "short-dev",
            ("MEATSPACE_DEV_KEY", "msd_short"),
            &["MEATSPACE_DEV_KEY", "at least 16"],
        ),
        (
            "pg-nokey",
            ("DATABASE_URL", "postgres://u@127.0.0.1/x"),
            &["MEATSPACE_DEV_KEY must be set"],
        ),
    ] {
        let (e, _) = refused(d, name, &addr, &[setting]).await;
        for said in says {
            assert!(e.contains(said), "{name}: {said:?} in {e}");
        }
    }

    // Nothing above created the data directory.
    assert!(
        !d.join(".meatspace").exists(),
        "a refused start touched the disk"
    );

    let dead = format!("postgres://meatspace@127.0.0.1:{}/meatspace", free_port());
    let (e, _) = refused(d, "pg-down", &addr, &[("DATABASE_URL", &dead), dev, secret]).await;
    assert!(e.to_lowercase().contains("connection refused"), "{e}");
    assert!(e.contains("is PostgreSQL running"), "{e}");
    assert!(!e.contains("pool timed out"), "{e}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let (e, _) = refused(d, "in-use", &taken_addr, &[dev]).await;
    assert!(
        e.contains("already in use") && e.contains("MEATSPACE_LISTEN_ADDR"),
        "{e}"
    );
    assert!(e.contains(&taken_addr), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first_addr = local_addr();
    let mut first =
        ServerProcess::start_in(Binary::ApiServer, dir.path(), "first", &first_addr, &[]);
    first.ready().await;
    let (e, _) = refused(dir.path(), "second", &local_addr(), &[]).await;
    assert!(e.contains("already uses the data directory"), "{e}");
    assert!(e.contains(&format!("listening on {first_addr}")), "{e}");
    // The first one still serves.
    let key = first.printed_dev_key().unwrap();
    assert_eq!(
        create_with(&first.base_url(), &key).await,
        StatusCode::CREATED
    );
    // Its lock goes with it, even after SIGKILL.
    first.kill().await;
    let mut third =
        ServerProcess::start_in(Binary::ApiServer, dir.path(), "third", &local_addr(), &[]);
    third.ready().await;
    third.kill().await;
}
