//! Tasks requested from Kubernetes, for both backends.
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
use sqlx::{PgPool, Row, SqlitePool};
use uuid::Uuid;

use super::{NewTask, StoreError};

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

// ---- PostgreSQL ----

/// Inserts the request row unless the resource has one; returns the row
/// now in the table (the new one, or the one a racing writer committed).
pub(super) async fn pg_claim(
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
    pg_row(&row)
}

/// Inserts the draft task itself (as `create_task` does).
pub(super) async fn pg_insert_task(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    new: &NewTask,
    next_deadline: Option<DateTime<Utc>>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO tasks (id, description, state, agent_token_hash, created_at, updated_at, \
         expires_at, next_deadline) VALUES ($1, $2, 'draft', $3, $4, $4, $5, $6)",
    )
    .bind(new.id)
    .bind(&new.description)
    .bind(&new.agent_token_hash.0[..])
    .bind(new.created_at)
    .bind(new.expires_at)
    .bind(next_deadline)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn pg_get(
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
    row.as_ref().map(pg_row).transpose()
}

pub(super) async fn pg_requested_among(
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

fn pg_row(row: &sqlx::postgres::PgRow) -> Result<TaskRequest, StoreError> {
    Ok(TaskRequest {
        resource_uid: row.try_get("resource_uid")?,
        task_id: row.try_get("task_id")?,
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
    })
}

// ---- SQLite ----

/// As [`pg_claim`]; the caller's `BEGIN IMMEDIATE` serializes writers.
pub(super) async fn sqlite_claim(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
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
    sqlite_row(&row)
}

/// Inserts the draft task itself (as `create_task` does).
pub(super) async fn sqlite_insert_task(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    new: &NewTask,
    next_deadline: Option<DateTime<Utc>>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO tasks (id, description, state, agent_token_hash, created_at, updated_at, \
         expires_at, next_deadline) VALUES (?, ?, 'draft', ?, ?, ?, ?, ?)",
    )
    .bind(new.id.to_string())
    .bind(&new.description)
    .bind(&new.agent_token_hash.0[..])
    .bind(new.created_at.timestamp_millis())
    .bind(new.created_at.timestamp_millis())
    .bind(new.expires_at.timestamp_millis())
    .bind(next_deadline.map(|t| t.timestamp_millis()))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn sqlite_get(
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
    row.as_ref().map(sqlite_row).transpose()
}

pub(super) async fn sqlite_requested_among(
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

fn sqlite_row(row: &sqlx::sqlite::SqliteRow) -> Result<TaskRequest, StoreError> {
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
