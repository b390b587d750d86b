//! Tasks requested from Kubernetes: the request row both backends store
//! (each holds only its SQL).
//!
//! An agent in a cluster asks for a task by applying a `MeatspaceTask`
//! resource; the controller creates the task. The `task_requests` table
//! records which resource (by UID) a task was made for. Its row is inserted
//! in the same transaction as the task, and the UID is the primary key, so
//! a resource gets exactly one task however many controllers race or
//! restart: the loser of a race (or a retry after a crash) finds the row
//! and the task of the winner. The row stays when retention removes the
//! task, so a resource never gets a second one.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The resource a task was requested by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRequest {
    /// `metadata.uid` of the resource: unique for the life of a cluster,
    /// unlike its name, which a new resource may take after a delete.
    pub resource_uid: String,
    pub task_id: Uuid,
    /// Where the resource is, for people reading the table.
    pub namespace: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}
