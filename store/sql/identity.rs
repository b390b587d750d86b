//! SQL of identity and access: principals, API keys, worker suspension
//! and token rotation, invites, and the audit trail.
//!
//! One source for both backends: each compiles this file as its own
//! `identity` module (`#[path]` in its `lib.rs`), on top of its `dialect`
//! module, which says how a value is bound and read back (PostgreSQL
//! stores ids as `uuid` and times as `timestamptz`, SQLite as text and
//! milliseconds) and does the few things only one database does. The
//! statements use `$n` parameters, which both accept.
//!
//! Each privileged write runs in one transaction with the audit row that
//! records it, and a write that takes a credential's power away announces
//! it ([`d::announce_credential`]) so that every process drops what it
//! kept of it once the write commits.

use chrono::{DateTime, Utc};
use meatspace_domain::identity::{AuditAction, PrincipalKind, PrincipalRef, Scopes};
use meatspace_domain::qualification::{Qualification, QualificationValue};
use meatspace_domain::{Task, TaskState};
use meatspace_store::identity::{INSERT_AUDIT_SQL, unknown_principal};
use meatspace_store::token::TokenHash;
use meatspace_store::{
    ApiKey, AuditEntry, AuditFilter, IdentityStore, Invite, KeyRecord, NewApiKey, NewAudit,
    OpenTasksCursor, Session, StoreError, Worker,
};
use sqlx::Row as _;
use uuid::Uuid;

use crate::dialect::{self as d, Conn, Pool, Row, Tx};

const KEY_COLUMNS: &str = "k.id, k.name, k.scopes, k.digest, k.previous_digest, \
    k.previous_valid_until, k.expires_at, k.created_at, k.rotated_at, k.last_used_at, \
    k.revoked_at, p.id AS principal_id, p.kind AS principal_kind, p.name AS principal_name";

pub(crate) const WORKER_COLUMNS: &str = "id, name, created_at, suspended_at";

const INVITE_COLUMNS: &str =
    "id, code_hash, created_at, expires_at, used_at, revoked_at, created_by";

/// Appends `audit` in the caller's transaction.
pub(crate) async fn insert_audit(conn: &mut Conn, audit: &NewAudit) -> Result<(), StoreError> {
    sqlx::query(INSERT_AUDIT_SQL)
        .bind(d::time(audit.at))
        .bind(d::id(audit.principal_id))
        .bind(audit.action.as_str())
        .bind(&audit.target)
        .bind(&audit.address)
        .bind(d::json(audit.detail.as_ref()))
        .execute(conn)
        .await?;
    Ok(())
}

fn kind(kind: &str) -> Result<PrincipalKind, StoreError> {
    PrincipalKind::parse(kind)
        .ok_or_else(|| StoreError::Corrupt(format!("principal kind {kind:?}")))
}

fn digest(bytes: Option<Vec<u8>>) -> Result<Option<TokenHash>, StoreError> {
    bytes
        .map(|b| TokenHash::from_slice(&b).ok_or_else(|| StoreError::Corrupt("key digest".into())))
        .transpose()
}

fn key_from_row(row: &Row) -> Result<KeyRecord, StoreError> {
    let scopes: &str = row.try_get("scopes")?;
    let key = ApiKey {
        id: d::read_id(row, "id")?,
        name: row.try_get("name")?,
        principal: PrincipalRef {
            id: d::read_id(row, "principal_id")?,
            kind: kind(row.try_get("principal_kind")?)?,
            name: row.try_get("principal_name")?,
        },
        scopes: Scopes::from_text(scopes)
            .ok_or_else(|| StoreError::Corrupt(format!("scopes {scopes:?}")))?,
        created_at: d::read_time(row, "created_at")?,
        expires_at: d::read_opt_time(row, "expires_at")?,
        last_used_at: d::read_opt_time(row, "last_used_at")?,
        revoked_at: d::read_opt_time(row, "revoked_at")?,
        rotated_at: d::read_opt_time(row, "rotated_at")?,
        previous_valid_until: d::read_opt_time(row, "previous_valid_until")?,
    };
    Ok(KeyRecord {
        key,
        digest: digest(Some(row.try_get("digest")?))?
            .ok_or_else(|| StoreError::Corrupt("key digest".into()))?,
        previous_digest: digest(row.try_get("previous_digest")?)?,
    })
}

