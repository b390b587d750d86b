//! The one reading of a task row and an issue row, for both backends: each
//! implements [`RowColumns`] for its row types (PostgreSQL's typed columns,
//! SQLite's text ids and millisecond times), and [`task_from_row`] and
//! [`issue_from_row`] turn any of them into a [`Task`] or an [`Issue`]. A
//! new task column is read here once.

use chrono::{DateTime, Utc};
use meatspace_domain::{Issue, IssueKind, IssueStatus, Task, TaskState};
use uuid::Uuid;

use crate::{StoreError, StoredWork, stored_place};

/// A row, column by column, `None` for SQL NULL.
pub trait RowColumns {
    fn str(&self, column: &str) -> Result<Option<&str>, StoreError>;
    fn int(&self, column: &str) -> Result<Option<i64>, StoreError>;
    fn real(&self, column: &str) -> Result<Option<f64>, StoreError>;
    fn id(&self, column: &str) -> Result<Option<Uuid>, StoreError>;
    fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError>;
}

/// `value`, or a corrupt-row error naming the NULL `column`.
fn required<T>(value: Option<T>, column: &str) -> Result<T, StoreError> {
    value.ok_or_else(|| StoreError::Corrupt(format!("{column} is NULL")))
}

/// The task a row holds.
pub fn task_from_row(row: &impl RowColumns) -> Result<Task, StoreError> {
    let (location, presence) = stored_place(
        row.real("latitude")?,
        row.real("longitude")?,
        row.int("radius_m")?,
        row.str("address")?.map(str::to_owned),
        required(row.str("presence")?, "presence")?,
    )?;
    let text = |column| Ok::<_, StoreError>(row.str(column)?.map(str::to_owned));
    let work = StoredWork {
        result_schema: text("result_schema")?,
        review: text("review")?,
        result: text("result")?,
        requirements: text("requirements")?,
    }
    .decode()?;
    let state = required(row.str("state")?, "state")?;
    let open_issues = required(row.int("open_issues")?, "open_issues")?;
    let time = |column| required(row.time(column)?, column);
    Ok(Task {
        id: required(row.id("id")?, "id")?,
        description: required(row.str("description")?, "description")?.to_owned(),
        state: TaskState::parse(state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown state {state:?}")))?,
        worker_id: row.id("worker_id")?,
        created_at: time("created_at")?,
        updated_at: time("updated_at")?,
        published_at: row.time("published_at")?,
        assigned_at: row.time("assigned_at")?,
        started_at: row.time("started_at")?,
        ended_at: row.time("ended_at")?,
        expires_at: time("expires_at")?,
        start_by: row.time("start_by")?,
        active_until: row.time("active_until")?,
        open_issues: i32::try_from(open_issues)
            .map_err(|_| StoreError::Corrupt(format!("open_issues {open_issues}")))?,
        last_event_id: required(row.int("last_event_id")?, "last_event_id")?,
        location,
        presence,
        result_schema: work.result_schema,
        review: work.review,
        result: work.result,
        requirements: work.requirements,
    })
}

/// The issue a row of `issues` holds.
pub fn issue_from_row(row: &impl RowColumns) -> Result<Issue, StoreError> {
    let kind = required(row.str("kind")?, "kind")?;
    let status = required(row.str("status")?, "status")?;
    Ok(Issue {
        event_id: required(row.int("event_id")?, "event_id")?,
        task_id: required(row.id("task_id")?, "task_id")?,
        kind: IssueKind::parse(kind)
            .ok_or_else(|| StoreError::Corrupt(format!("issue kind {kind:?}")))?,
        status: IssueStatus::parse(status)
            .ok_or_else(|| StoreError::Corrupt(format!("issue status {status:?}")))?,
        resolution: row.str("resolution")?.map(str::to_owned),
        resolved_at: row.time("resolved_at")?,
    })
}
