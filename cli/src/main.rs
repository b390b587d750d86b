//! `meatspace`: the command-line tool for agents and workers, built on
//! `meatspace-client`. This file only parses the command line, runs the
//! command and turns a failure into a message that says what to do next.

mod args;
mod operator;
mod output;
mod task;
mod worker;

use std::process::ExitCode;

use clap::Parser;
use meatspace_client::{Client, Error, state};

use args::{Cli, Command, Output};
use state::StateDir;

/// Server used when neither a flag, the environment nor a task record names one.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// What every command needs: parsed global options and the state directory.
#[derive(Debug)]
pub struct Ctx {
    pub global: args::Global,
    pub state: StateDir,
}

impl Ctx {
    /// A client of `server` (the flag/env URL wins over a record's).
    pub fn client(&self, recorded: Option<&str>) -> anyhow::Result<Client> {
        let url = self
            .global
            .url
            .as_deref()
            .or(recorded)
            .unwrap_or(DEFAULT_URL);
        check_base_url(url)?;
        let mut b = Client::builder(url);
        if let Some(key) = &self.global.dev_key {
            b = b.dev_key(key.clone());
        }
        if let Some(key) = &self.global.api_key {
            b = b.api_key(key.clone());
        }
        Ok(b.build().map_err(|e| Usage(e.to_string()))?)
    }
}

/// A mistake in what was asked (an argument, the URL, a task this state
/// directory does not know): retrying cannot fix it. Exit status 2, as for
/// the errors clap finds.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Exit statuses, as `--help` documents them.
pub mod exit {
    /// Success (`task watch`: the task ended).
    pub const OK: u8 = 0;
    /// The server refused the request (wrong state, invalid input) or
    /// another failure.
    pub const FAILED: u8 = 1;
    /// A bad argument or usage.
    pub const USAGE: u8 = 2;
    /// The server did not accept the credential (401), or the credential
    /// may not do this (403).
    pub const UNAUTHORIZED: u8 = 3;
    /// No such task, or not yours (404).
    pub const NOT_FOUND: u8 = 4;
    /// The server could not be reached or stayed unavailable (connection
    /// failures, 429, 503) through every retry.
    pub const UNAVAILABLE: u8 = 5;
}

/// The URL must be a server's base URL: a missing scheme and an API path
/// are the two usual slips, and the server's own answers to them (a parse
/// error, a 404) do not say what is wrong.
fn check_base_url(url: &str) -> Result<(), Usage> {
    if !url.contains("://") {
        return Err(Usage(format!(
            "the server URL {url:?} has no scheme: add http:// (e.g. --url http://{url}); set it \
             with --url or MEATSPACE_URL"
        )));
    }
    let path = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.find('/').map(|i| &rest[i..]))
        .unwrap_or("");
    if path.trim_end_matches('/').ends_with("/api/v1") || path.contains("/api/v1/") {
        let base = &url[..url.len() - path.len()];
        return Err(Usage(format!(
            "the server URL {url:?} includes the API path: use the base URL (--url {base}); the \
             CLI adds /api/v1/… itself"
        )));
    }
    Ok(())
}

/// What a command acts on, for hints that name the right next command.
#[derive(Debug, Clone, Copy)]
struct Subject {
    /// `worker …` rather than `task …`.
    worker: bool,
    /// The command acts as a principal: the API key, else the dev key
    /// (task create, worker register, the operator commands).
    uses_principal: bool,
    /// An operator command (keys, workers admin, invites, audit).
    operator: bool,
    /// An API key was given (MEATSPACE_API_KEY / --api-key).
    api_key: bool,
    task: Option<uuid::Uuid>,
}

