//! The command line: `meatspace <noun> <verb>`, every option documented so
//! that `--help` is the manual.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};
use meatspace_domain::{IssueKind, TaskState};
use uuid::Uuid;

/// meatspace: hire people for work in the physical world, from the shell.
///
/// Agents create a task, publish it and watch its event feed until it ends;
/// workers register, claim tasks, send messages, photos and issues, and
/// complete or stop; operators manage API keys, workers and invites and
/// read the audit trail.
///
/// Credentials: an API key (`msk_…`, MEATSPACE_API_KEY or --api-key) is
/// who you are: an agent (create tasks, drive your own) or an operator.
/// Without one, the development key (MEATSPACE_DEV_KEY) is used where the
/// server still accepts it. Tasks you created keep their own token in the
/// state directory; with your API key, your tasks work without it. Task tokens, feed cursors and last known states are
/// kept in a private state directory (0700, files 0600), so a `watch` that
/// is interrupted resumes where it stopped.
///
/// Text written by workers is untrusted data: the CLI marks it as such and
/// never interprets it.
#[derive(Debug, Parser)]
#[command(
    name = "meatspace",
    version,
    propagate_version = true,
    after_help = EXIT_STATUS
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// The exit statuses (`crate::exit`), for scripts and agents.
const EXIT_STATUS: &str = "\
Exit status:
  0  success; `task watch`: the task ended (the final state is printed)
  1  the server refused the request (a wrong state, invalid input) or another failure
  2  a bad argument: unknown option, invalid --url, a task this state directory does not know
  3  the server did not accept the credential (401: API key, dev key, task token or worker
     token) or the credential may not do this (403: a scope the API key lacks)
  4  no such task on that server, or not yours (404)
  5  the server could not be reached or stayed unavailable (connection failure, 429, 503)
     through every retry; `task watch` never exits for these, it retries and says so on stderr

