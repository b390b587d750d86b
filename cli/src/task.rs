//! `meatspace task …`: the agent's side, with the token, cursor and last
//! known state of each task kept in the state directory. With an API key
//! (`MEATSPACE_API_KEY`), a task of the key's principal needs no stored
//! token: its commands authenticate with the key, and the record they keep
//! holds only the cursor and last known state.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use meatspace_client::types::{
    CreateTask, Extend, Place, ReviewAction, ReviewAnswer, ReviewTerms, TaskChange,
};
use meatspace_client::{Client, IssueAction, RetryPolicy, Task, TaskHandle, TaskState, Transport};
use serde_json::json;
use uuid::Uuid;

use crate::args::{ActionArg, Output, Page, TaskCommand, TransportArg};
use crate::output::{self, emit, event_human, one_line, task_summary};
use crate::state::{TaskRecord, merge_task};
use crate::{Ctx, Usage};

pub async fn run(ctx: &Ctx, cmd: TaskCommand) -> Result<()> {
    match cmd {
        TaskCommand::Create {
            description,
            lifetime,
            publish,
            webhook,
            at,
            radius,
            address,
            presence,
            result_schema,
            review,
            auto_accept,
            requirements,
        } => {
            let result_schema = result_schema.as_deref().map(read_schema).transpose()?;
            let req = CreateTask {
                description,
                expires_in_seconds: lifetime,
                webhook_url: webhook,
                location: at.map(|(latitude, longitude)| Place {
                    latitude,
                    longitude,
                    radius_m: radius,
                    address,
                }),
                presence,
                result_schema,
                review: review.then_some(ReviewTerms {
                    auto_accept_seconds: auto_accept,
                }),
                requirements,
            };
            create(ctx, req, publish).await
        }
        TaskCommand::Review {
            id,
            accept: _,
            revise,
            reject,
        } => {
            let (answer, done) = match (revise, reject) {
                (Some(text), _) => (
                    ReviewAnswer {
                        action: ReviewAction::Revise,
                        text: Some(text),
                    },
                    "sent back for revision",
                ),
                (None, Some(text)) => (
                    ReviewAnswer {
                        action: ReviewAction::Reject,
                        text: Some(text),
                    },
                    "rejected",
                ),
                (None, None) => (
                    ReviewAnswer {
                        action: ReviewAction::Accept,
                        text: None,
                    },
                    "accepted",
                ),
            };
            action(
                ctx,
                id,
                done,
                move |h| async move { h.review(answer).await },
            )
            .await
        }
        TaskCommand::Publish { id } => {
            action(ctx, id, "published", |h| async move { h.publish().await }).await
        }
        TaskCommand::Cancel { id } => {
            action(ctx, id, "cancelled", |h| async move { h.cancel().await }).await
        }
        TaskCommand::Extend { id, by } => {
            let ext = match (by.add_seconds, by.expires_at) {
                (Some(n), _) => Extend::add_seconds(n),
                (None, Some(t)) => Extend::until(t),
                (None, None) => bail!("give --add-seconds N or --expires-at T"),
            };
            action(
                ctx,
                id,
                "extended",
                move |h| async move { h.extend(ext).await },
            )
            .await
        }
        TaskCommand::Respond {
            id,
            event_id,
            action: act,
            text,
        } => {
            let act = match act {
                ActionArg::Clarify => IssueAction::Clarify,
                ActionArg::Acknowledge => IssueAction::Acknowledge,
                ActionArg::Cancel => IssueAction::Cancel,
            };
            if act.requires_text() && text.is_none() {
                bail!(
                    "--action {} needs --text with the answer for the worker",
                    act.as_str()
                );
            }
            action(ctx, id, "answered", move |h| async move {
                h.respond(event_id, act, text).await
            })
            .await
        }
        TaskCommand::Get { id } => get(ctx, id).await,
        TaskCommand::List {
            state,
            local,
            server,
            page,
        } => {
            if !local && (server || ctx.global.api_key.is_some()) {
                list_server(ctx, state, page).await
            } else {
                list(ctx, state)
            }
        }
        TaskCommand::Import { id, token_file } => import(ctx, id, token_file).await,
        TaskCommand::Watch {
            id,
            transport,
            from_start,
        } => watch(ctx, id, transport, from_start).await,
        TaskCommand::Photo { id, photo_id, out } => {
            let (_, handle) = handle(ctx, id).await?;
            let photo = handle.photo(photo_id).await?;
            let ext = match photo.content_type.as_str() {
                "image/png" => "png",
                "image/webp" => "webp",
                _ => "jpg",
            };
            let path = out.unwrap_or_else(|| format!("{photo_id}.{ext}").into());
            std::fs::write(&path, &photo.bytes)
                .with_context(|| format!("write {}", path.display()))?;
            emit(
                ctx.global.output,
                &json!({ "path": path, "content_type": photo.content_type, "size_bytes": photo.bytes.len() }),
                || {
                    format!(
                        "saved {} ({}, {} bytes)",
                        path.display(),
                        photo.content_type,
                        photo.bytes.len()
                    )
                },
            )
        }
    }
}