impl Subject {
    fn of(command: &Command, api_key: bool) -> Subject {
        use args::{TaskCommand as T, WorkerCommand as W};
        let mut operator = false;
        let (worker, uses_principal, task) = match command {
            Command::Task(t) => match t {
                T::Create { .. } => (false, true, None),
                T::List { .. } => (false, true, None),
                T::Publish { id }
                | T::Get { id }
                | T::Cancel { id }
                | T::Import { id, .. }
                | T::Watch { id, .. }
                | T::Respond { id, .. }
                | T::Review { id, .. }
                | T::Extend { id, .. }
                | T::Photo { id, .. } => (false, false, Some(*id)),
            },
            Command::Worker(w) => match w {
                W::Register { .. } => (true, true, None),
                W::Tasks { .. } => (true, false, None),
                W::Get { id }
                | W::Claim { id }
                | W::Start { id }
                | W::Message { id, .. }
                | W::Photo { id, .. }
                | W::Issue { id, .. }
                | W::Complete { id, .. }
                | W::Stop { id, .. } => (true, false, Some(*id)),
                W::List { .. }
                | W::Suspend { .. }
                | W::Reinstate { .. }
                | W::Qualify { .. }
                | W::Unqualify { .. }
                | W::Qualifications { .. } => {
                    operator = true;
                    (true, true, None)
                }
                // The agent's own block list.
                W::Block { .. } => (false, true, None),
            },
            Command::Key(_) | Command::Invite(_) | Command::Audit { .. } => {
                operator = true;
                (false, true, None)
            }
            Command::Mcp => (false, false, None),
        };
        Subject {
            worker,
            uses_principal,
            operator,
            api_key,
            task,
        }
    }

