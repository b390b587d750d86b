//! The local state directory of the stdio server: one file per task with
//! its agent token, durable cursor and last known state, so that tools take
//! only a task id and the token never enters the model's context.
//!
//! The directory is 0700 and every file 0600 (the token is a credential).
//! Writes are atomic: a new file is written beside the old one, synced,
//! renamed over it and the directory synced, so a crash leaves either the
//! old record or the new one, never a torn file or a lost cursor.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::types::TaskState;

/// What the local server keeps about one task.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub task_id: Uuid,
    pub agent_token: String,
    /// Events up to this id were returned and acknowledged.
    pub cursor: i64,
    pub last_known_state: TaskState,
    pub description: String,
}

impl std::fmt::Debug for TaskRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRecord")
            .field("task_id", &self.task_id)
            .field("agent_token", &"..")
            .field("cursor", &self.cursor)
            .field("last_known_state", &self.last_known_state)
            .finish()
    }
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    tasks: PathBuf,
}

impl StateDir {
    /// Opens (creating if needed) the directory at `root`, making it and
    /// its `tasks` directory private to the user. Parents it creates are
    /// 0700 too (`~/.local/state/meatspace` when only `~/.local` exists):
    /// created 0755 they would let other users list the state directory's
    /// name and times. Parents that already exist are left as they are.
    pub fn open(root: &Path) -> std::io::Result<Self> {
        let tasks = root.join("tasks");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&tasks)?;
        for dir in [root, tasks.as_path()] {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        }
        Ok(StateDir { tasks })
    }

    /// The default location: `$MEATSPACE_STATE_DIR`, else
    /// `$XDG_STATE_HOME/meatspace`, else `~/.local/state/meatspace`.
    ///
    /// It is the `mcp` subdirectory of the CLI's state directory: the CLI
    /// keeps its own records (another layout) under `tasks/` there.
    pub fn default_root() -> Option<PathBuf> {
        let base = if let Some(dir) = std::env::var_os("MEATSPACE_STATE_DIR") {
            PathBuf::from(dir)
        } else if let Some(dir) = std::env::var_os("XDG_STATE_HOME") {
            PathBuf::from(dir).join("meatspace")
        } else {
            PathBuf::from(std::env::var_os("HOME")?).join(".local/state/meatspace")
        };
        Some(base.join("mcp"))
    }

    fn path(&self, task_id: Uuid) -> PathBuf {
        self.tasks.join(format!("{task_id}.json"))
    }

    /// The record of `task_id`, if this directory has one.
    pub fn load(&self, task_id: Uuid) -> std::io::Result<Option<TaskRecord>> {
        match fs::read(self.path(task_id)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `record` atomically (see the module docs).
    pub fn save(&self, record: &TaskRecord) -> std::io::Result<()> {
        let path = self.path(record.task_id);
        let tmp = self.tasks.join(format!(
            ".{}.{}.tmp",
            record.task_id,
            Uuid::new_v4().simple()
        ));
        let bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
        let write = || -> std::io::Result<()> {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)?;
            fs::File::open(&self.tasks)?.sync_all()
        };
        write().inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
    }

    /// Every task record, ordered by task id.
    pub fn list(&self) -> std::io::Result<Vec<TaskRecord>> {
        let mut records = Vec::new();
        for entry in fs::read_dir(&self.tasks)? {
            let name = entry?.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| Uuid::try_parse(n).ok())
            else {
                continue;
            };
            if let Some(record) = self.load(id)? {
                records.push(record);
            }
        }
        records.sort_by_key(|r| r.task_id);
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_private_and_replaced_atomically() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&root.path().join("state")).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root.path().join("state")), 0o700);
        // Missing parents are created private too, whatever the umask.
        let nested = root.path().join("a/b/state");
        StateDir::open(&nested).unwrap();
        assert_eq!(mode(&root.path().join("a")), 0o700);
        assert_eq!(mode(&root.path().join("a/b")), 0o700);
        let mut record = TaskRecord {
            task_id: Uuid::new_v4(),
            agent_token: "mst_x".into(),
            cursor: 0,
            last_known_state: TaskState::Draft,
            description: "d".into(),
        };
        dir.save(&record).unwrap();
        record.cursor = 5;
        dir.save(&record).unwrap();
        assert_eq!(dir.load(record.task_id).unwrap(), Some(record.clone()));
        assert_eq!(mode(&dir.path(record.task_id)), 0o600);
        assert_eq!(dir.list().unwrap(), vec![record.clone()]);
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(&dir.tasks).unwrap().count(), 1);
        assert!(!format!("{record:?}").contains("mst_x"));
    }
}