/// The stored record of `id` and a handle carrying its token. With an API
/// key, a task the state directory does not know is taken up as the key's
/// own: the server is asked for it (404 when it is another principal's),
/// and a record without a token is kept for its cursor and state.
async fn handle(ctx: &Ctx, id: Uuid) -> Result<(TaskRecord, TaskHandle)> {
    if let Some(record) = ctx.state.load_task(id)? {
        let client = ctx.client(Some(&record.server))?;
        let h = record.handle(&client);
        return Ok((record, h));
    }
    if ctx.global.api_key.is_none() {
        // The error that says how a record comes to exist.
        ctx.state.task(id)?;
    }
    let client = ctx.client(None)?;
    let h = client.task_owned(id);
    let task = h.get().await?;
    let record = adopt(ctx, &client, task)?;
    Ok((record, h))
}

/// Keeps a record, without a token, of a task reached with the owner's API
/// key (an existing record is left as it is).
fn adopt(ctx: &Ctx, client: &Client, task: Task) -> Result<TaskRecord> {
    if let Some(existing) = ctx.state.load_task(task.id)? {
        return Ok(existing);
    }
    let record = TaskRecord {
        id: task.id,
        server: client.base_url().to_owned(),
        agent_token: None,
        webhook_secret: None,
        cursor: 0,
        task,
        updated_at: Utc::now(),
    };
    ctx.state.save_task(&record)?;
    Ok(record)
}

async fn create(ctx: &Ctx, req: CreateTask, publish: bool) -> Result<()> {
    if ctx.global.dev_key.is_none() && ctx.global.api_key.is_none() {
        return Err(Usage(
            "creating a task needs an API key (set MEATSPACE_API_KEY or pass --api-key; an \
             operator creates one with `meatspace key create --name NAME`) or the development \
             key (MEATSPACE_DEV_KEY or --dev-key; the server prints it when it starts)"
                .into(),
        )
        .into());
    }
    let client = ctx.client(None)?;
    let (created, handle) = client.create_task(&req).await?;
    let mut record = TaskRecord {
        id: created.task.id,
        server: client.base_url().to_owned(),
        agent_token: Some(created.agent_token.clone()),
        webhook_secret: created.webhook_secret.clone(),
        cursor: 0,
        task: created.task.clone(),
        updated_at: Utc::now(),
    };
    // The token is shown only once: store it before anything else can fail.
    ctx.state.save_task(&record)?;
    let mut task = created.task;
    if publish {
        let change = handle.publish().await.with_context(|| {
            format!(
                "task {} was created (draft, token stored) but could not be published; \
                 retry with `meatspace task publish {}`",
                record.id, record.id
            )
        })?;
        task = change.task;
        record = ctx
            .state
            .update_task(record.id, |r| merge_task(r, task.clone()))?;
    }
    let file = ctx.state.task_file(record.id);
    emit(
        ctx.global.output,
        &json!({
            "task": task,
            "state_file": file,
            "webhook_secret": created.webhook_secret,
        }),
        || {
            let mut s = format!(
                "created {}\ntoken stored in {}",
                task_summary(&task),
                file.display()
            );
            if let Some(secret) = &created.webhook_secret {
                s.push_str(&format!(
                    "\nwebhook signing secret (shown once, also stored there): {secret}"
                ));
            }
            s.push_str(&format!(
                "\nfollow it with: meatspace task watch {}",
                task.id
            ));
            s
        },
    )
}

/// Runs one action with the task's token, stores the new state, prints it.
async fn action<F, Fut>(ctx: &Ctx, id: Uuid, verb: &str, f: F) -> Result<()>
where
    F: FnOnce(TaskHandle) -> Fut,
    Fut: std::future::Future<Output = Result<TaskChange, meatspace_client::Error>>,
{
    let (_, h) = handle(ctx, id).await?;
    let change = f(h).await?;
    // Under the lock: a concurrent `watch` may be storing its cursor.
    ctx.state
        .update_task(id, |r| merge_task(r, change.task.clone()))?;
    emit(ctx.global.output, &change, || {
        format!("{verb} {}", task_summary(&change.task))
    })
}

