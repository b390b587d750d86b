//! The stdio server's task records, kept in the one local state directory
//! of every meatspace tool ([`meatspace_client::state`], the CLI's): a
//! task created through `meatspace mcp` can be followed with `meatspace
//! task watch`, and the tools take up a task `meatspace task create` made.
//! Each record holds the task's agent token, durable cursor and last known
//! state, so that tools take only a task id and the token never enters the
//! model's context. A task reached with the API key of its owner (one this
//! directory had no record of) gets a record without a token: the key is
//! its credential, and the record keeps its cursor. The directory is 0700, every file 0600, every write
//! atomic (see [`meatspace_client::state`]).
//!
//! Earlier versions kept their own layout under `mcp/tasks/` of the same
//! root (under `tasks/` of the root when `meatspace-mcp-stdio` was given
//! `--state-dir`: [`StateDir::open`] moves those to `mcp/tasks/`). Those
//! records are still read, so an upgrade loses no token; a record found
//! only there moves to the shared layout the first time the API returns
//! its task (the shared record needs the whole task).

use std::fs::{self, DirBuilder};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use chrono::Utc;
use meatspace_client::state::{self, merge_task};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::types::TaskState;

/// What the stdio server needs of one task's record, from either layout.
#[derive(Clone, PartialEq, Serialize, Deserialize, derive_more::Debug)]
pub struct TaskRecord {
    pub task_id: Uuid,
    /// Absent for a task reached with its owner's API key; never in debug
    /// output.
    #[serde(default)]
    #[debug(skip)]
    pub agent_token: Option<String>,
    /// Events up to this id were returned and acknowledged.
    pub cursor: i64,
    pub last_known_state: TaskState,
    pub description: String,
}

/// A failure of the state directory, said with the file it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StateError(String);

