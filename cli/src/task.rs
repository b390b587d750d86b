//! `meatspace task …`: the agent's side, with the token, cursor and last
//! known state of each task kept in the state directory.

use std::io::Write;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use meatspace_client::types::{CreateTask, Extension, TaskChange};
use meatspace_client::{IssueAction, Task, TaskHandle, Transport};
use serde_json::json;
use uuid::Uuid;

use crate::Ctx;
use crate::args::{ActionArg, Output, TaskCommand, TransportArg};
use crate::output::{self, emit, event_human, one_line, task_summary};
use crate::state::{TaskRecord, merge_task};

pub async fn run(ctx: &Ctx, cmd: TaskCommand) -> Result<()> {
    match cmd {
        TaskCommand::Create {
            description,
            lifetime,
            publish,
            webhook,
        } => create(ctx, description, lifetime, publish, webhook).await,
        TaskCommand::Publish { id } => {
            action(ctx, id, "published", |h| async move { h.publish().await }).await
        }
        TaskCommand::Cancel { id } => {
            action(ctx, id, "cancelled", |h| async move { h.cancel().await }).await
        }
        TaskCommand::Extend { id, by } => {
            let ext = match (by.add_seconds, by.expires_at) {
                (Some(n), _) => Extension::AddSeconds(n),
                (None, Some(t)) => Extension::ExpiresAt(t),
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
        TaskCommand::List => list(ctx),
        TaskCommand::Watch {
            id,
            transport,
            from_start,
        } => watch(ctx, id, transport, from_start).await,
        TaskCommand::Photo { id, photo_id, out } => {
            let (_, handle) = handle(ctx, id)?;
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

/// The stored record of `id` and a handle carrying its token.
fn handle(ctx: &Ctx, id: Uuid) -> Result<(TaskRecord, TaskHandle)> {
    let record = ctx.state.task(id)?;
    let client = ctx.client(Some(&record.server))?;
    let h = client.task(id, record.agent_token.clone());
    Ok((record, h))
}

async fn create(
    ctx: &Ctx,
    description: String,
    lifetime: Option<i64>,
    publish: bool,
    webhook: Option<String>,
) -> Result<()> {
    if ctx.global.dev_key.is_none() {
        bail!(
            "creating a task needs the development key: pass --dev-key KEY or set MEATSPACE_DEV_KEY \
             (the server prints it when it starts)"
        );
    }
    let client = ctx.client(None)?;
    let req = CreateTask {
        description,
        expires_in_seconds: lifetime,
        webhook_url: webhook,
    };
    let (created, handle) = client.create_task(&req).await?;
    let mut record = TaskRecord {
        id: created.task.id,
        server: client.base_url().to_owned(),
        agent_token: created.agent_token.clone(),
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
    let (_, h) = handle(ctx, id)?;
    let change = f(h).await?;
    // Under the lock: a concurrent `watch` may be storing its cursor.
    ctx.state
        .update_task(id, |r| merge_task(r, change.task.clone()))?;
    emit(ctx.global.output, &change, || {
        format!("{verb} {}", task_summary(&change.task))
    })
}

async fn get(ctx: &Ctx, id: Uuid) -> Result<()> {
    let (_, h) = handle(ctx, id)?;
    let task = h.get().await?;
    ctx.state.update_task(id, |r| merge_task(r, task.clone()))?;
    emit(ctx.global.output, &task, || task_summary(&task))
}

fn list(ctx: &Ctx) -> Result<()> {
    let records = ctx.state.tasks()?;
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
    emit(ctx.global.output, &rows, || {
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

/// Follows the feed from the stored cursor. The cursor is stored only
/// after a batch has been printed (and stdout flushed), so a crash at any
/// point loses nothing; at worst the last batch is printed again.
async fn watch(ctx: &Ctx, id: Uuid, transport: TransportArg, from_start: bool) -> Result<()> {
    let (record, h) = handle(ctx, id)?;
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
    while let Some(batch) = feed.next().await? {
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
    let task = h.get().await?;
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