pub(crate) fn worker_from_row(row: &Row) -> Result<Worker, StoreError> {
    Ok(Worker {
        id: d::read_id(row, "id")?,
        name: row.try_get("name")?,
        created_at: d::read_time(row, "created_at")?,
        suspended_at: d::read_opt_time(row, "suspended_at")?,
    })
}

pub(crate) fn invite_from_row(row: &Row) -> Result<Invite, StoreError> {
    let hash: Vec<u8> = row.try_get("code_hash")?;
    Ok(Invite {
        id: d::read_id(row, "id")?,
        code_hash: TokenHash::from_slice(&hash)
            .ok_or_else(|| StoreError::Corrupt("invite code digest".into()))?,
        created_at: d::read_time(row, "created_at")?,
        expires_at: d::read_time(row, "expires_at")?,
        used_at: d::read_opt_time(row, "used_at")?,
        revoked_at: d::read_opt_time(row, "revoked_at")?,
        created_by: d::read_id(row, "created_by")?,
    })
}

async fn insert_key(tx: &mut Conn, new: &NewApiKey) -> Result<(), StoreError> {
    // A configured key's principal is derived from its name, so a replica
    // given the same key may have made it already (fresh ids never meet).
    if new.new_principal {
        sqlx::query(
            "INSERT INTO principals (id, kind, name, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(d::id(new.principal.id))
        .bind(new.principal.kind.as_str())
        .bind(&new.principal.name)
        .bind(d::time(new.created_at))
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "INSERT INTO api_keys (id, principal_id, name, scopes, digest, expires_at, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(d::id(new.id))
    .bind(d::id(new.principal.id))
    .bind(&new.name)
    .bind(new.scopes.to_text())
    .bind(&new.digest.0[..])
    .bind(d::opt_time(new.expires_at))
    .bind(d::time(new.created_at))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

pub(crate) async fn create_key(
    mut tx: Tx,
    new: NewApiKey,
    audit: NewAudit,
) -> Result<ApiKey, StoreError> {
    insert_key(&mut tx, &new).await?;
    insert_audit(&mut tx, &audit).await?;
    tx.commit().await?;
    Ok(new.to_key())
}

pub(crate) async fn insert_configured_key(mut tx: Tx, new: NewApiKey) -> Result<bool, StoreError> {
    d::serialize_configured_keys(&mut tx).await?;
    let exists = sqlx::query("SELECT 1 FROM api_keys WHERE id = $1")
        .bind(d::id(new.id))
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_some() {
        tx.rollback().await?;
        return Ok(false);
    }
    insert_key(&mut tx, &new).await?;
    tx.commit().await?;
    Ok(true)
}

async fn key_in(conn: &mut Conn, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys k JOIN principals p ON p.id = k.principal_id \
         WHERE k.id = $1"
    ))
    .bind(d::id(id))
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(key_from_row).transpose()
}

pub(crate) async fn key(pool: &Pool, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
    key_in(&mut *pool.acquire().await?, id).await
}

pub(crate) async fn keys(
    pool: &Pool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<ApiKey>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys k JOIN principals p ON p.id = k.principal_id \
         WHERE k.id > $1 ORDER BY k.id LIMIT $2"
    ))
    .bind(d::id(after.unwrap_or_default()))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| key_from_row(r).map(|k| k.key))
        .collect()
}

pub(crate) async fn rotate_key(
    mut tx: Tx,
    id: Uuid,
    new_digest: TokenHash,
    previous_valid_until: DateTime<Utc>,
    audit: NewAudit,
) -> Result<Option<ApiKey>, StoreError> {
    let rotated = sqlx::query(
        "UPDATE api_keys SET previous_digest = digest, previous_valid_until = $1, digest = $2, \
         rotated_at = $3 WHERE id = $4 AND revoked_at IS NULL",
    )
    .bind(d::time(previous_valid_until))
    .bind(&new_digest.0[..])
    .bind(d::time(audit.at))
    .bind(d::id(id))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if rotated == 1 {
        insert_audit(&mut tx, &audit).await?;
        d::announce_credential(&mut tx, id).await?;
    }
    let key = key_in(&mut tx, id).await?;
    tx.commit().await?;
    Ok(key.map(|k| k.key))
}

