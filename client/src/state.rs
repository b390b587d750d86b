//! The local state directory: one file per task (its agent token, feed
//! cursor and last known state) and one for the registered worker. It is
//! the one directory of every local tool: the CLI (`meatspace task …`) and
//! the MCP stdio server (`meatspace mcp`) read and write the same records,
//! so a task created by either can be followed with the other.
//!
//! Tokens are credentials, so the directory is 0700 and every file 0600,
//! created with those modes (never widened then narrowed). Every write goes
//! to a temporary file in the same directory that is fsynced, renamed over
//! the old file, and followed by an fsync of the directory: a crash leaves
//! either the old or the new file, never a torn one — which is what lets
//! `task watch` trust its stored cursor after a SIGKILL.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use meatspace_domain::Task;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::Error;

type Result<T> = std::result::Result<T, Error>;

/// What failed on `path`, as the error the caller shows.
fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::State(format!("{what} {}: {e}", path.display()))
}

/// What the CLI remembers about one task it created. Its credentials stay
/// out of debug output.
#[serde_with::skip_serializing_none]
#[derive(Clone, Serialize, Deserialize, derive_more::Debug)]
pub struct TaskRecord {
    pub id: Uuid,
    /// The server the task lives on (its token is valid only there).
    pub server: String,
    /// The task's agent token; absent for a task taken up with the API key
    /// of its owner (`Client::task_owned`), which the commands then use.
    #[debug(skip)]
    pub agent_token: Option<String>,
    /// Signing secret of the task's webhook endpoint, when it has one.
    #[debug(skip)]
    pub webhook_secret: Option<String>,
    /// Id of the last event `task watch` printed: it resumes after it.
    pub cursor: i64,
    /// The task as last seen.
    pub task: Task,
    /// When this record was last written.
    pub updated_at: DateTime<Utc>,
}

impl TaskRecord {
    /// The handle this record's commands use: with the task's token when
    /// the record has it, else with the owner's API key.
    pub fn handle(&self, client: &crate::Client) -> crate::TaskHandle {
        match &self.agent_token {
            Some(token) => client.task(self.id, token.clone()),
            None => client.task_owned(self.id),
        }
    }
}

/// What the CLI remembers about the worker it registered.
#[derive(Clone, Serialize, Deserialize, derive_more::Debug)]
pub struct WorkerRecord {
    pub id: Uuid,
    pub name: String,
    pub server: String,
    #[debug(skip)]
    pub worker_token: String,
}

/// The state directory, created on first use.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// `explicit` (flag or MEATSPACE_STATE_DIR), else
    /// $XDG_STATE_HOME/meatspace, else ~/.local/state/meatspace.
    pub fn resolve(explicit: Option<PathBuf>) -> Result<StateDir> {
        let root = match explicit {
            Some(p) => p,
            None => default_root()?,
        };
        Ok(StateDir { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn tasks_dir(&self) -> PathBuf {
        self.root.join("tasks")
    }

    pub fn task_file(&self, id: Uuid) -> PathBuf {
        self.tasks_dir().join(format!("{id}.json"))
    }

    fn worker_file(&self) -> PathBuf {
        self.root.join("worker.json")
    }

    /// Creates the directories (0700) when they do not exist, and refuses
    /// to use ones that others can read.
    fn ensure_dirs(&self) -> Result<()> {
        for dir in [self.root.clone(), self.tasks_dir()] {
            private_dir(&dir)?;
        }
        Ok(())
    }

    pub fn load_task(&self, id: Uuid) -> Result<Option<TaskRecord>> {
        read_json(&self.task_file(id))
    }

    /// The record of `id`, or an error that says how such a record comes
    /// to exist.
    pub fn task(&self, id: Uuid) -> Result<TaskRecord> {
        match self.load_task(id)? {
            Some(record) => Ok(record),
            None => Err(Error::Invalid(format!(
                "no local record of task {id} in {}: only tasks created with `meatspace task create` \
                 (or through `meatspace mcp`) or adopted with `meatspace task import {id} --token-file FILE` have their token \
                 here (pass --state-dir or set MEATSPACE_STATE_DIR if you used another one; \
                 `meatspace task list` shows what is here); with the API key of the task's owner \
                 (MEATSPACE_API_KEY) no record is needed",
                self.root.display()
            ))),
        }
    }

    pub fn save_task(&self, record: &TaskRecord) -> Result<()> {
        self.ensure_dirs()?;
        let _lock = self.lock()?;
        write_json(&self.task_file(record.id), record)
    }

    /// Reads, changes and writes the record of `id` under the directory's
    /// lock, so a `watch` storing its cursor and another command storing a
    /// new state cannot undo each other's write.
    pub fn update_task(
        &self,
        id: Uuid,
        change: impl FnOnce(&mut TaskRecord),
    ) -> Result<TaskRecord> {
        self.ensure_dirs()?;
        let _lock = self.lock()?;
        let mut record = self.task(id)?;
        change(&mut record);
        record.updated_at = Utc::now();
        write_json(&self.task_file(id), &record)?;
        Ok(record)
    }

    /// An exclusive lock on the state directory, released when dropped
    /// (or when the process dies, so a SIGKILL leaves no stale lock).
    fn lock(&self) -> Result<File> {
        let path = self.root.join("lock");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error("open", &path, e))?;
        f.lock().map_err(|e| io_error("lock", &path, e))?;
        Ok(f)
    }

    /// Every task record, newest first.
    pub fn tasks(&self) -> Result<Vec<TaskRecord>> {
        let dir = self.tasks_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error("read", &dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| io_error("read", &dir, e))?.path();
            let is_record = path.extension().is_some_and(|x| x == "json")
                && !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if is_record && let Some(r) = read_json::<TaskRecord>(&path)? {
                out.push(r);
            }
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.task.created_at));
        Ok(out)
    }

    pub fn load_worker(&self) -> Result<Option<WorkerRecord>> {
        read_json(&self.worker_file())
    }

    pub fn worker(&self) -> Result<WorkerRecord> {
        match self.load_worker()? {
            Some(record) => Ok(record),
            None => Err(Error::Invalid(format!(
                "no worker registered in {}: run `meatspace worker register --name NAME` first \
                 (or pass the --state-dir you registered with)",
                self.root.display()
            ))),
        }
    }

    pub fn save_worker(&self, record: &WorkerRecord) -> Result<()> {
        self.ensure_dirs()?;
        let _lock = self.lock()?;
        write_json(&self.worker_file(), record)
    }
}

