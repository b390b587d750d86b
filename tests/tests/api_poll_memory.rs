//! Empty polls answered from the server's memory (`crate::feed_heads` in the API
//! server) keep working after the server restarts on a database that already
//! holds data: for a task created before the restart and for one created
//! after it. Every production server restarts, and every benchmark used to
//! start on a new database, so this is the case nothing else looks at.
//!
//! The real binary runs as a child process on each backend; the test reads
//! the server's own count of memory answers from `/metrics`.

use std::time::Duration;

use meatspace_tests::process::{Binary, ServerProcess};
use meatspace_tests::server::DEV_KEY_HEADER;
use meatspace_tests::{Db, TestDb};
use reqwest::StatusCode;
use serde_json::{Value, json};

meatspace_tests::api_tests!(empty_polls_are_answered_from_memory_after_a_restart);

const DEV_KEY: &str = "msd_poll-memory-test-development-key-0123";
/// The counter the server keeps of empty polls it answered from memory.
const MEMORY_ANSWERS: &str = "meatspace_feed_memory_answers_total";
/// How long a poll loop may take to see memory answers: far longer than a
/// busy machine needs for a few dozen requests.
const DEADLINE: Duration = Duration::from_secs(60);

struct Polled {
    id: String,
    token: String,
    cursor: i64,
}

async fn memory_answers(client: &reqwest::Client, server: &ServerProcess) -> u64 {
    let text = client
        .get(format!(
            "http://{}/metrics",
            server
                .metrics_addr
                .as_deref()
                .expect("the API server's metrics address")
        ))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(MEMORY_ANSWERS)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Creates and publishes a task; its cursor is the last event's id.
async fn published_task(client: &reqwest::Client, server: &ServerProcess) -> Polled {
    let created: Value = client
        .post(server.url("/api/v1/tasks"))
        .header(DEV_KEY_HEADER, DEV_KEY)
        .json(&json!({ "description": "Count the bicycles outside the station" }))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("create answer");
    let id = created["task"]["id"].as_str().expect("task id").to_owned();
    let token = created["agent_token"].as_str().expect("token").to_owned();
    let res = client
        .post(server.url(&format!("/api/v1/tasks/{id}/publish")))
        .bearer_auth(&token)
        .send()
        .await
        .expect("publish");
    assert_eq!(res.status(), StatusCode::OK);
    let page: Value = client
        .get(server.url(&format!("/api/v1/tasks/{id}/events?after=0")))
        .bearer_auth(&token)
        .send()
        .await
        .expect("first page")
        .json()
        .await
        .expect("page");
    let cursor = page["next_cursor"].as_i64().expect("next_cursor");
    assert!(cursor > 0, "the publish event is in the feed: {page}");
    Polled { id, token, cursor }
}

/// Polls `task` at its cursor until the server has answered at least
/// `wanted` of those polls from memory; every answer must be the empty page
/// that the database would give.
async fn poll_until_answered_from_memory(
    client: &reqwest::Client,
    server: &ServerProcess,
    task: &Polled,
    wanted: u64,
    what: &str,
) {
    let start = memory_answers(client, server).await;
    let give_up = tokio::time::Instant::now() + DEADLINE;
    let mut polls = 0;
    loop {
        let res = client
            .get(server.url(&format!(
                "/api/v1/tasks/{}/events?after={}",
                task.id, task.cursor
            )))
            .bearer_auth(&task.token)
            .send()
            .await
            .expect("poll");
        assert_eq!(res.status(), StatusCode::OK);
        let page: Value = res.json().await.expect("page");
        assert_eq!(page["events"], json!([]), "{what}: an empty page");
        assert_eq!(page["next_cursor"], json!(task.cursor), "{what}");
        assert_eq!(page["task_state"], json!("open"), "{what}");
        polls += 1;
        if polls % 10 == 0 && memory_answers(client, server).await - start >= wanted {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{what}: {polls} empty polls, {} answered from memory (wanted {wanted})",
            memory_answers(client, server).await - start
        );
    }
}

async fn empty_polls_are_answered_from_memory_after_a_restart(db: Db) {
    let test_db = TestDb::new(db).await;
    let data_dir = tempfile::tempdir().unwrap();
    let data_dir_str = data_dir.path().display().to_string();
    let mut env = vec![
        ("MEATSPACE_DEV_KEY", DEV_KEY),
        ("MEATSPACE_RATE_LIMIT_PER_SECOND", "0"),
        ("MEATSPACE_DATA_DIR", data_dir_str.as_str()),
    ];
    if db == Db::Postgres {
        env.push(("DATABASE_URL", &test_db.url));
        env.push((
            "MEATSPACE_SECRET_KEY",
            "a-test-secret-key-of-at-least-32-characters",
        ));
    }
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    let mut first = ServerProcess::start(Binary::ApiServer, &env);
    first.ready().await;
    let before = published_task(&client, &first).await;
    poll_until_answered_from_memory(&client, &first, &before, 10, "first start").await;
    assert!(first.terminate().await, "{}", first.logs());

    let mut second = ServerProcess::start(Binary::ApiServer, &env);
    second.ready().await;
    poll_until_answered_from_memory(
        &client,
        &second,
        &before,
        10,
        "after a restart, a task created before it",
    )
    .await;
    let after = published_task(&client, &second).await;
    poll_until_answered_from_memory(
        &client,
        &second,
        &after,
        10,
        "after a restart, a task created after it",
    )
    .await;
    assert!(second.terminate().await, "{}", second.logs());
}