async fn get(ctx: &Ctx, id: Uuid) -> Result<()> {
    let (_, h) = handle(ctx, id).await?;
    let task = h.get().await?;
    ctx.state.update_task(id, |r| merge_task(r, task.clone()))?;
    emit(ctx.global.output, &task, || task_summary(&task))
}

fn list(ctx: &Ctx, state: Option<TaskState>) -> Result<()> {
    let mut records = ctx.state.tasks()?;
    records.retain(|r| state.is_none_or(|s| r.task.state == s));
    let rows: Vec<_> = records
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "server": r.server,
                "state": r.task.state,
                "cursor": r.cursor,
                "description": r.task.description,
                "expires_at": r.task.expires_at,
                "updated_at": r.updated_at,
            })
        })
        .collect();
    // An object, like every listing (`worker tasks` too), so fields can be
    // added without breaking scripts.
    emit(ctx.global.output, &json!({ "tasks": rows }), || {
        if records.is_empty() {
            return format!(
                "no tasks in {} (create one with `meatspace task create --description …`)",
                ctx.state.root().display()
            );
        }
        let mut s = format!("{:<36}  {:<9}  {:>6}  DESCRIPTION", "ID", "STATE", "CURSOR");
        for r in &records {
            s.push_str(&format!(
                "\n{:<36}  {:<9}  {:>6}  {}",
                r.id,
                r.task.state.as_str(),
                r.cursor,
                one_line(&r.task.description)
            ));
        }
        s
    })
}

/// Lists the caller's own tasks as the server has them (one page).
async fn list_server(ctx: &Ctx, state: Option<TaskState>, page: Page) -> Result<()> {
    let client = ctx.client(None)?;
    let listed = client
        .tasks_page(state, page.cursor.as_deref(), Some(page.limit))
        .await?;
    let mut rows = Vec::with_capacity(listed.tasks.len());
    for t in &listed.tasks {
        let local = ctx.state.load_task(t.id)?;
        rows.push((t, local));
    }
    let json_rows: Vec<_> = rows
        .iter()
        .map(|(t, local)| {
            json!({
                "id": t.id,
                "state": t.state,
                "description": t.description,
                "created_at": t.created_at,
                "expires_at": t.expires_at,
                "local": local.is_some(),
                "cursor": local.as_ref().map(|r| r.cursor),
            })
        })
        .collect();
    emit(
        ctx.global.output,
        &json!({ "tasks": json_rows, "next_cursor": listed.next_cursor }),
        || {
            if rows.is_empty() {
                return "no tasks of yours on this server (create one with `meatspace task \
                        create --description …`)"
                    .into();
            }
            let mut s = format!("{:<36}  {:<9}  {:>6}  DESCRIPTION", "ID", "STATE", "CURSOR");
            for (t, local) in &rows {
                let cursor = local
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |r| r.cursor.to_string());
                s.push_str(&format!(
                    "\n{:<36}  {:<9}  {:>6}  {}",
                    t.id,
                    t.state.as_str(),
                    cursor,
                    one_line(&t.description)
                ));
            }
            if let Some(next) = &listed.next_cursor {
                s.push_str(&format!("\nmore: meatspace task list --cursor {next}"));
            }
            s
        },
    )
}

/// Adopts a task created elsewhere: checks the token against the server
/// (a task it cannot read is refused here, not at the first watch), then
/// stores it. A task already known keeps its cursor.
async fn import(ctx: &Ctx, id: Uuid, token_file: Option<PathBuf>) -> Result<()> {
    let text = match token_file.as_deref() {
        Some(path) if path != Path::new("-") => std::fs::read_to_string(path).map_err(|e| {
            Usage(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
        })?,
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .take(64 * 1024)
                .read_to_string(&mut text)
                .context("read the token from stdin")?;
            text
        }
    };
    let token = text.trim().to_owned();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(Usage(
            "the token must be the task's agent token (mst_…) on its own: give it with \
             --token-file FILE or on stdin"
                .into(),
        )
        .into());
    }
    let existing = ctx.state.load_task(id)?;
    let recorded = existing.as_ref().map(|r| r.server.clone());
    let client = ctx.client(recorded.as_deref())?;
    let task = client.task(id, token.clone()).get().await?;
    let record = TaskRecord {
        id,
        server: client.base_url().to_owned(),
        agent_token: Some(token),
        webhook_secret: existing.as_ref().and_then(|r| r.webhook_secret.clone()),
        cursor: existing.as_ref().map_or(0, |r| r.cursor),
        task: task.clone(),
        updated_at: Utc::now(),
    };
    ctx.state.save_task(&record)?;
    let file = ctx.state.task_file(id);
    emit(
        ctx.global.output,
        &json!({ "task": task, "state_file": file, "cursor": record.cursor }),
        || {
            format!(
                "imported {}\ntoken stored in {}\nfollow it with: meatspace task watch {id}",
                task_summary(&task),
                file.display()
            )
        },
    )
}

