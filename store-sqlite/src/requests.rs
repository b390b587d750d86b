//! Tasks requested from Kubernetes, in SQLite: the SQL and its codecs only.
//! Why a request row exists is [`meatspace_store::requests`]'s.

use chrono::DateTime;
use meatspace_store::StoreError;
use meatspace_store::requests::TaskRequest;
use sqlx::{Row, SqlitePool};
use uuid::Uuid;

/// As on PostgreSQL; the caller's `BEGIN IMMEDIATE` serializes writers.
pub(crate) async fn claim(
    tx: &mut crate::WriteTx,
    request: &TaskRequest,
) -> Result<TaskRequest, StoreError> {
    sqlx::query(
        "INSERT INTO task_requests (resource_uid, task_id, namespace, name, created_at) \
         VALUES (?, ?, ?, ?, ?) ON CONFLICT (resource_uid) DO NOTHING",
    )
    .bind(&request.resource_uid)
    .bind(request.task_id.to_string())
    .bind(&request.namespace)
    .bind(&request.name)
    .bind(request.created_at.timestamp_millis())
    .execute(&mut **tx)
    .await?;
    let row = sqlx::query(
        "SELECT resource_uid, task_id, namespace, name, created_at FROM task_requests \
         WHERE resource_uid = ?",
    )
    .bind(&request.resource_uid)
    .fetch_one(&mut **tx)
    .await?;
    from_row(&row)
}

pub(crate) async fn get(
    pool: &SqlitePool,
    resource_uid: &str,
) -> Result<Option<TaskRequest>, StoreError> {
    let row = sqlx::query(
        "SELECT resource_uid, task_id, namespace, name, created_at FROM task_requests \
         WHERE resource_uid = ?",
    )
    .bind(resource_uid)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(from_row).transpose()
}

pub(crate) async fn requested_among(
    pool: &SqlitePool,
    task_ids: &[Uuid],
) -> Result<Vec<Uuid>, StoreError> {
    let mut found = Vec::new();
    // Well under SQLite's limit of bound parameters per statement.
    for chunk in task_ids.chunks(500) {
        let placeholders = vec!["?"; chunk.len()].join(", ");
        let sql = format!("SELECT task_id FROM task_requests WHERE task_id IN ({placeholders})");
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for id in chunk {
            q = q.bind(id.to_string());
        }
        for id in q.fetch_all(pool).await? {
            found.push(parse_uuid(&id)?);
        }
    }
    Ok(found)
}

fn from_row(row: &sqlx::sqlite::SqliteRow) -> Result<TaskRequest, StoreError> {
    let created_at: i64 = row.try_get("created_at")?;
    Ok(TaskRequest {
        resource_uid: row.try_get("resource_uid")?,
        task_id: parse_uuid(row.try_get("task_id")?)?,
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        created_at: DateTime::from_timestamp_millis(created_at)
            .ok_or_else(|| StoreError::Corrupt(format!("timestamp {created_at}")))?,
    })
}

fn parse_uuid(s: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(s).map_err(|_| StoreError::Corrupt(format!("uuid {s:?}")))
}
