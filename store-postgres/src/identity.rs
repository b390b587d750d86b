//! SQL of identity and access on PostgreSQL: principals, API keys, worker
//! suspension, invite listing and revocation, and the audit trail. Each
//! privileged write runs in one transaction with the audit row that
//! records it, and a write that takes a credential's power away sends
//! `credential:<id>` on the change channel in that transaction, so every
//! replica hears of it when it commits.

use chrono::{DateTime, Utc};
use meatspace_domain::TaskState;
use meatspace_domain::identity::{AuditAction, PrincipalKind, PrincipalRef, Scopes};
use meatspace_store::identity::unknown_principal;
use meatspace_store::token::TokenHash;
use meatspace_store::{
    ApiKey, AuditEntry, AuditFilter, Invite, KeyRecord, NewApiKey, NewAudit, OpenTasksCursor,
    StoreError, Worker,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use crate::CHANNEL;

type Tx = Transaction<'static, Postgres>;

/// The payload that announces a credential change (a task change is the
/// bare task id).
pub(crate) const CREDENTIAL_PREFIX: &str = "credential:";

const KEY_COLUMNS: &str = "k.id, k.name, k.scopes, k.digest, k.previous_digest, \
    k.previous_valid_until, k.expires_at, k.created_at, k.rotated_at, k.last_used_at, \
    k.revoked_at, p.id AS principal_id, p.kind AS principal_kind, p.name AS principal_name";

const WORKER_COLUMNS: &str = "id, name, created_at, suspended_at";

const INVITE_COLUMNS: &str =
    "id, code_hash, created_at, expires_at, used_at, revoked_at, created_by";

async fn announce_credential(conn: &mut PgConnection, id: Uuid) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(format!("{CREDENTIAL_PREFIX}{id}"))
        .execute(conn)
        .await?;
    Ok(())
}

