//! Tasks requested from Kubernetes, in SQLite: the SQL and its codecs only.
//! Why a request row exists is [`meatspace_store::requests`]'s.

use meatspace_store::StoreError;
use meatspace_store::requests::TaskRequest;
use sqlx::SqlitePool;
use uuid::Uuid;

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

pub(crate) fn from_row(row: &impl crate::RowReader) -> Result<TaskRequest, StoreError> {
    Ok(TaskRequest {
        resource_uid: row.text("resource_uid")?.to_owned(),
        task_id: parse_uuid(row.text("task_id")?)?,
        namespace: row.text("namespace")?.to_owned(),
        name: row.text("name")?.to_owned(),
        created_at: row.time("created_at")?,
    })
}

fn parse_uuid(s: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(s).map_err(|_| StoreError::Corrupt(format!("uuid {s:?}")))
}
