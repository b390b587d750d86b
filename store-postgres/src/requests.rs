//! Tasks requested from Kubernetes, in PostgreSQL: the SQL only. Why a
//! request row exists is [`meatspace_store::requests`]'s.

use meatspace_store::StoreError;
use meatspace_store::requests::TaskRequest;
use sqlx::{PgPool, Row};
use uuid::Uuid;

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
    from_row(&row)
}

pub(crate) async fn get(
    pool: &PgPool,
    resource_uid: &str,
) -> Result<Option<TaskRequest>, StoreError> {
    let row = sqlx::query(
        "SELECT resource_uid, task_id, namespace, name, created_at FROM task_requests \
         WHERE resource_uid = $1",
    )
    .bind(resource_uid)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(from_row).transpose()
}

pub(crate) async fn requested_among(
    pool: &PgPool,
    task_ids: &[Uuid],
) -> Result<Vec<Uuid>, StoreError> {
    if task_ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(
        sqlx::query_scalar("SELECT task_id FROM task_requests WHERE task_id = ANY($1)")
            .bind(task_ids)
            .fetch_all(pool)
            .await?,
    )
}

fn from_row(row: &sqlx::postgres::PgRow) -> Result<TaskRequest, StoreError> {
    Ok(TaskRequest {
        resource_uid: row.try_get("resource_uid")?,
        task_id: row.try_get("task_id")?,
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
    })
}
