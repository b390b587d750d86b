//! `meatspace worker …`: the worker's side, with the worker token kept in
//! the state directory; and the operator's `worker list|suspend|reinstate`
//! (in [`crate::operator`]), which act with the API key instead.

use anyhow::{Context, Result, bail};
use meatspace_client::WorkerHandle;
use meatspace_client::types::TaskChange;
use serde_json::json;

use crate::Ctx;
use crate::args::WorkerCommand;
use crate::output::{emit, one_line, task_summary};
use crate::state::WorkerRecord;

pub async fn run(ctx: &Ctx, cmd: WorkerCommand) -> Result<()> {
    // The worker's own commands act with the worker token of the state
    // directory; the operator's act with the API key.
    let worker = || -> Result<WorkerHandle> {
        let record = ctx.state.worker()?;
        Ok(ctx
            .client(Some(&record.server))?
            .worker(record.worker_token))
    };
    match cmd {
        WorkerCommand::Register { name, replace } => register(ctx, &name, replace).await,
        WorkerCommand::List { .. }
        | WorkerCommand::Suspend { .. }
        | WorkerCommand::Reinstate { .. }
        | WorkerCommand::Qualify { .. }
        | WorkerCommand::Unqualify { .. }
        | WorkerCommand::Qualifications { .. }
        | WorkerCommand::Block { .. } => crate::operator::worker(ctx, cmd).await,
        WorkerCommand::Tasks { limit } => {
            let page = worker()?.open_tasks(None, Some(limit)).await?;
            emit(ctx.global.output, &page, || {
                if page.tasks.is_empty() {
                    return "no open tasks".into();
                }
                let mut s = format!("{:<36}  {:<25}  DESCRIPTION", "ID", "EXPIRES AT");
                for listed in &page.tasks {
                    let t = &listed.task;
                    s.push_str(&format!(
                        "\n{:<36}  {:<25}  {}",
                        t.id,
                        t.expires_at.format("%Y-%m-%dT%H:%M:%SZ"),
                        one_line(&t.description)
                    ));
                }
                s
            })
        }
        WorkerCommand::Get { id } => {
            let task = worker()?.task(id).await?;
            emit(ctx.global.output, &task, || task_summary(&task))
        }
        WorkerCommand::Claim { id } => show(ctx, "claimed", worker()?.claim(id).await?),
        WorkerCommand::Start { id } => show(ctx, "started", worker()?.start(id).await?),
        WorkerCommand::Message { id, text } => {
            show(ctx, "sent", worker()?.message(id, &text).await?)
        }
        WorkerCommand::Photo { id, file } => {
            let h = worker()?;
            let bytes = std::fs::read(&file).with_context(|| format!("read {}", file.display()))?;
            let Some(content_type) = sniff_image(&bytes) else {
                bail!(
                    "{} is not a JPEG, PNG or WebP image (the formats the server accepts)",
                    file.display()
                );
            };
            show(ctx, "sent photo", h.photo(id, content_type, bytes).await?)
        }
        WorkerCommand::Issue { id, kind, text } => {
            show(ctx, "raised issue", worker()?.issue(id, kind, &text).await?)
        }
        WorkerCommand::Complete { id, note, result } => {
            let h = worker()?;
            let change = match result {
                Some(result) => h.complete_with_result(id, note.as_deref(), result).await?,
                None => h.complete(id, note.as_deref()).await?,
            };
            // With review, the work waits for the agent and the task stays active.
            let done = if change.task.state.is_terminal() {
                "completed"
            } else {
                "submitted for review"
            };
            show(ctx, done, change)
        }
        WorkerCommand::Stop { id, reason } => {
            show(ctx, "stopped", worker()?.stop(id, reason.as_deref()).await?)
        }
    }
}

async fn register(ctx: &Ctx, name: &str, replace: bool) -> Result<()> {
    if let Some(existing) = ctx.state.load_worker()?
        && !replace
    {
        bail!(
            "a worker ({} \"{}\") is already registered in {}; pass --replace to register a new \
             one (the old token is then forgotten), or use another --state-dir",
            existing.id,
            one_line(&existing.name),
            ctx.state.root().display()
        );
    }
    if ctx.global.dev_key.is_none() && ctx.global.api_key.is_none() {
        return Err(crate::Usage(
            "registering a worker needs an API key with scope workers:register (set \
             MEATSPACE_API_KEY or pass --api-key) or the development key (MEATSPACE_DEV_KEY or \
             --dev-key; the server prints it when it starts)"
                .into(),
        )
        .into());
    }
    let client = ctx.client(None)?;
    let (registered, _): (_, WorkerHandle) = client.register_worker(name).await?;
    ctx.state.save_worker(&WorkerRecord {
        id: registered.worker.id,
        name: registered.worker.name.clone(),
        server: client.base_url().to_owned(),
        worker_token: registered.worker_token,
    })?;
    emit(
        ctx.global.output,
        &json!({ "worker": registered.worker }),
        || {
            format!(
                "registered worker {} ({}); token stored in {}\nfind work with: meatspace worker tasks",
                registered.worker.id,
                one_line(&registered.worker.name),
                ctx.state.root().display()
            )
        },
    )
}

/// One line per action: what happened, the task's state now, and the
/// feed event(s) it wrote (their ids are the agent's cursor positions).
fn show(ctx: &Ctx, verb: &str, change: TaskChange) -> Result<()> {
    emit(ctx.global.output, &change, || {
        let events: Vec<String> = change
            .events
            .iter()
            .map(|e| format!("{} #{}", e.kind.as_str(), e.id))
            .collect();
        let mut s = format!(
            "{verb}: task {} is {}",
            change.task.id,
            change.task.state.as_str()
        );
        if !events.is_empty() {
            s.push_str(&format!(" (event {})", events.join(", ")));
        }
        if let Some(next) = next_step(&change.task) {
            s.push_str(&format!("\n  next: {next}"));
        }
        s
    })
}

/// The worker's usual next command after an action.
fn next_step(task: &meatspace_client::Task) -> Option<String> {
    use meatspace_client::TaskState;
    let id = task.id;
    match task.state {
        TaskState::Assigned => Some(format!("meatspace worker start {id}")),
        TaskState::Active => Some(format!(
            "meatspace worker message {id} TEXT | photo {id} FILE | complete {id} --note TEXT"
        )),
        _ => None,
    }
}

/// The media type of an image from its first bytes.
fn sniff_image(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}