pub(crate) async fn insert_audit(
    conn: &mut PgConnection,
    audit: &NewAudit,
) -> Result<(), StoreError> {
    sqlx::query(meatspace_store::identity::INSERT_AUDIT_SQL)
        .bind(audit.at)
        .bind(audit.principal_id)
        .bind(audit.action.as_str())
        .bind(&audit.target)
        .bind(&audit.address)
        .bind(&audit.detail)
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

fn key_from_row(row: &PgRow) -> Result<KeyRecord, StoreError> {
    let scopes: &str = row.try_get("scopes")?;
    let key = ApiKey {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        principal: PrincipalRef {
            id: row.try_get("principal_id")?,
            kind: kind(row.try_get("principal_kind")?)?,
            name: row.try_get("principal_name")?,
        },
        scopes: Scopes::from_text(scopes)
            .ok_or_else(|| StoreError::Corrupt(format!("scopes {scopes:?}")))?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        last_used_at: row.try_get("last_used_at")?,
        revoked_at: row.try_get("revoked_at")?,
        rotated_at: row.try_get("rotated_at")?,
        previous_valid_until: row.try_get("previous_valid_until")?,
    };
    Ok(KeyRecord {
        key,
        digest: digest(Some(row.try_get("digest")?))?
            .ok_or_else(|| StoreError::Corrupt("key digest".into()))?,
        previous_digest: digest(row.try_get("previous_digest")?)?,
    })
}

fn worker_from_row(row: &PgRow) -> Result<Worker, StoreError> {
    Ok(Worker {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
        suspended_at: row.try_get("suspended_at")?,
    })
}

fn invite_from_row(row: &PgRow) -> Result<Invite, StoreError> {
    let hash: Vec<u8> = row.try_get("code_hash")?;
    Ok(Invite {
        id: row.try_get("id")?,
        code_hash: TokenHash::from_slice(&hash)
            .ok_or_else(|| StoreError::Corrupt("invite code digest".into()))?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        used_at: row.try_get("used_at")?,
        revoked_at: row.try_get("revoked_at")?,
        created_by: row.try_get("created_by")?,
    })
}

async fn insert_key(tx: &mut PgConnection, new: &NewApiKey) -> Result<(), StoreError> {
    // A configured key's principal is derived from its name, so a replica
    // given the same key may have made it already (fresh ids never meet).
    if new.new_principal {
        sqlx::query(
            "INSERT INTO principals (id, kind, name, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(new.principal.id)
        .bind(new.principal.kind.as_str())
        .bind(&new.principal.name)
        .bind(new.created_at)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "INSERT INTO api_keys (id, principal_id, name, scopes, digest, expires_at, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(new.id)
    .bind(new.principal.id)
    .bind(&new.name)
    .bind(new.scopes.to_text())
    .bind(&new.digest.0[..])
    .bind(new.expires_at)
    .bind(new.created_at)
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
    // Replicas starting at once with the same configured key: the lock
    // makes the second see the first's row instead of failing on it.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('meatspace configured key'))")
        .execute(&mut *tx)
        .await?;
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM api_keys WHERE id = $1")
        .bind(new.id)
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

async fn key_in(conn: &mut PgConnection, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys k JOIN principals p ON p.id = k.principal_id \
         WHERE k.id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(key_from_row).transpose()
}

pub(crate) async fn key(pool: &PgPool, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
    key_in(&mut *pool.acquire().await?, id).await
}

pub(crate) async fn keys(
    pool: &PgPool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<ApiKey>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys k JOIN principals p ON p.id = k.principal_id \
         WHERE k.id > $1 ORDER BY k.id LIMIT $2"
    ))
    .bind(after.unwrap_or_default())
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
    .bind(previous_valid_until)
    .bind(&new_digest.0[..])
    .bind(audit.at)
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if rotated == 1 {
        insert_audit(&mut tx, &audit).await?;
        announce_credential(&mut tx, id).await?;
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
            .bind(audit.at)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if revoked == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    // Announced even when it was revoked already: a replica that missed
    // the first announcement (or cached in between) drops it now.
    announce_credential(&mut tx, id).await?;
    let key = key_in(&mut tx, id).await?;
    tx.commit().await?;
    Ok(key.map(|k| k.key))
}

pub(crate) async fn touch_keys(
    pool: &PgPool,
    used: &[(Uuid, DateTime<Utc>)],
) -> Result<(), StoreError> {
    let (ids, ats): (Vec<Uuid>, Vec<DateTime<Utc>>) = used.iter().copied().unzip();
    sqlx::query(
        "UPDATE api_keys k SET last_used_at = u.at \
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS u(id, at) \
         WHERE k.id = u.id AND (k.last_used_at IS NULL OR k.last_used_at < u.at)",
    )
    .bind(ids)
    .bind(ats)
    .execute(pool)
    .await?;
    Ok(())
}

pub(crate) async fn ensure_principal(
    pool: &PgPool,
    p: &PrincipalRef,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO principals (id, kind, name, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(p.id)
    .bind(p.kind.as_str())
    .bind(&p.name)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(())
}

pub(crate) async fn principal(pool: &PgPool, id: Uuid) -> Result<Option<PrincipalRef>, StoreError> {
    let row = sqlx::query("SELECT id, kind, name FROM principals WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await?;
    row.map(|r| {
        Ok(PrincipalRef {
            id: r.try_get("id")?,
            kind: kind(r.try_get("kind")?)?,
            name: r.try_get("name")?,
        })
    })
    .transpose()
}

pub(crate) async fn task_owner(pool: &PgPool, task_id: Uuid) -> Result<Option<Uuid>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT owner_id FROM tasks WHERE id = $1")
            .bind(task_id)
            .fetch_optional(pool)
            .await?,
    )
}

/// `owner`'s tasks newest first: binds owner ($1), state ($2, NULL for
/// any), the cursor ($3, $4) and the limit ($5).
pub(crate) fn owned_tasks_sql(columns: &str) -> String {
    format!(
        "SELECT {columns} FROM tasks WHERE owner_id = $1 AND ($2::text IS NULL OR state = $2) \
         AND (created_at, id) < ($3, $4) ORDER BY created_at DESC, id DESC LIMIT $5"
    )
}

pub(crate) fn cursor_binds(cursor: Option<OpenTasksCursor>) -> (DateTime<Utc>, Uuid) {
    match cursor {
        Some(c) => (c.created_at, c.id),
        // Past every task: the last second of year 9999, the largest id.
        None => (
            DateTime::from_timestamp(253_402_300_799, 0).unwrap_or_default(),
            Uuid::max(),
        ),
    }
}

pub(crate) fn state_name(state: Option<TaskState>) -> Option<&'static str> {
    state.map(TaskState::as_str)
}

pub(crate) async fn worker(pool: &PgPool, id: Uuid) -> Result<Option<Worker>, StoreError> {
    worker_in(&mut *pool.acquire().await?, id).await
}

pub(crate) async fn workers(
    pool: &PgPool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Worker>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id > $1 ORDER BY id LIMIT $2"
    ))
    .bind(after.unwrap_or_default())
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(worker_from_row).collect()
}