impl From<meatspace_client::Error> for StateError {
    fn from(e: meatspace_client::Error) -> Self {
        StateError(e.to_string())
    }
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> StateError {
    StateError(format!("{what} {}: {e}", path.display()))
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    shared: state::StateDir,
    /// `mcp/tasks` of the same root: the layout of earlier versions.
    legacy: PathBuf,
}

impl StateDir {
    /// Opens the directory at `root` (created 0700 on the first write).
    /// Records of the old layout in `tasks/` (where the shared layout now
    /// lives) are moved aside to `mcp/tasks/`, where they are read.
    pub fn open(root: &Path) -> Result<Self, StateError> {
        let dir = StateDir {
            shared: state::StateDir::resolve(Some(root.to_owned()))?,
            legacy: root.join("mcp").join("tasks"),
        };
        let tasks = root.join("tasks");
        let entries = match fs::read_dir(&tasks) {
            Ok(entries) => entries.collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_error("read", &tasks, e)),
        };
        for entry in entries {
            let path = entry.map_err(|e| io_error("read", &tasks, e))?.path();
            let old = fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<TaskRecord>(&bytes).ok());
            if let Some(old) = old {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir.legacy)
                    .map_err(|e| io_error("create", &dir.legacy, e))?;
                let to = dir.legacy_path(old.task_id);
                fs::rename(&path, &to).map_err(|e| io_error("move", &path, e))?;
            }
        }
        Ok(dir)
    }

    /// The default location, the CLI's: `$MEATSPACE_STATE_DIR`, else
    /// `$XDG_STATE_HOME/meatspace`, else `~/.local/state/meatspace`.
    pub fn default_root() -> Option<PathBuf> {
        match std::env::var_os("MEATSPACE_STATE_DIR").filter(|d| !d.is_empty()) {
            Some(dir) => Some(PathBuf::from(dir)),
            None => state::default_root().ok(),
        }
    }

    /// The record of `task_id`, if this directory has one.
    pub fn load(&self, task_id: Uuid) -> Result<Option<TaskRecord>, StateError> {
        if let Some(r) = self.shared.load_task(task_id)? {
            return Ok(Some(from_shared(r)));
        }
        self.load_legacy(task_id)
    }

    /// Keeps a task just created on `server`: `created` is the API's
    /// answer (`task` and `agent_token`), as JSON.
    pub fn save_created(&self, server: &str, created: &Value) -> Result<(), StateError> {
        let created: meatspace_client::types::CreatedTask = serde_json::from_value(created.clone())
            .map_err(|e| StateError(format!("the API's new task was not understood: {e}")))?;
        self.shared.save_task(&state::TaskRecord {
            id: created.task.id,
            server: server.to_owned(),
            agent_token: Some(created.agent_token),
            webhook_secret: created.webhook_secret,
            cursor: 0,
            task: created.task,
            updated_at: Utc::now(),
        })?;
        Ok(())
    }

    /// Keeps a record without a token of a task on `server` reached with
    /// its owner's API key (`task`: the API's task, as JSON), unless the
    /// directory already has one.
    pub fn adopt(&self, server: &str, task: &Value) -> Result<(), StateError> {
        let task: meatspace_client::Task = serde_json::from_value(task.clone())
            .map_err(|e| StateError(format!("the API's task was not understood: {e}")))?;
        if self.load(task.id)?.is_some() {
            return Ok(());
        }
        self.shared.save_task(&state::TaskRecord {
            id: task.id,
            server: server.to_owned(),
            agent_token: None,
            webhook_secret: None,
            cursor: 0,
            task,
            updated_at: Utc::now(),
        })?;
        Ok(())
    }

    /// Stores that events up to `cursor` were acknowledged (never moving
    /// the cursor back).
    pub fn acknowledge(&self, task_id: Uuid, cursor: i64) -> Result<(), StateError> {
        if self.shared.load_task(task_id)?.is_some() {
            self.shared
                .update_task(task_id, |r| r.cursor = r.cursor.max(cursor))?;
            return Ok(());
        }
        self.update_legacy(task_id, |r| r.cursor = r.cursor.max(cursor))
    }

    /// Stores the task as the API just returned it (`task`, as JSON),
    /// moving a record of the old layout to the shared one.
    pub fn note_task(&self, server: &str, task: &Value) -> Result<(), StateError> {
        let task: meatspace_client::Task = serde_json::from_value(task.clone())
            .map_err(|e| StateError(format!("the API's task was not understood: {e}")))?;
        let id = task.id;
        if self.shared.load_task(id)?.is_some() {
            self.shared.update_task(id, |r| merge_task(r, task))?;
            return Ok(());
        }
        if let Some(old) = self.load_legacy(id)? {
            self.shared.save_task(&state::TaskRecord {
                id,
                server: server.to_owned(),
                agent_token: old.agent_token,
                webhook_secret: None,
                cursor: old.cursor,
                task,
                updated_at: Utc::now(),
            })?;
        }
        Ok(())
    }

    /// Stores the task's state as an event page reported it.
    pub fn note_state(&self, task_id: Uuid, state: TaskState) -> Result<(), StateError> {
        if self.shared.load_task(task_id)?.is_some() {
            self.shared.update_task(task_id, |r| r.task.state = state)?;
            return Ok(());
        }
        self.update_legacy(task_id, |r| r.last_known_state = state)
    }

    /// Every task record, ordered by task id.
    pub fn list(&self) -> Result<Vec<TaskRecord>, StateError> {
        let mut records: Vec<TaskRecord> =
            self.shared.tasks()?.into_iter().map(from_shared).collect();
        let entries = match fs::read_dir(&self.legacy) {
            Ok(entries) => entries.collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_error("read", &self.legacy, e)),
        };
        for entry in entries {
            let name = entry
                .map_err(|e| io_error("read", &self.legacy, e))?
                .file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| Uuid::try_parse(n).ok())
            else {
                continue;
            };
            if records.iter().any(|r| r.task_id == id) {
                continue;
            }
            if let Some(record) = self.load_legacy(id)? {
                records.push(record);
            }
        }
        records.sort_by_key(|r| r.task_id);
        Ok(records)
    }

    fn legacy_path(&self, task_id: Uuid) -> PathBuf {
        self.legacy.join(format!("{task_id}.json"))
    }

    fn load_legacy(&self, task_id: Uuid) -> Result<Option<TaskRecord>, StateError> {
        let path = self.legacy_path(task_id);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io_error("read", &path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("read", &path, e)),
        }
    }

    /// Changes a record of the old layout in place (atomically), for a
    /// task the API has not returned since the upgrade.
    fn update_legacy(
        &self,
        task_id: Uuid,
        change: impl FnOnce(&mut TaskRecord),
    ) -> Result<(), StateError> {
        let Some(mut record) = self.load_legacy(task_id)? else {
            return Ok(());
        };
        let before = record.clone();
        change(&mut record);
        if record != before {
            write_private(&self.legacy_path(task_id), &record)?;
        }
        Ok(())
    }
}