/// Updates the stored copy of a task after an answer from the server,
/// keeping the newer of the two.
pub fn merge_task(record: &mut TaskRecord, task: Task) {
    if task.updated_at >= record.task.updated_at || task.state.is_terminal() {
        record.task = task;
    }
}

/// $XDG_STATE_HOME/meatspace, else ~/.local/state/meatspace.
pub fn default_root() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("meatspace"));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/state/meatspace")),
        None => Err(Error::State(
            "cannot choose a state directory: neither XDG_STATE_HOME nor HOME is set; \
             pass --state-dir DIR or set MEATSPACE_STATE_DIR"
                .to_owned(),
        )),
    }
}

/// Makes sure `dir` exists with mode 0700.
fn private_dir(dir: &Path) -> Result<()> {
    match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) => return Err(io_error("create", dir, e)),
    }
    let meta = fs::metadata(dir).map_err(|e| io_error("read", dir, e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode != 0o700 {
        // An existing directory (made by hand, say): tighten it rather
        // than leave tokens readable by others.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::State(format!("restrict {} to 0700: {e}", dir.display())))?;
    }
    Ok(())
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::State(format!("{} is not a valid state file: {e}", path.display()))
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("read", path, e)),
    }
}

/// Writes `value` to `path` as JSON atomically and durably, mode 0600 (the
/// directory must exist).
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| io_error("encode", path, e))?;
    let dir = path
        .parent()
        .ok_or_else(|| io_error("write", path, "no directory"))?;
    let name = path
        .file_name()
        .ok_or_else(|| io_error("write", path, "no file name"))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        // The rename is durable only once the directory is.
        File::open(dir)?.sync_all()
    };
    write()
        .inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
        .map_err(|e| io_error("write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_private_files_in_private_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::resolve(Some(tmp.path().join("state"))).unwrap();
        let record = WorkerRecord {
            id: Uuid::new_v4(),
            name: "Ada".into(),
            server: "http://127.0.0.1:1".into(),
            worker_token: "secret".into(),
        };
        dir.save_worker(&record).unwrap();
        dir.save_worker(&record).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(dir.root()), 0o700);
        assert_eq!(mode(&dir.tasks_dir()), 0o700);
        assert_eq!(mode(&dir.worker_file()), 0o600);
        assert_eq!(mode(&dir.root().join("lock")), 0o600);
        assert_eq!(dir.worker().unwrap().worker_token, "secret");
        // No temporary file is left behind.
        let mut names: Vec<_> = fs::read_dir(dir.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["lock", "tasks", "worker.json"],
            "no temporary file is left"
        );
    }

    #[test]
    fn tightens_a_loose_existing_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let dir = StateDir::resolve(Some(root.clone())).unwrap();
        dir.ensure_dirs().unwrap();
        assert_eq!(
            fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