pub(crate) async fn revoke_key(
    mut tx: Tx,
    id: Uuid,
    audit: NewAudit,
) -> Result<Option<ApiKey>, StoreError> {
    let revoked =
        sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(d::time(audit.at))
            .bind(d::id(id))
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if revoked == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    // Announced even when it was revoked already: a process that missed
    // the first announcement (or cached in between) drops it now.
    d::announce_credential(&mut tx, id).await?;
    let key = key_in(&mut tx, id).await?;
    tx.commit().await?;
    Ok(key.map(|k| k.key))
}

pub(crate) async fn ensure_principal(
    mut tx: Tx,
    p: &PrincipalRef,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO principals (id, kind, name, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(d::id(p.id))
    .bind(p.kind.as_str())
    .bind(&p.name)
    .bind(d::time(now))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn principal(pool: &Pool, id: Uuid) -> Result<Option<PrincipalRef>, StoreError> {
    let row = sqlx::query("SELECT id, kind, name FROM principals WHERE id = $1")
        .bind(d::id(id))
        .fetch_optional(pool)
        .await?;
    row.map(|r| {
        Ok(PrincipalRef {
            id: d::read_id(&r, "id")?,
            kind: kind(r.try_get("kind")?)?,
            name: r.try_get("name")?,
        })
    })
    .transpose()
}

pub(crate) async fn task_owner(pool: &Pool, task_id: Uuid) -> Result<Option<Uuid>, StoreError> {
    let row = sqlx::query("SELECT owner_id FROM tasks WHERE id = $1")
        .bind(d::id(task_id))
        .fetch_optional(pool)
        .await?;
    row.map(|r| d::read_id(&r, "owner_id")).transpose()
}

/// `owner`'s tasks (in `state`, when given) newest first, after `cursor`.
pub(crate) async fn owned_tasks(
    pool: &Pool,
    owner: Uuid,
    state: Option<TaskState>,
    cursor: Option<OpenTasksCursor>,
    limit: u32,
) -> Result<Vec<Task>, StoreError> {
    let (created_at, id) = match cursor {
        Some(c) => (d::time(c.created_at), d::id(c.id)),
        None => d::past_every_task(),
    };
    let rows = sqlx::query(&format!(
        "SELECT {} FROM tasks WHERE owner_id = $1 AND ($2 IS NULL OR state = $2) \
         AND (created_at, id) < ($3, $4) ORDER BY created_at DESC, id DESC LIMIT $5",
        crate::TASK_COLUMNS
    ))
    .bind(d::id(owner))
    .bind(state.map(TaskState::as_str))
    .bind(created_at)
    .bind(id)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(crate::task_from_row).collect()
}

pub(crate) async fn worker(pool: &Pool, id: Uuid) -> Result<Option<Worker>, StoreError> {
    worker_in(&mut *pool.acquire().await?, id).await
}

pub(crate) async fn workers(
    pool: &Pool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Worker>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id > $1 ORDER BY id LIMIT $2"
    ))
    .bind(d::id(after.unwrap_or_default()))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(worker_from_row).collect()
}

pub(crate) async fn worker_in(conn: &mut Conn, id: Uuid) -> Result<Option<Worker>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id = $1"
    ))
    .bind(d::id(id))
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(worker_from_row).transpose()
}