async fn worker_in(conn: &mut PgConnection, id: Uuid) -> Result<Option<Worker>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(worker_from_row).transpose()
}

/// Suspends the worker in the caller's transaction (see
/// `Backend::suspend_worker_rows`).
pub(crate) async fn suspend_worker(
    tx: &mut PgConnection,
    id: Uuid,
    audit: &NewAudit,
) -> Result<Option<(Worker, Vec<Uuid>)>, StoreError> {
    let suspended =
        sqlx::query("UPDATE workers SET suspended_at = $1 WHERE id = $2 AND suspended_at IS NULL")
            .bind(audit.at)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if suspended == 1 {
        insert_audit(&mut *tx, audit).await?;
    }
    sqlx::query("DELETE FROM worker_sessions WHERE worker_id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let Some(worker) = worker_in(&mut *tx, id).await? else {
        return Ok(None);
    };
    announce_credential(&mut *tx, id).await?;
    let held: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE worker_id = $1 AND state IN ('assigned', 'active')",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    Ok(Some((worker, held)))
}

pub(crate) async fn reinstate_worker(
    mut tx: Tx,
    id: Uuid,
    audit: NewAudit,
) -> Result<Option<Worker>, StoreError> {
    let lifted = sqlx::query(
        "UPDATE workers SET suspended_at = NULL WHERE id = $1 AND suspended_at IS NOT NULL",
    )
    .bind(id)
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
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if rotated == 0 {
        tx.rollback().await?;
        return Ok(None);
    }
    insert_audit(&mut tx, &audit).await?;
    announce_credential(&mut tx, id).await?;
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
    .bind(id)
    .bind(&code_hash.0[..])
    .bind(audit.at)
    .bind(expires_at)
    .bind(audit.principal_id)
    .execute(&mut *tx)
    .await?;
    insert_audit(&mut tx, &audit).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn invite(pool: &PgPool, id: Uuid) -> Result<Option<Invite>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(invite_from_row).transpose()
}

pub(crate) async fn invites(
    pool: &PgPool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Invite>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id > $1 ORDER BY id LIMIT $2"
    ))
    .bind(after.unwrap_or_default())
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
    .bind(audit.at)
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if revoked == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    let row = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    row.as_ref().map(invite_from_row).transpose()
}

pub(crate) async fn append_audit(pool: &PgPool, audit: &NewAudit) -> Result<(), StoreError> {
    insert_audit(&mut *pool.acquire().await?, audit).await
}

pub(crate) async fn audit(pool: &PgPool, f: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
    let rows = sqlx::query(
        "SELECT a.id, a.at, a.principal_id, a.action, a.target, a.address, a.detail, \
         p.kind AS principal_kind, p.name AS principal_name \
         FROM audit a LEFT JOIN principals p ON p.id = a.principal_id \
         WHERE ($1::uuid IS NULL OR a.principal_id = $1) \
         AND ($2::timestamptz IS NULL OR a.at >= $2) \
         AND ($3::timestamptz IS NULL OR a.at < $3) AND ($4::bigint IS NULL OR a.id < $4) \
         ORDER BY a.id DESC LIMIT $5",
    )
    .bind(f.principal)
    .bind(f.since)
    .bind(f.until)
    .bind(f.before)
    .bind(i64::from(f.limit))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let id: Uuid = r.try_get("principal_id")?;
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
                at: r.try_get("at")?,
                principal,
                action: AuditAction::parse(action)
                    .ok_or_else(|| StoreError::Corrupt(format!("audit action {action:?}")))?,
                target: r.try_get("target")?,
                address: r.try_get("address")?,
                detail: r.try_get("detail")?,
            })
        })
        .collect()
}

pub(crate) async fn purge_audit(
    pool: &PgPool,
    before: DateTime<Utc>,
    limit: u32,
) -> Result<u64, StoreError> {
    let deleted = sqlx::query(
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < $1 ORDER BY id LIMIT $2)",
    )
    .bind(before)
    .bind(i64::from(limit))
    .execute(pool)
    .await?
    .rows_affected();
    Ok(deleted)
}