    /// `<id>` as text, or a placeholder that reads as one.
    fn id(&self) -> String {
        self.task
            .map(|id| id.to_string())
            .unwrap_or_else(|| "<task id>".into())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let output = cli.global.output;
    let subject = Subject::of(&cli.command, cli.global.api_key.is_some());
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => {
            let code = exit_code(&e);
            let message = one_line(&e);
            let hint = hint(&e, subject);
            match output {
                // One JSON object on stderr, as every error in JSON mode:
                // stdout carries only results.
                Output::Json => {
                    let problem = e.downcast_ref::<Error>().and_then(Error::problem).map(|p| {
                        serde_json::json!({
                            "status": p.status, "type": p.kind, "title": p.title,
                            "detail": p.detail, "task_state": p.task_state,
                        })
                    });
                    let doc = serde_json::json!({
                        "kind": "error",
                        "exit_code": code,
                        "status": e.downcast_ref::<Error>().and_then(Error::status),
                        "message": message,
                        "hint": (!hint.is_empty()).then_some(&hint),
                        "problem": problem,
                    });
                    eprintln!("{doc}");
                }
                Output::Human if hint.is_empty() => eprintln!("error: {message}"),
                Output::Human => eprintln!("error: {message}\n  hint: {hint}"),
            }
            ExitCode::from(code)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let state = StateDir::resolve(cli.global.state_dir.clone())?;
    let ctx = Ctx {
        global: cli.global,
        state,
    };
    match cli.command {
        Command::Task(cmd) => task::run(&ctx, cmd).await,
        Command::Worker(cmd) => worker::run(&ctx, cmd).await,
        Command::Key(cmd) => operator::key(&ctx, cmd).await,
        Command::Invite(cmd) => operator::invite(&ctx, cmd).await,
        Command::Audit {
            principal,
            since,
            until,
            page,
        } => operator::audit(&ctx, principal, since, until, page).await,
        Command::Mcp => {
            let url = ctx
                .global
                .url
                .clone()
                .unwrap_or_else(|| DEFAULT_URL.to_owned());
            check_base_url(&url)?;
            // The same directory as every other command: see meatspace_mcp::state_dir.
            let root = ctx.state.root().to_owned();
            let credentials = meatspace_mcp::stdio::Credentials {
                dev_key: ctx.global.dev_key.clone(),
                api_key: ctx.global.api_key.clone(),
            };
            meatspace_mcp::stdio::serve(&url, credentials, &root).await
        }
    }
}

/// The exit status of a failure (see [`exit`]).
fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<Usage>().is_some() {
        return exit::USAGE;
    }
    match e.downcast_ref::<Error>() {
        Some(Error::Invalid(_)) => exit::USAGE,
        Some(Error::Transport(_)) => exit::UNAVAILABLE,
        Some(err) => match err.status() {
            Some(401 | 403) => exit::UNAUTHORIZED,
            Some(404) => exit::NOT_FOUND,
            Some(429 | 502 | 503 | 504) => exit::UNAVAILABLE,
            _ => exit::FAILED,
        },
        None => exit::FAILED,
    }
}

/// An error and its causes on one line, each cause once.
pub fn one_line(e: &anyhow::Error) -> String {
    meatspace_domain::error_text::one_line(e.as_ref())
}

/// What to do next, for the common failures; empty when the message says it.
fn hint(e: &anyhow::Error, subject: Subject) -> String {
    let Some(client_error) = e.downcast_ref::<Error>() else {
        return String::new();
    };
    let id = subject.id();
    match client_error {
        Error::Transport(_) => "is the server running? Point the CLI at it with --url or \
             MEATSPACE_URL (default http://127.0.0.1:8080)"
            .into(),
        Error::Problem(p) => match p.status {
            401 if p.slug() == "dev-key-disabled" => "this server has the development key \
                 turned off: ask an operator for an API key (they run `meatspace key create \
                 --name NAME`), then set MEATSPACE_API_KEY=msk_… (or pass --api-key)"
                .into(),
            401 if subject.uses_principal && subject.api_key => "the server did not accept the \
                 API key (revoked, expired, rotated past its grace period, or mistyped): check \
                 MEATSPACE_API_KEY / --api-key, or ask an operator for a new one (`meatspace key \
                 create`)"
                .into(),
            401 if subject.uses_principal => "the server did not accept the development key: \
                 pass the one it printed at start (--dev-key or MEATSPACE_DEV_KEY; the embedded \
                 server keeps it in .meatspace/dev.key), or an API key (MEATSPACE_API_KEY)"
                .into(),
            403 if subject.operator => "this needs an operator's API key (scope operator): \
                 set MEATSPACE_API_KEY to one, or ask an operator to do it"
                .into(),
            403 => "the API key lacks the scope this needs (`meatspace key get KEY_ID` shows \
                 its scopes): ask an operator for a key with it (`meatspace key create \
                 --scope …`)"
                .into(),
            401 if subject.worker => "the server did not accept the worker token: check that \
                 --url is the server you registered on; an operator may have suspended you or \
                 rotated your token (ask them), or register again with `meatspace worker \
                 register --name NAME --replace`"
                .into(),
            401 => format!(
                "the server did not accept the task's token: check that --url is the server \
                 task {id} was created on (`meatspace task import {id} --token-file FILE` \
                 replaces a stored token)"
            ),
            404 if subject.worker => format!(
                "check the id ({id}) and that --url is the server the task lives on; \
                 `meatspace worker tasks` lists the open ones"
            ),
            404 if subject.operator => {
                "check the id, and that --url is the server it lives on".into()
            }
            404 if subject.api_key => format!(
                "check the id ({id}), that --url is the server the task lives on, and that your \
                 API key's principal owns it (`meatspace task list` shows your tasks)"
            ),
            404 => format!("check the id ({id}), and that --url is the server the task lives on"),
            409 if subject.operator => String::new(),
            409 if subject.worker => {
                format!("see the task's current state with `meatspace worker get {id}`")
            }
            409 => format!("see the task's current state with `meatspace task get {id}`"),
            422 => "fix the input as the message says; `--help` lists each option".into(),
            429 | 503 => "the server is busy or unavailable; try again in a moment".into(),
            _ => String::new(),
        },
        Error::Invalid(_) | Error::State(_) => String::new(),
        Error::Http { .. } => "is --url pointing at a meatspace API server?".into(),
        Error::Decode(_) => "the server may be a different version than this CLI".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_slips_say_what_to_write() {
        let e = check_base_url("127.0.0.1:8080").unwrap_err().0;
        assert!(e.contains("add http://"), "{e}");
        let e = check_base_url("http://127.0.0.1:8080/api/v1")
            .unwrap_err()
            .0;
        assert!(e.contains("--url http://127.0.0.1:8080)"), "{e}");
        let e = check_base_url("http://h:1/api/v1/tasks").unwrap_err().0;
        assert!(e.contains("base URL"), "{e}");
        check_base_url("http://127.0.0.1:8080").unwrap();
        check_base_url("https://example.test/meatspace/").unwrap();
    }
}