pub(crate) async fn grant_qualification(
    mut tx: Tx,
    worker: Uuid,
    q: &Qualification,
    audit: NewAudit,
) -> Result<bool, StoreError> {
    if worker_in(&mut tx, worker).await?.is_none() {
        return Ok(false);
    }
    let (text, int) = match &q.value {
        Some(QualificationValue::Text(t)) => (Some(t.as_str()), None),
        Some(QualificationValue::Integer(n)) => (None, Some(*n)),
        None => (None, None),
    };
    sqlx::query(
        "INSERT INTO worker_qualifications \
           (worker_id, name, value_text, value_int, granted_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (worker_id, name) DO UPDATE SET value_text = excluded.value_text, \
           value_int = excluded.value_int, granted_at = excluded.granted_at, \
           expires_at = excluded.expires_at",
    )
    .bind(d::id(worker))
    .bind(&q.name)
    .bind(text)
    .bind(int)
    .bind(d::time(q.granted_at))
    .bind(d::opt_time(q.expires_at))
    .execute(&mut *tx)
    .await?;
    insert_audit(&mut tx, &audit).await?;
    tx.commit().await?;
    Ok(true)
}

/// Runs `delete` and, when it deleted a row, appends `audit` with it.
async fn delete_audited(
    mut tx: Tx,
    delete: d::Query<'_>,
    audit: NewAudit,
) -> Result<bool, StoreError> {
    let deleted = delete.execute(&mut *tx).await?.rows_affected();
    if deleted == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    tx.commit().await?;
    Ok(deleted == 1)
}

async fn qualifications(pool: &Pool, worker: Uuid) -> Result<Vec<Qualification>, StoreError> {
    let rows = sqlx::query(
        "SELECT name, value_text, value_int, granted_at, expires_at \
         FROM worker_qualifications WHERE worker_id = $1 ORDER BY name",
    )
    .bind(d::id(worker))
    .fetch_all(pool)
    .await?;
    rows.iter().map(qualification_from_row).collect()
}

/// A `worker_qualifications` row.
pub(crate) fn qualification_from_row(row: &Row) -> Result<Qualification, StoreError> {
    let text: Option<String> = row.try_get("value_text")?;
    let int: Option<i64> = row.try_get("value_int")?;
    Ok(Qualification {
        name: row.try_get("name")?,
        value: text
            .map(QualificationValue::Text)
            .or(int.map(QualificationValue::Integer)),
        granted_at: d::read_time(row, "granted_at")?,
        expires_at: d::read_opt_time(row, "expires_at")?,
    })
}

async fn block_worker(
    mut tx: Tx,
    principal: Uuid,
    worker: Uuid,
    audit: NewAudit,
) -> Result<bool, StoreError> {
    if worker_in(&mut tx, worker).await?.is_none() {
        return Ok(false);
    }
    let added = sqlx::query(
        "INSERT INTO worker_blocks (principal_id, worker_id, created_at) VALUES ($1, $2, $3) \
         ON CONFLICT (principal_id, worker_id) DO NOTHING",
    )
    .bind(d::id(principal))
    .bind(d::id(worker))
    .bind(d::time(audit.at))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if added == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    tx.commit().await?;
    Ok(true)
}

async fn blocked_workers(
    pool: &Pool,
    principal: Uuid,
) -> Result<Vec<(Uuid, DateTime<Utc>)>, StoreError> {
    let rows = sqlx::query(
        "SELECT worker_id, created_at FROM worker_blocks WHERE principal_id = $1 \
         ORDER BY worker_id",
    )
    .bind(d::id(principal))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok((
                d::read_id(row, "worker_id")?,
                d::read_time(row, "created_at")?,
            ))
        })
        .collect()
}

async fn blocked_by(pool: &Pool, worker: Uuid) -> Result<Vec<Uuid>, StoreError> {
    let rows = sqlx::query("SELECT principal_id FROM worker_blocks WHERE worker_id = $1")
        .bind(d::id(worker))
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| d::read_id(row, "principal_id"))
        .collect()
}

pub(crate) async fn reinstate_worker(
    mut tx: Tx,
    id: Uuid,
    audit: NewAudit,
) -> Result<Option<Worker>, StoreError> {
    let lifted = sqlx::query(
        "UPDATE workers SET suspended_at = NULL WHERE id = $1 AND suspended_at IS NOT NULL",
    )
    .bind(d::id(id))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if lifted == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    let worker = worker_in(&mut tx, id).await?;
    tx.commit().await?;
    Ok(worker)
}