/// Failures that waiting can fix: the server is restarting, overloaded or
/// briefly unreachable. Everything else (401, 404, a bad answer) is final.
fn retriable(e: &meatspace_client::Error) -> bool {
    matches!(e, meatspace_client::Error::Transport(_))
        || matches!(e.status(), Some(429 | 502 | 503 | 504))
}

/// How long `watch` waits before its next try, and says so on stderr.
fn backoff(out: Output, failures: u32, cursor: i64, e: &meatspace_client::Error) -> Duration {
    let delay = RetryPolicy {
        max_attempts: 0,
        initial_backoff: Duration::from_millis(500),
        max_backoff: Duration::from_secs(5),
    }
    .backoff(failures.saturating_sub(1));
    // The error and its causes, each said once.
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !reason.contains(&text) {
            reason.push_str(": ");
            reason.push_str(&text);
        }
        source = cause.source();
    }
    match out {
        Output::Json => eprintln!(
            "{}",
            json!({ "kind": "retry", "message": reason, "cursor": cursor,
                    "retry_in_seconds": delay.as_secs_f64(), "failures": failures })
        ),
        Output::Human => eprintln!(
            "meatspace: {reason}; retrying in {:.1} s from event {cursor} (the task goes on; \
             Ctrl-C stops, run again to resume)",
            delay.as_secs_f64()
        ),
    }
    delay
}

/// Follows the feed from the stored cursor. The cursor is stored only
/// after a batch has been printed (and stdout flushed), so a crash at any
/// point loses nothing; at worst the last batch is printed again.
async fn watch(ctx: &Ctx, id: Uuid, transport: TransportArg, from_start: bool) -> Result<()> {
    let (record, h) = handle(ctx, id).await?;
    let after = if from_start { 0 } else { record.cursor };
    let transport = match transport {
        TransportArg::Auto => Transport::Auto,
        TransportArg::Sse => Transport::Sse,
        TransportArg::LongPoll => Transport::LongPoll,
    };
    let out = ctx.global.output;
    if out == Output::Human {
        eprintln!("watching task {id} from event {after} (Ctrl-C stops; run again to resume)");
    }
    let mut feed = h.follow(after).transport(transport);
    let mut failures = 0u32;
    loop {
        let batch = match feed.next().await {
            Ok(Some(batch)) => batch,
            Ok(None) => break,
            Err(e) if retriable(&e) => {
                failures += 1;
                tokio::time::sleep(backoff(out, failures, feed.cursor(), &e)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if failures > 0 && out == Output::Human {
            eprintln!(
                "meatspace: reconnected; resuming after event {}",
                feed.cursor()
            );
        }
        failures = 0;
        {
            let mut stdout = std::io::stdout().lock();
            for e in &batch.events {
                match out {
                    Output::Json => {
                        serde_json::to_writer(
                            &mut stdout,
                            &json!({ "kind": "event", "event": e }),
                        )?;
                        writeln!(stdout)?;
                    }
                    Output::Human => writeln!(stdout, "{}", event_human(e))?,
                }
            }
            stdout.flush()?;
        }
        // Only forward: another watch of the same task may be ahead.
        ctx.state
            .update_task(id, |r| r.cursor = r.cursor.max(batch.cursor))?;
        if batch.terminal {
            break;
        }
    }
    let task = loop {
        match h.get().await {
            Ok(task) => break task,
            Err(e) if retriable(&e) => {
                failures += 1;
                tokio::time::sleep(backoff(out, failures, feed.cursor(), &e)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    finish(ctx, id, &task)?;
    match out {
        Output::Json => output::json(&json!({ "kind": "final", "task": task })),
        Output::Human => {
            println!("task ended: {}", task_summary(&task));
            Ok(())
        }
    }
}

fn finish(ctx: &Ctx, id: Uuid, task: &Task) -> Result<()> {
    ctx.state.update_task(id, |r| merge_task(r, task.clone()))?;
    Ok(())
}

/// The result schema of `--result-schema FILE` (`-`: standard input).
fn read_schema(path: &Path) -> Result<serde_json::Value> {
    let text = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("read the result schema from standard input")?;
        text
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("read the result schema {}", path.display()))?
    };
    serde_json::from_str(&text).context("the result schema is not JSON")
}
