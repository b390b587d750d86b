//! Tasks requested from Kubernetes, in PostgreSQL: the engine's claim of a
//! request row (its reads are shared, `store/sql/reads.rs`). Why a request
//! row exists is [`meatspace_store::requests`]'s.

use meatspace_store::StoreError;
use meatspace_store::requests::TaskRequest;

/// Inserts the request row unless the resource has one; returns the row
/// now in the table (the new one, or the one a racing writer committed).
pub(crate) async fn claim(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    request: &TaskRequest,
) -> Result<TaskRequest, StoreError> {
    // ON CONFLICT waits for a concurrent insert of the same UID to commit,
    // then does nothing: the SELECT below sees the winner's row.
    sqlx::query(
        "INSERT INTO task_requests (resource_uid, task_id, namespace, name, created_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (resource_uid) DO NOTHING",
    )
    .bind(&request.resource_uid)
    .bind(request.task_id)
    .bind(&request.namespace)
    .bind(&request.name)
    .bind(request.created_at)
    .execute(&mut **tx)
    .await?;
    let row = sqlx::query(
        "SELECT resource_uid, task_id, namespace, name, created_at FROM task_requests \
         WHERE resource_uid = $1",
    )
    .bind(&request.resource_uid)
    .fetch_one(&mut **tx)
    .await?;
    crate::reads::task_request_from_row(&row)
}
