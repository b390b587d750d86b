//! Tasks requested from Kubernetes, in SQLite: the row as the engine's
//! claim reads it on the writer's connection (the reads are shared,
//! `store/sql/reads.rs`). Why a request row exists is
//! [`meatspace_store::requests`]'s.

use meatspace_store::StoreError;
use meatspace_store::requests::TaskRequest;

pub(crate) fn from_row(row: &impl crate::RowReader) -> Result<TaskRequest, StoreError> {
    Ok(TaskRequest {
        resource_uid: row.text("resource_uid")?.to_owned(),
        task_id: crate::uuid(row.text("task_id")?)?,
        namespace: row.text("namespace")?.to_owned(),
        name: row.text("name")?.to_owned(),
        created_at: row.time("created_at")?,
    })
}