/// The tools' view of a shared record.
fn from_shared(r: state::TaskRecord) -> TaskRecord {
    TaskRecord {
        task_id: r.id,
        agent_token: r.agent_token,
        cursor: r.cursor,
        last_known_state: r.task.state,
        description: r.task.description,
    }
}

/// Writes `value` to `path` atomically, mode 0600, in a 0700 directory.
fn write_private(path: &Path, value: &impl Serialize) -> Result<(), StateError> {
    let dir = path
        .parent()
        .ok_or_else(|| io_error("write", path, "no directory"))?;
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_error("create", dir, e))?;
    state::write_json(path, value).map_err(|e| StateError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A task as the API serves it.
    fn api_task(id: Uuid, state: &str) -> Value {
        serde_json::json!({
            "id": id, "description": "fetch milk", "state": state,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
            "expires_at": "2026-01-02T00:00:00Z", "open_issues": 0, "last_event_id": 0,
        })
    }

    #[test]
    fn a_created_task_is_a_record_the_cli_reads() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path()).unwrap();
        let id = Uuid::new_v4();
        let created = serde_json::json!({"task": api_task(id, "draft"), "agent_token": "mst_x"});
        dir.save_created("http://127.0.0.1:1", &created).unwrap();
        dir.acknowledge(id, 7).unwrap();
        dir.acknowledge(id, 3).unwrap();
        let cli = state::StateDir::resolve(Some(root.path().to_owned())).unwrap();
        let record = cli.task(id).unwrap();
        assert_eq!(record.agent_token.as_deref(), Some("mst_x"));
        assert_eq!(record.cursor, 7, "the cursor never moves back");
        assert_eq!(record.server, "http://127.0.0.1:1");
        let ours = dir.load(id).unwrap().unwrap();
        assert_eq!(ours.last_known_state, TaskState::Draft);
        assert_eq!(dir.list().unwrap(), vec![ours.clone()]);
        assert!(!format!("{ours:?}").contains("mst_x"));
    }

    fn old_record(token: &str) -> TaskRecord {
        TaskRecord {
            task_id: Uuid::new_v4(),
            agent_token: Some(token.into()),
            cursor: 4,
            last_known_state: TaskState::Open,
            description: "fetch milk".into(),
        }
    }

    #[test]
    fn records_of_the_old_layout_are_read_and_moved() {
        let root = tempfile::tempdir().unwrap();
        let id = Uuid::new_v4();
        let old = TaskRecord {
            task_id: id,
            agent_token: Some("mst_old".into()),
            cursor: 4,
            last_known_state: TaskState::Open,
            description: "fetch milk".into(),
        };
        write_private(&root.path().join(format!("mcp/tasks/{id}.json")), &old).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode(&root.path().join(format!("mcp/tasks/{id}.json"))),
            0o600
        );
        let dir = StateDir::open(root.path()).unwrap();
        assert_eq!(dir.load(id).unwrap(), Some(old.clone()));
        assert_eq!(dir.list().unwrap(), vec![old]);
        dir.acknowledge(id, 6).unwrap();
        assert_eq!(dir.load(id).unwrap().unwrap().cursor, 6);
        // The API returns the task: the record moves to the shared layout,
        // token and cursor kept, where the CLI finds it.
        dir.note_task("http://127.0.0.1:1", &api_task(id, "open"))
            .unwrap();
        let cli = state::StateDir::resolve(Some(root.path().to_owned())).unwrap();
        let moved = cli.task(id).unwrap();
        assert_eq!(
            (moved.agent_token.as_deref(), moved.cursor),
            (Some("mst_old"), 6)
        );
        assert_eq!(dir.list().unwrap().len(), 1);
        // A record of the old layout written straight under `tasks/` (the
        // standalone binary with --state-dir) is moved aside and read, and
        // the CLI's listing is not broken by it.
        let other = old_record("mst_other");
        write_private(
            &root.path().join(format!("tasks/{}.json", other.task_id)),
            &other,
        )
        .unwrap();
        let dir = StateDir::open(root.path()).unwrap();
        assert_eq!(dir.load(other.task_id).unwrap(), Some(other.clone()));
        assert_eq!(dir.list().unwrap().len(), 2);
        assert_eq!(cli.tasks().unwrap().len(), 1);
    }
}
