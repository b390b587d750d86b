//! Running the `meatspace` CLI binary as a user would: one command, its
//! exit status and output, and the JSON it prints with `--output json`.

use std::process::ExitStatus;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

pub use crate::process::cli_bin;

/// What a finished command printed and how it exited.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// The exit code (`None` when a signal ended it).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Runs `cmd` with `args` to its end (within two minutes).
pub async fn run(mut cmd: Command, args: &[&str]) -> Ran {
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.args(args).output())
        .await
        .expect("the command finishes")
        .expect("run the CLI");
    Ran {
        status: out.status,
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    }
}

/// Runs `meatspace --output json ARGS`, which must succeed and print one
/// JSON document.
pub async fn json_of(cmd: Command, args: &[&str]) -> Value {
    let ran = run(cmd, &[&["--output", "json"], args].concat()).await;
    assert!(
        ran.status.success(),
        "meatspace {args:?} failed ({:?}): {}\n{}",
        ran.code(),
        ran.stderr,
        ran.stdout
    );
    serde_json::from_str(ran.stdout.trim())
        .unwrap_or_else(|e| panic!("meatspace {args:?} printed no JSON ({e}): {}", ran.stdout))
}

/// Runs `meatspace --output json ARGS`, which must fail with exit `code`;
/// the error document it printed on stderr.
pub async fn refused(cmd: Command, args: &[&str], code: i32) -> Value {
    let ran = run(cmd, &[&["--output", "json"], args].concat()).await;
    assert_eq!(
        ran.code(),
        Some(code),
        "meatspace {args:?}: {}\n{}",
        ran.stderr,
        ran.stdout
    );
    serde_json::from_str(ran.stderr.trim())
        .unwrap_or_else(|e| panic!("meatspace {args:?}: no JSON error ({e}): {}", ran.stderr))
}