pub(crate) async fn rotate_worker_token(
    mut tx: Tx,
    id: Uuid,
    token_hash: TokenHash,
    audit: NewAudit,
) -> Result<Option<Worker>, StoreError> {
    let rotated = sqlx::query("UPDATE workers SET token_hash = $1 WHERE id = $2")
        .bind(&token_hash.0[..])
        .bind(d::id(id))
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if rotated == 0 {
        tx.rollback().await?;
        return Ok(None);
    }
    insert_audit(&mut tx, &audit).await?;
    d::announce_credential(&mut tx, id).await?;
    let worker = worker_in(&mut tx, id).await?;
    tx.commit().await?;
    Ok(worker)
}

pub(crate) async fn create_invite(
    mut tx: Tx,
    id: Uuid,
    code_hash: TokenHash,
    expires_at: DateTime<Utc>,
    audit: NewAudit,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO worker_invites (id, code_hash, created_at, expires_at, created_by) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(d::id(id))
    .bind(&code_hash.0[..])
    .bind(d::time(audit.at))
    .bind(d::time(expires_at))
    .bind(d::id(audit.principal_id))
    .execute(&mut *tx)
    .await?;
    insert_audit(&mut tx, &audit).await?;
    tx.commit().await?;
    Ok(())
}

async fn invite_in(conn: &mut Conn, id: Uuid) -> Result<Option<Invite>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id = $1"
    ))
    .bind(d::id(id))
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(invite_from_row).transpose()
}

pub(crate) async fn invite(pool: &Pool, id: Uuid) -> Result<Option<Invite>, StoreError> {
    invite_in(&mut *pool.acquire().await?, id).await
}

pub(crate) async fn invites(
    pool: &Pool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Invite>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id > $1 ORDER BY id LIMIT $2"
    ))
    .bind(d::id(after.unwrap_or_default()))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(invite_from_row).collect()
}

pub(crate) async fn revoke_invite(
    mut tx: Tx,
    id: Uuid,
    audit: NewAudit,
) -> Result<Option<Invite>, StoreError> {
    let revoked = sqlx::query(
        "UPDATE worker_invites SET revoked_at = $1 \
         WHERE id = $2 AND revoked_at IS NULL AND used_at IS NULL",
    )
    .bind(d::time(audit.at))
    .bind(d::id(id))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if revoked == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    let invite = invite_in(&mut tx, id).await?;
    tx.commit().await?;
    Ok(invite)
}

pub(crate) async fn append_audit(mut tx: Tx, audit: &NewAudit) -> Result<(), StoreError> {
    insert_audit(&mut tx, audit).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn audit(pool: &Pool, f: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
    let rows = sqlx::query(
        "SELECT a.id, a.at, a.principal_id, a.action, a.target, a.address, a.detail, \
         p.kind AS principal_kind, p.name AS principal_name \
         FROM audit a LEFT JOIN principals p ON p.id = a.principal_id \
         WHERE ($1 IS NULL OR a.principal_id = $1) AND ($2 IS NULL OR a.at >= $2) \
         AND ($3 IS NULL OR a.at < $3) AND ($4 IS NULL OR a.id < $4) \
         AND ($6 IS NULL OR a.action = $6) AND ($7 IS NULL OR a.target = $7) \
         ORDER BY a.id DESC LIMIT $5",
    )
    .bind(f.principal.map(d::id))
    .bind(d::opt_time(f.since))
    .bind(d::opt_time(f.until))
    .bind(f.before)
    .bind(i64::from(f.limit))
    .bind(f.action.map(|a| a.as_str()))
    .bind(f.target.as_deref())
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let id = d::read_id(r, "principal_id")?;
            let principal = match r.try_get::<Option<&str>, _>("principal_kind")? {
                Some(k) => PrincipalRef {
                    id,
                    kind: kind(k)?,
                    name: r.try_get("principal_name")?,
                },
                None => unknown_principal(id),
            };
            let action: &str = r.try_get("action")?;
            Ok(AuditEntry {
                id: r.try_get("id")?,
                at: d::read_time(r, "at")?,
                principal,
                action: AuditAction::parse(action)
                    .ok_or_else(|| StoreError::Corrupt(format!("audit action {action:?}")))?,
                target: r.try_get("target")?,
                address: r.try_get("address")?,
                detail: d::read_json(r, "detail")?,
            })
        })
        .collect()
}