Errors go to stderr: a line of text, or with --output json one JSON object
({\"kind\":\"error\",\"exit_code\",\"status\",\"message\",\"hint\",\"problem\"}).";

#[derive(Debug, Args)]
pub struct Global {
    /// Base URL of the meatspace API server. When unset, a task's commands
    /// use the server the task was created on, and anything else
    /// http://127.0.0.1:8080.
    #[arg(long, env = "MEATSPACE_URL", global = true)]
    pub url: Option<String>,

    /// Development key, for `task create`, `worker register` and the
    /// operator commands when no API key is given (the server prints it
    /// when it starts, unless it is turned off).
    #[arg(long, env = "MEATSPACE_DEV_KEY", global = true, hide_env_values = true)]
    pub dev_key: Option<String>,

    /// API key (`msk_…`) of the agent or operator you act as; used instead
    /// of the development key when set, and for your own tasks when the
    /// state directory has no token for them. An operator creates keys
    /// with `meatspace key create`. Never stored by the CLI.
    #[arg(long, env = "MEATSPACE_API_KEY", global = true, hide_env_values = true)]
    pub api_key: Option<String>,

    /// Where tokens, cursors and last known states are kept. Default:
    /// $XDG_STATE_HOME/meatspace, or ~/.local/state/meatspace.
    #[arg(long, env = "MEATSPACE_STATE_DIR", global = true)]
    pub state_dir: Option<PathBuf>,

    /// Output format: `human` (text for people) or `json` for scripts (one
    /// JSON document per command on stdout, `task watch` one object per
    /// line; errors as one JSON object on stderr).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Human, env = "MEATSPACE_OUTPUT", global = true)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    #[value(alias = "text")]
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Tasks, as the agent that created them.
    #[command(subcommand)]
    Task(TaskCommand),
    /// The worker side: register, find tasks, do them; and, for operators,
    /// list, suspend and reinstate workers.
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// API keys (operator): create, list, rotate, revoke.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Worker invites (operator): list, revoke.
    #[command(subcommand)]
    Invite(InviteCommand),
    /// The audit trail of privileged actions (operator), newest first.
    Audit {
        /// Only the actions of this principal (its id).
        #[arg(long, value_name = "ID")]
        principal: Option<Uuid>,
        /// Only actions at or after this time (RFC 3339).
        #[arg(long, value_name = "T")]
        since: Option<DateTime<Utc>>,
        /// Only actions before this time (RFC 3339).
        #[arg(long, value_name = "T")]
        until: Option<DateTime<Utc>>,
        #[command(flatten)]
        page: Page,
    },
    /// Serve the agent tools over MCP on stdin/stdout, for agents that
    /// launch local tools. Task tokens and cursors stay in the state
    /// directory; tools take only a task id and never return a token. Point
    /// the agent's MCP configuration at `meatspace mcp` with MEATSPACE_URL
    /// and MEATSPACE_API_KEY (or MEATSPACE_DEV_KEY) set; with the API key,
    /// the tools also reach the key's tasks that have no local record.
    Mcp,
}

/// `LAT,LON` as two numbers; the server checks their ranges.
fn parse_point(s: &str) -> Result<(f64, f64), String> {
    s.split_once(',')
        .and_then(|(lat, lon)| Some((lat.trim().parse().ok()?, lon.trim().parse().ok()?)))
        .ok_or_else(|| format!("{s:?} is not LATITUDE,LONGITUDE (for example 52.52,13.405)"))
}

fn parse_presence(s: &str) -> Result<meatspace_client::Presence, String> {
    meatspace_client::Presence::parse(s)
        .ok_or_else(|| format!("{s:?} is not one of none, flag, require"))
}

/// A qualification's value as typed: an integer when it reads as one.
pub fn qualification_value(s: &str) -> meatspace_client::types::QualificationValue {
    use meatspace_client::types::QualificationValue;
    s.parse::<i64>()
        .map(QualificationValue::Integer)
        .unwrap_or_else(|_| QualificationValue::Text(s.to_owned()))
}

/// `--require`: NAME, NAME=VALUE, NAME=A|B, NAME>=N or NAME<=N.
fn parse_requirement(s: &str) -> Result<meatspace_client::types::Requirement, String> {
    use meatspace_client::types::Requirement;
    let bound = |rest: &str| {
        rest.trim()
            .parse::<i64>()
            .map_err(|_| format!("{s:?}: a bound is an integer"))
    };
    let r = if let Some((name, n)) = s.split_once(">=") {
        Requirement {
            at_least: Some(bound(n)?),
            ..Requirement::exists(name.trim())
        }
    } else if let Some((name, n)) = s.split_once("<=") {
        Requirement {
            at_most: Some(bound(n)?),
            ..Requirement::exists(name.trim())
        }
    } else if let Some((name, v)) = s.split_once('=') {
        let values: Vec<_> = v
            .split('|')
            .map(|v| qualification_value(v.trim()))
            .collect();
        let mut r = Requirement::exists(name.trim());
        if values.len() == 1 {
            r.equals = values.into_iter().next();
        } else {
            r.one_of = Some(values);
        }
        r
    } else {
        Requirement::exists(s.trim())
    };
    meatspace_domain::qualification::check_requirements(std::slice::from_ref(&r))
        .map_err(|e| e.replace("requirements[0]: ", ""))?;
    Ok(r)
}

fn parse_json_object(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str(s) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("the result is a JSON object of the schema's fields".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Create a task (a draft unless --publish) and keep its token locally.
    Create {
        /// What a person should do, in plain text (1-4000 characters).
        #[arg(long, short = 'd')]
        description: String,
        /// Lifetime in seconds from now (the server's default otherwise;
        /// `GET /api/v1/capabilities` lists the bounds).
        #[arg(long, value_name = "SECONDS")]
        lifetime: Option<i64>,
        /// Publish it at once, so workers can claim it.
        #[arg(long)]
        publish: bool,
        /// Deliver the task's events to this URL as signed webhooks. The
        /// signing secret is printed once and kept in the state directory.
        #[arg(long, value_name = "URL")]
        webhook: Option<String>,
        /// Where the task is done: LATITUDE,LONGITUDE in WGS 84 degrees.
        #[arg(long, value_name = "LAT,LON", value_parser = parse_point, allow_hyphen_values = true)]
        at: Option<(f64, f64)>,
        /// Metres around --at that count as on site (the server's default, 100, otherwise).
        #[arg(long, value_name = "METRES", requires = "at")]
        radius: Option<u32>,
        /// An address line for the worker.
        #[arg(long, value_name = "TEXT", requires = "at")]
        address: Option<String>,
        /// What to ask of the positions a worker's device sends when
        /// starting and with each photo: none, flag (mark off-site ones) or
        /// require (refuse off-site ones). A browser's position is evidence,
        /// not proof.
        #[arg(long, value_name = "RULE", value_parser = parse_presence, requires = "at")]
        presence: Option<meatspace_client::Presence>,
        /// What the worker must send back: a file holding a JSON Schema
        /// object in the server's subset (`-` reads standard input). The
        /// worker fills it in as a form.
        #[arg(long, value_name = "FILE")]
        result_schema: Option<PathBuf>,
        /// Review the work before it counts: the worker's complete becomes
        /// a submission you answer with `task review`.
        #[arg(long)]
        review: bool,
        /// With --review: seconds after a submission at which it is
        /// accepted if you have not answered (default two days).
        #[arg(long, value_name = "SECONDS", requires = "review")]
        auto_accept: Option<u32>,
        /// Only workers with this qualification see and claim the task
        /// (repeat: all must hold): NAME (held), NAME=VALUE, NAME=A|B (one
        /// of), NAME>=N or NAME<=N (integer bounds).
        #[arg(long = "require", value_name = "RULE", value_parser = parse_requirement)]
        requirements: Vec<meatspace_client::types::Requirement>,
    },
    /// Answer a worker's submission of a task created with --review.
    #[command(group(clap::ArgGroup::new("verdict").required(true)))]
    Review {
        /// The task id.
        id: Uuid,
        /// The work counts: the task completes with the submitted result.
        #[arg(long, group = "verdict")]
        accept: bool,
        /// Send the work back: what the worker should change.
        #[arg(long, value_name = "TEXT", group = "verdict")]
        revise: Option<String>,
        /// The work does not count: the task is cancelled with this reason.
        #[arg(long, value_name = "TEXT", group = "verdict")]
        reject: Option<String>,
    },
    /// Publish a draft: workers can now see and claim it.
    Publish {
        /// The task id (as `task create` or `worker tasks` printed it).
        id: Uuid,
    },
    /// Show a task's current state (from the server) and update the local copy.
    Get {
        /// The task id (as `task create` or `worker tasks` printed it).
        id: Uuid,
    },
    /// List your tasks. With an API key: your tasks as the server has
    /// them (newest first), each marked when the state directory also has
    /// it; without one: the tasks in the state directory with their last
    /// known states.
    List {
        /// Only tasks in this state.
        #[arg(long, value_enum)]
        state: Option<TaskState>,
        /// Only the state directory, even with an API key.
        #[arg(long, conflicts_with = "server")]
        local: bool,
        /// Ask the server even without an API key (the development key's
        /// tasks).
        #[arg(long)]
        server: bool,
        #[command(flatten)]
        page: Page,
    },
    /// Adopt a task created elsewhere (with curl, the client crate or
    /// another state directory), so that `task watch`, `task respond` and
    /// the rest work on it. The token is checked against the server first.
    Import {
        /// The task id.
        id: Uuid,
        /// File holding the task's agent token (`mst_…`); `-` or no flag
        /// reads it from stdin.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
    /// Follow a task's events until it ends. Prints each event, stores the
    /// cursor after printing, and resumes from it when run again. Exits 0
    /// with the final state once the task is terminal. While the server is
    /// unreachable or answers 503/429 it retries with backoff and says so
    /// on stderr; it exits non-zero only for what retrying cannot fix (see
    /// the exit statuses in `meatspace --help`).
    Watch {
        /// The task id.
        id: Uuid,
        /// How to wait for events: Server-Sent Events with long poll as the
        /// fallback (auto), or one of them only.
        #[arg(long, value_enum, default_value_t = TransportArg::Auto, env = "MEATSPACE_TRANSPORT")]
        transport: TransportArg,
        /// Start from the first event instead of the stored cursor.
        #[arg(long)]
        from_start: bool,
    },
    /// Answer a worker's issue (EVENT_ID is the id of its worker.issue event).
    Respond {
        /// The task id.
        id: Uuid,
        /// Id of the worker.issue event (shown by `task watch`).
        event_id: i64,
        /// clarify and acknowledge need --text; cancel also cancels the task.
        #[arg(long, value_enum)]
        action: ActionArg,
        /// The answer for the worker.
        #[arg(long)]
        text: Option<String>,
    },
    /// Cancel a task that has not ended.
    Cancel {
        /// The task id (as `task create` or `worker tasks` printed it).
        id: Uuid,
    },
    /// Give a task more time (it never shortens one).
    Extend {
        /// The task id.
        id: Uuid,
        #[command(flatten)]
        by: ExtendBy,
    },
    /// Save a photo a worker sent (PHOTO_ID from its worker.photo event).
    Photo {
        /// The task id.
        id: Uuid,
        /// The photo_id of the worker.photo event.
        photo_id: Uuid,
        /// File to write (default: <PHOTO_ID>.<jpg|png|webp> here).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// The page of a server-side listing.
#[derive(Debug, Args)]
pub struct Page {
    /// Largest number of entries to show (1-100).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Continue a listing: the `next_cursor` a previous page printed.
    #[arg(long)]
    pub cursor: Option<String>,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ExtendBy {
    /// Seconds to add to the current deadline.
    #[arg(long, value_name = "N")]
    pub add_seconds: Option<i64>,
    /// The new deadline (RFC 3339, e.g. 2030-01-02T15:04:05Z).
    #[arg(long, value_name = "T")]
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// Server-Sent Events; long poll when the server has no stream.
    Auto,
    /// Server-Sent Events only.
    Sse,
    /// Long poll only.
    LongPoll,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ActionArg {
    /// Answer the question; the worker carries on.
    Clarify,
    /// Note the issue; the worker carries on.
    Acknowledge,
    /// Cancel the task because of the issue.
    Cancel,
}

#[derive(Debug, Subcommand)]
pub enum WorkerCommand {
    /// Register as a worker (needs the dev key); the token is kept locally.
    Register {
        /// Display name (1-200 characters).
        #[arg(long)]
        name: String,
        /// Replace the worker already registered in this state directory.
        #[arg(long)]
        replace: bool,
    },
    /// List open tasks, oldest first.
    Tasks {
        /// Largest number of tasks to show (1-100).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one task (open, or assigned to you).
    Get {
        /// The task id (as `task create` or `worker tasks` printed it).
        id: Uuid,
    },
    /// Claim an open task (exactly one of several racing workers wins).
    Claim {
        /// The task id (as `task create` or `worker tasks` printed it).
        id: Uuid,
    },
    /// Start the task you claimed.
    Start {
        /// The task id (as `task create` or `worker tasks` printed it).
        id: Uuid,
    },
    /// Send the agent a text message.
    Message {
        /// The task id.
        id: Uuid,
        /// The message (1-4000 characters).
        text: String,
    },
    /// Send the agent a photo (JPEG, PNG or WebP).
    Photo {
        /// The task id.
        id: Uuid,
        /// A JPEG, PNG or WebP file; the server strips its metadata.
        file: PathBuf,
    },
    /// Raise a typed issue for the agent to answer.
    Issue {
        /// The task id.
        id: Uuid,
        /// What kind of problem it is.
        #[arg(long, value_enum)]
        kind: IssueKind,
        /// What the agent should know (1-4000 characters).
        #[arg(long)]
        text: String,
    },
    /// Complete the task you are doing.
    Complete {
        /// The task id.
        id: Uuid,
        /// A note for the agent (the event's `note`).
        #[arg(long, alias = "text")]
        note: Option<String>,
        /// The typed result a task with a result schema asks for, as a
        /// JSON object (photo fields hold ids of photos sent for the task).
        #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
        result: Option<serde_json::Value>,
    },
    /// Stop the task (always allowed to the assigned worker).
    Stop {
        /// The task id.
        id: Uuid,
        /// Why, for the agent (the event's `reason`).
        #[arg(long, alias = "text")]
        reason: Option<String>,
    },
    /// Operator: list the registered workers.
    List {
        #[command(flatten)]
        page: Page,
    },
    /// Operator: suspend a worker. Its token and browser sessions are
    /// refused at once and the task it holds reopens for someone else.
    Suspend {
        /// The worker's id (`meatspace worker list`).
        worker_id: Uuid,
        /// Why, kept in the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Operator: let a suspended worker work again.
    Reinstate {
        /// The worker's id.
        worker_id: Uuid,
    },
    /// Operator: grant a worker a qualification (or change its value or
    /// expiry). Tasks that require it then show to the worker.
    Qualify {
        /// The worker's id.
        worker_id: Uuid,
        /// Lowercase letters, digits and : . _ - (e.g. language:de, vehicle, level).
        name: String,
        /// A value: an integer (a level) or a text (e.g. car).
        #[arg(long)]
        value: Option<String>,
        /// When the grant lapses (RFC 3339).
        #[arg(long, value_name = "T")]
        expires_at: Option<DateTime<Utc>>,
    },
    /// Operator: revoke a qualification. A task the worker holds stays its own.
    Unqualify {
        /// The worker's id.
        worker_id: Uuid,
        /// The qualification's name.
        name: String,
    },
    /// Operator: a worker's qualifications.
    Qualifications {
        /// The worker's id.
        worker_id: Uuid,
    },
    /// Agent: block a worker from every task of your API key's principal
    /// (or, with --undo, lift the block).
    Block {
        /// The worker's id (from a task's worker_id).
        worker_id: Uuid,
        /// Lift the block instead.
        #[arg(long)]
        undo: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create an API key. Its secret is printed once, here, and stored
    /// nowhere by the CLI: hand it to the agent or operator it is for.
    Create {
        /// What the key is for, e.g. billing-agent (1-200 characters).
        #[arg(long)]
        name: String,
        /// The kind of principal a new key creates.
        #[arg(long, value_enum, default_value_t = KindArg::Agent)]
        kind: KindArg,
        /// Another key for this existing principal (e.g. to rotate by
        /// hand); --kind is then ignored.
        #[arg(long, value_name = "ID")]
        principal: Option<Uuid>,
        /// A scope of the key (repeat for several): tasks,
        /// workers:register, invites, operator. Default: tasks for an
        /// agent, operator for an operator.
        #[arg(long = "scope", value_name = "SCOPE", value_parser = parse_scope)]
        scopes: Vec<meatspace_client::types::Scope>,
        /// When the key stops working (RFC 3339); never when absent.
        #[arg(long, value_name = "T")]
        expires_at: Option<DateTime<Utc>>,
    },
    /// List the API keys (never their secrets).
    List {
        #[command(flatten)]
        page: Page,
    },
    /// Show one API key.
    Get {
        /// The key's id (the 32 hex digits after `msk_`).
        key_id: Uuid,
    },
    /// Give a key a new secret, printed once; the old secret keeps working
    /// for the grace period so the key's user can switch over.
    Rotate {
        /// The key's id (the 32 hex digits after `msk_`).
        key_id: Uuid,
        /// How long the old secret still works, in seconds (the server's
        /// default: 86400; at most 604800).
        #[arg(long, value_name = "SECONDS")]
        grace_seconds: Option<u64>,
    },
    /// Revoke a key at once. Its principal's tasks keep running (their
    /// task tokens still work) unless --cancel-tasks.
    Revoke {
        /// The key's id (the 32 hex digits after `msk_`).
        key_id: Uuid,
        /// Also cancel every task of the key's principal that has not ended.
        #[arg(long)]
        cancel_tasks: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// Creates tasks and drives its own.
    Agent,
    /// Manages keys, workers and invites; reads the audit trail.
    Operator,
}

fn parse_scope(s: &str) -> Result<meatspace_client::types::Scope, String> {
    meatspace_client::types::Scope::parse(s).ok_or_else(|| {
        format!("unknown scope {s:?}: one of tasks, workers:register, invites, operator")
    })
}

#[derive(Debug, Subcommand)]
pub enum InviteCommand {
    /// List the worker invites, with who created each.
    List {
        #[command(flatten)]
        page: Page,
    },
    /// Revoke an invite: its link no longer signs anyone in.
    Revoke {
        /// The invite's id (`meatspace invite list`).
        invite_id: Uuid,
    },
}
