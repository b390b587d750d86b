//! `meatspace`: the command-line tool for agents and workers, built on
//! `meatspace-client`. This file only parses the command line, runs the
//! command and turns a failure into a message that says what to do next.

mod args;
mod output;
mod state;
mod task;
mod worker;

use std::process::ExitCode;

use clap::Parser;
use meatspace_client::{Client, Error};

use args::{Cli, Command};
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
        let mut b = Client::builder(url);
        if let Some(key) = &self.global.dev_key {
            b = b.dev_key(key.clone());
        }
        Ok(b.build()?)
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
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", explain(&e));
            ExitCode::FAILURE
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
        Command::Mcp => {
            let url = ctx
                .global
                .url
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
            let root = ctx.state.root().join("mcp");
            meatspace_mcp::stdio::serve(&url, ctx.global.dev_key.clone(), &root).await
        }
    }
}

/// The error with a hint about the next step, for the common failures.
fn explain(e: &anyhow::Error) -> String {
    let Some(client_error) = e.downcast_ref::<Error>() else {
        return format!("{e:#}");
    };
    let hint = match client_error {
        Error::Transport(_) => {
            "is the server running? Point the CLI at it with --url or MEATSPACE_URL \
             (default http://127.0.0.1:8080)"
        }
        Error::Problem(p) => match (p.status, p.slug()) {
            (401, _) => {
                "the server did not accept the credential: for create and register pass the dev key \
                 (--dev-key or MEATSPACE_DEV_KEY; the server prints it at start); for a task, check \
                 that --url is the server it was created on"
            }
            (404, _) => "check the id, and that --url is the server the task lives on",
            (409, _) => "see the task's current state with `meatspace task get ID`",
            (422, _) => "fix the input as the message says; `--help` lists each option",
            (429 | 503, _) => "the server is busy or unavailable; try again in a moment",
            _ => "",
        },
        Error::Invalid(_) => "",
        Error::Http { .. } => "is --url pointing at a meatspace API server?",
        Error::Decode(_) => "the server may be a different version than this CLI",
    };
    let msg = format!("{e:#}");
    if hint.is_empty() {
        msg
    } else {
        format!("{msg}\n  hint: {hint}")
    }
}