pub(crate) async fn purge_audit(
    mut tx: Tx,
    before: DateTime<Utc>,
    limit: u32,
) -> Result<u64, StoreError> {
    let deleted = sqlx::query(
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < $1 ORDER BY id LIMIT $2)",
    )
    .bind(d::time(before))
    .bind(i64::from(limit))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(deleted)
}

// ---- the store's interface ------------------------------------------------------------

#[async_trait::async_trait]
impl IdentityStore for d::Store {
    #[tracing::instrument(level = "debug", skip(self, secret_hash), err)]
    async fn create_session(
        &self,
        id: Uuid,
        worker_id: Uuid,
        secret_hash: TokenHash,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = d::begin_statement(self).await?;
        sqlx::query(
            "INSERT INTO worker_sessions (id, worker_id, secret_hash, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(d::id(id))
        .bind(d::id(worker_id))
        .bind(&secret_hash.0[..])
        .bind(d::time(now))
        .bind(d::time(expires_at))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn session(&self, id: Uuid, now: DateTime<Utc>) -> Result<Option<Session>, StoreError> {
        let row = sqlx::query(
            "SELECT s.id, s.secret_hash, s.expires_at, w.id AS worker_id, w.name, w.created_at \
             FROM worker_sessions s JOIN workers w ON w.id = s.worker_id \
             WHERE s.id = $1 AND s.expires_at > $2 AND w.suspended_at IS NULL",
        )
        .bind(d::id(id))
        .bind(d::time(now))
        .fetch_optional(d::reader(self))
        .await?;
        row.map(|row| {
            let hash: Vec<u8> = row.try_get("secret_hash")?;
            Ok(Session {
                id: d::read_id(&row, "id")?,
                worker: Worker {
                    id: d::read_id(&row, "worker_id")?,
                    name: row.try_get("name")?,
                    created_at: d::read_time(&row, "created_at")?,
                    suspended_at: None,
                },
                secret_hash: TokenHash::from_slice(&hash)
                    .ok_or_else(|| StoreError::Corrupt("session secret digest".into()))?,
                expires_at: d::read_time(&row, "expires_at")?,
            })
        })
        .transpose()
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn delete_session(&self, id: Uuid) -> Result<bool, StoreError> {
        let mut tx = d::begin_statement(self).await?;
        let deleted = sqlx::query("DELETE FROM worker_sessions WHERE id = $1")
            .bind(d::id(id))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(deleted > 0)
    }

    #[tracing::instrument(level = "debug", skip(self, code_hash, audit), err)]
    async fn create_invite(
        &self,
        id: Uuid,
        code_hash: TokenHash,
        expires_at: DateTime<Utc>,
        audit: NewAudit,
    ) -> Result<(), StoreError> {
        create_invite(d::begin(self).await?, id, code_hash, expires_at, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn invite(&self, id: Uuid) -> Result<Option<Invite>, StoreError> {
        invite(d::reader(self), id).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(key_id = %new.id), err)]
    async fn create_api_key(&self, new: NewApiKey, audit: NewAudit) -> Result<ApiKey, StoreError> {
        create_key(d::begin(self).await?, new, audit).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(key_id = %new.id), err)]
    async fn insert_configured_key(&self, new: NewApiKey) -> Result<bool, StoreError> {
        insert_configured_key(d::begin(self).await?, new).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn api_key(&self, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
        key(d::reader(self), id).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn api_keys(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<ApiKey>, StoreError> {
        keys(d::reader(self), after, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self, digest, audit), err)]
    async fn rotate_api_key(
        &self,
        id: Uuid,
        digest: TokenHash,
        previous_valid_until: DateTime<Utc>,
        audit: NewAudit,
    ) -> Result<Option<ApiKey>, StoreError> {
        rotate_key(
            d::begin(self).await?,
            id,
            digest,
            previous_valid_until,
            audit,
        )
        .await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn revoke_api_key(
        &self,
        id: Uuid,
        audit: NewAudit,
    ) -> Result<Option<ApiKey>, StoreError> {
        revoke_key(d::begin(self).await?, id, audit).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(keys = used.len()), err)]
    async fn touch_api_keys(&self, used: &[(Uuid, DateTime<Utc>)]) -> Result<(), StoreError> {
        d::touch_keys(self, used).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn ensure_principal(
        &self,
        principal: &PrincipalRef,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        ensure_principal(d::begin_statement(self).await?, principal, now).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn principal(&self, id: Uuid) -> Result<Option<PrincipalRef>, StoreError> {
        principal(d::reader(self), id).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn task_owner(&self, task_id: Uuid) -> Result<Option<Uuid>, StoreError> {
        task_owner(d::reader(self), task_id).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn owned_tasks(
        &self,
        owner: Uuid,
        state: Option<TaskState>,
        cursor: Option<OpenTasksCursor>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError> {
        owned_tasks(d::reader(self), owner, state, cursor, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn worker(&self, id: Uuid) -> Result<Option<Worker>, StoreError> {
        worker(d::reader(self), id).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn workers(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Worker>, StoreError> {
        workers(d::reader(self), after, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn grant_qualification(
        &self,
        worker: Uuid,
        qualification: &Qualification,
        audit: NewAudit,
    ) -> Result<bool, StoreError> {
        grant_qualification(d::begin(self).await?, worker, qualification, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn revoke_qualification(
        &self,
        worker: Uuid,
        name: &str,
        audit: NewAudit,
    ) -> Result<bool, StoreError> {
        let delete =
            sqlx::query("DELETE FROM worker_qualifications WHERE worker_id = $1 AND name = $2")
                .bind(d::id(worker))
                .bind(name);
        delete_audited(d::begin(self).await?, delete, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn qualifications(&self, worker: Uuid) -> Result<Vec<Qualification>, StoreError> {
        qualifications(d::reader(self), worker).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn block_worker(
        &self,
        principal: Uuid,
        worker: Uuid,
        audit: NewAudit,
    ) -> Result<bool, StoreError> {
        block_worker(d::begin(self).await?, principal, worker, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn unblock_worker(
        &self,
        principal: Uuid,
        worker: Uuid,
        audit: NewAudit,
    ) -> Result<bool, StoreError> {
        let delete =
            sqlx::query("DELETE FROM worker_blocks WHERE principal_id = $1 AND worker_id = $2")
                .bind(d::id(principal))
                .bind(d::id(worker));
        delete_audited(d::begin(self).await?, delete, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn blocked_workers(
        &self,
        principal: Uuid,
    ) -> Result<Vec<(Uuid, DateTime<Utc>)>, StoreError> {
        blocked_workers(d::reader(self), principal).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn blocked_by(&self, worker: Uuid) -> Result<Vec<Uuid>, StoreError> {
        blocked_by(d::reader(self), worker).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn reinstate_worker(
        &self,
        id: Uuid,
        audit: NewAudit,
    ) -> Result<Option<Worker>, StoreError> {
        reinstate_worker(d::begin(self).await?, id, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self, token_hash, audit), err)]
    async fn rotate_worker_token(
        &self,
        id: Uuid,
        token_hash: TokenHash,
        audit: NewAudit,
    ) -> Result<Option<Worker>, StoreError> {
        rotate_worker_token(d::begin(self).await?, id, token_hash, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn invites(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Invite>, StoreError> {
        invites(d::reader(self), after, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn revoke_invite(&self, id: Uuid, audit: NewAudit) -> Result<Option<Invite>, StoreError> {
        revoke_invite(d::begin(self).await?, id, audit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn append_audit(&self, audit: NewAudit) -> Result<(), StoreError> {
        append_audit(d::begin_statement(self).await?, &audit).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        audit(d::reader(self), filter).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn purge_audit_before(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        purge_audit(d::begin_statement(self).await?, before, limit).await
    }
}
