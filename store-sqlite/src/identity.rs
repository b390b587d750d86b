//! SQL of identity and access on SQLite: principals, API keys, worker
//! suspension, invite listing and revocation, and the audit trail. Each
//! privileged write is one write of the store's writer (see
//! [`crate::writer`]) with the audit row that records it, and a write that
//! takes a credential's power away has it announced after its commit.

use chrono::{DateTime, Utc};
use meatspace_domain::TaskState;
use meatspace_domain::identity::{AuditAction, PrincipalKind, PrincipalRef, Scopes};
use meatspace_store::identity::unknown_principal;
use meatspace_store::token::TokenHash;
use meatspace_store::{
    ApiKey, AuditEntry, AuditFilter, Invite, KeyRecord, NewApiKey, NewAudit, OpenTasksCursor,
    StoreError, Worker,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::{Cells, from_ms, ms, opt_from_ms, opt_ms, uuid};

type Tx = crate::WriteTx;

const KEY_COLUMNS: &str = "k.id, k.name, k.scopes, k.digest, k.previous_digest, \
    k.previous_valid_until, k.expires_at, k.created_at, k.rotated_at, k.last_used_at, \
    k.revoked_at, p.id AS principal_id, p.kind AS principal_kind, p.name AS principal_name";

pub(crate) const WORKER_COLUMNS: &str = "id, name, created_at, suspended_at";

const INVITE_COLUMNS: &str =
    "id, code_hash, created_at, expires_at, used_at, revoked_at, created_by";

pub(crate) async fn insert_audit(
    conn: &mut SqliteConnection,
    audit: &NewAudit,
) -> Result<(), StoreError> {
    sqlx::query(meatspace_store::identity::INSERT_AUDIT_SQL)
        .bind(ms(audit.at))
        .bind(audit.principal_id.to_string())
        .bind(audit.action.as_str())
        .bind(&audit.target)
        .bind(&audit.address)
        .bind(audit.detail.as_ref().map(|d| d.to_string()))
        .execute(conn)
        .await?;
    Ok(())
}

fn principal_from(id: &str, kind: &str, name: String) -> Result<PrincipalRef, StoreError> {
    Ok(PrincipalRef {
        id: uuid(id)?,
        kind: PrincipalKind::parse(kind)
            .ok_or_else(|| StoreError::Corrupt(format!("principal kind {kind:?}")))?,
        name,
    })
}

fn digest(bytes: Option<Vec<u8>>) -> Result<Option<TokenHash>, StoreError> {
    bytes
        .map(|b| TokenHash::from_slice(&b).ok_or_else(|| StoreError::Corrupt("key digest".into())))
        .transpose()
}

fn key_from_row(row: &SqliteRow) -> Result<KeyRecord, StoreError> {
    let scopes: &str = row.try_get("scopes")?;
    let key = ApiKey {
        id: uuid(row.try_get("id")?)?,
        name: row.try_get("name")?,
        principal: principal_from(
            row.try_get("principal_id")?,
            row.try_get("principal_kind")?,
            row.try_get("principal_name")?,
        )?,
        scopes: Scopes::from_text(scopes)
            .ok_or_else(|| StoreError::Corrupt(format!("scopes {scopes:?}")))?,
        created_at: from_ms(row.try_get("created_at")?)?,
        expires_at: opt_from_ms(row.try_get("expires_at")?)?,
        last_used_at: opt_from_ms(row.try_get("last_used_at")?)?,
        revoked_at: opt_from_ms(row.try_get("revoked_at")?)?,
        rotated_at: opt_from_ms(row.try_get("rotated_at")?)?,
        previous_valid_until: opt_from_ms(row.try_get("previous_valid_until")?)?,
    };
    Ok(KeyRecord {
        key,
        digest: digest(Some(row.try_get("digest")?))?
            .ok_or_else(|| StoreError::Corrupt("key digest".into()))?,
        previous_digest: digest(row.try_get("previous_digest")?)?,
    })
}

pub(crate) fn worker_from_row(row: &impl Cells) -> Result<Worker, StoreError> {
    Ok(Worker {
        id: uuid(row.text("id")?)?,
        name: row.text("name")?.to_owned(),
        created_at: row.time("created_at")?,
        suspended_at: row.opt_time("suspended_at")?,
    })
}

pub(crate) fn invite_from_row(row: &SqliteRow) -> Result<Invite, StoreError> {
    let hash: Vec<u8> = row.try_get("code_hash")?;
    Ok(Invite {
        id: uuid(row.try_get("id")?)?,
        code_hash: TokenHash::from_slice(&hash)
            .ok_or_else(|| StoreError::Corrupt("invite code digest".into()))?,
        created_at: from_ms(row.try_get("created_at")?)?,
        expires_at: from_ms(row.try_get("expires_at")?)?,
        used_at: opt_from_ms(row.try_get("used_at")?)?,
        revoked_at: opt_from_ms(row.try_get("revoked_at")?)?,
        created_by: uuid(row.try_get("created_by")?)?,
    })
}

async fn insert_key(tx: &mut SqliteConnection, new: &NewApiKey) -> Result<(), StoreError> {
    // A configured key's principal is derived from its name, so a replica
    // given the same key may have made it already (fresh ids never meet).
    if new.new_principal {
        sqlx::query(
            "INSERT INTO principals (id, kind, name, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(new.principal.id.to_string())
        .bind(new.principal.kind.as_str())
        .bind(&new.principal.name)
        .bind(ms(new.created_at))
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "INSERT INTO api_keys (id, principal_id, name, scopes, digest, expires_at, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(new.id.to_string())
    .bind(new.principal.id.to_string())
    .bind(&new.name)
    .bind(new.scopes.to_text())
    .bind(&new.digest.0[..])
    .bind(opt_ms(new.expires_at))
    .bind(ms(new.created_at))
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
    let exists: Option<i64> = sqlx::query_scalar("SELECT 1 FROM api_keys WHERE id = ?")
        .bind(new.id.to_string())
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

async fn key_in(conn: &mut SqliteConnection, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys k JOIN principals p ON p.id = k.principal_id \
         WHERE k.id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(key_from_row).transpose()
}

pub(crate) async fn key(pool: &SqlitePool, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
    key_in(&mut *pool.acquire().await?, id).await
}

pub(crate) async fn keys(
    pool: &SqlitePool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<ApiKey>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys k JOIN principals p ON p.id = k.principal_id \
         WHERE k.id > ? ORDER BY k.id LIMIT ?"
    ))
    .bind(after.map(|a| a.to_string()).unwrap_or_default())
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
        "UPDATE api_keys SET previous_digest = digest, previous_valid_until = ?, digest = ?, \
         rotated_at = ? WHERE id = ? AND revoked_at IS NULL",
    )
    .bind(ms(previous_valid_until))
    .bind(&new_digest.0[..])
    .bind(ms(audit.at))
    .bind(id.to_string())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if rotated == 1 {
        insert_audit(&mut tx, &audit).await?;
        tx.touch_credential(id);
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
        sqlx::query("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
            .bind(ms(audit.at))
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if revoked == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    // Announced even when it was revoked already: a process that cached it
    // in between drops it now.
    tx.touch_credential(id);
    let key = key_in(&mut tx, id).await?;
    tx.commit().await?;
    Ok(key.map(|k| k.key))
}

pub(crate) async fn touch_keys(
    mut tx: Tx,
    used: &[(Uuid, DateTime<Utc>)],
) -> Result<(), StoreError> {
    for (id, at) in used {
        sqlx::query(
            "UPDATE api_keys SET last_used_at = ?1 \
             WHERE id = ?2 AND (last_used_at IS NULL OR last_used_at < ?1)",
        )
        .bind(ms(*at))
        .bind(id.to_string())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn ensure_principal(
    mut tx: Tx,
    p: &PrincipalRef,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO principals (id, kind, name, created_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(p.id.to_string())
    .bind(p.kind.as_str())
    .bind(&p.name)
    .bind(ms(now))
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

pub(crate) async fn principal(
    pool: &SqlitePool,
    id: Uuid,
) -> Result<Option<PrincipalRef>, StoreError> {
    let row = sqlx::query("SELECT id, kind, name FROM principals WHERE id = ?")
        .bind(id.to_string())
        .fetch_optional(pool)
        .await?;
    row.map(|r| principal_from(r.try_get("id")?, r.try_get("kind")?, r.try_get("name")?))
        .transpose()
}

pub(crate) async fn task_owner(
    pool: &SqlitePool,
    task_id: Uuid,
) -> Result<Option<Uuid>, StoreError> {
    let owner: Option<String> = sqlx::query_scalar("SELECT owner_id FROM tasks WHERE id = ?")
        .bind(task_id.to_string())
        .fetch_optional(pool)
        .await?;
    owner.as_deref().map(uuid).transpose()
}

/// The SQL that selects `owner`'s tasks newest first; the caller binds
/// owner, state (when given), the cursor and the limit, in that order.
pub(crate) fn owned_tasks_sql(columns: &str, with_state: bool) -> String {
    let state = if with_state { "AND state = ? " } else { "" };
    format!(
        "SELECT {columns} FROM tasks WHERE owner_id = ? {state}\
         AND (created_at, id) < (?, ?) ORDER BY created_at DESC, id DESC LIMIT ?"
    )
}

pub(crate) fn cursor_binds(cursor: Option<OpenTasksCursor>) -> (i64, String) {
    match cursor {
        Some(c) => (ms(c.created_at), c.id.to_string()),
        // Past every id: '~' sorts after every hex digit and hyphen.
        None => (i64::MAX, "~".to_owned()),
    }
}

pub(crate) fn state_name(state: Option<TaskState>) -> Option<&'static str> {
    state.map(TaskState::as_str)
}

pub(crate) async fn worker(pool: &SqlitePool, id: Uuid) -> Result<Option<Worker>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(worker_from_row).transpose()
}

pub(crate) async fn workers(
    pool: &SqlitePool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Worker>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id > ? ORDER BY id LIMIT ?"
    ))
    .bind(after.map(|a| a.to_string()).unwrap_or_default())
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(worker_from_row).collect()
}

async fn worker_in(tx: &mut SqliteConnection, id: Uuid) -> Result<Option<Worker>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(worker_from_row).transpose()
}

pub(crate) async fn reinstate_worker(
    mut tx: Tx,
    id: Uuid,
    audit: NewAudit,
) -> Result<Option<Worker>, StoreError> {
    let lifted = sqlx::query(
        "UPDATE workers SET suspended_at = NULL WHERE id = ? AND suspended_at IS NOT NULL",
    )
    .bind(id.to_string())
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
    let rotated = sqlx::query("UPDATE workers SET token_hash = ? WHERE id = ?")
        .bind(&token_hash.0[..])
        .bind(id.to_string())
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if rotated == 0 {
        tx.rollback().await?;
        return Ok(None);
    }
    insert_audit(&mut tx, &audit).await?;
    tx.touch_credential(id);
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
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(id.to_string())
    .bind(&code_hash.0[..])
    .bind(ms(audit.at))
    .bind(ms(expires_at))
    .bind(audit.principal_id.to_string())
    .execute(&mut *tx)
    .await?;
    insert_audit(&mut tx, &audit).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn invite(pool: &SqlitePool, id: Uuid) -> Result<Option<Invite>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(invite_from_row).transpose()
}

pub(crate) async fn invites(
    pool: &SqlitePool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Invite>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id > ? ORDER BY id LIMIT ?"
    ))
    .bind(after.map(|a| a.to_string()).unwrap_or_default())
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
        "UPDATE worker_invites SET revoked_at = ? \
         WHERE id = ? AND revoked_at IS NULL AND used_at IS NULL",
    )
    .bind(ms(audit.at))
    .bind(id.to_string())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if revoked == 1 {
        insert_audit(&mut tx, &audit).await?;
    }
    let row = sqlx::query(&format!(
        "SELECT {INVITE_COLUMNS} FROM worker_invites WHERE id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    row.as_ref().map(invite_from_row).transpose()
}

pub(crate) async fn append_audit(mut tx: Tx, audit: &NewAudit) -> Result<(), StoreError> {
    insert_audit(&mut tx, audit).await?;
    tx.commit().await
}

pub(crate) async fn audit(
    pool: &SqlitePool,
    f: &AuditFilter,
) -> Result<Vec<AuditEntry>, StoreError> {
    let rows = sqlx::query(
        "SELECT a.id, a.at, a.principal_id, a.action, a.target, a.address, a.detail, \
         p.kind AS principal_kind, p.name AS principal_name \
         FROM audit a LEFT JOIN principals p ON p.id = a.principal_id \
         WHERE (?1 IS NULL OR a.principal_id = ?1) AND (?2 IS NULL OR a.at >= ?2) \
         AND (?3 IS NULL OR a.at < ?3) AND (?4 IS NULL OR a.id < ?4) \
         ORDER BY a.id DESC LIMIT ?5",
    )
    .bind(f.principal.map(|p| p.to_string()))
    .bind(opt_ms(f.since))
    .bind(opt_ms(f.until))
    .bind(f.before)
    .bind(i64::from(f.limit))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let id = uuid(r.try_get("principal_id")?)?;
            let kind: Option<&str> = r.try_get("principal_kind")?;
            let principal = match kind {
                Some(kind) => principal_from(
                    r.try_get("principal_id")?,
                    kind,
                    r.try_get("principal_name")?,
                )?,
                None => unknown_principal(id),
            };
            let action: &str = r.try_get("action")?;
            let detail: Option<String> = r.try_get("detail")?;
            Ok(AuditEntry {
                id: r.try_get("id")?,
                at: from_ms(r.try_get("at")?)?,
                principal,
                action: AuditAction::parse(action)
                    .ok_or_else(|| StoreError::Corrupt(format!("audit action {action:?}")))?,
                target: r.try_get("target")?,
                address: r.try_get("address")?,
                detail: detail
                    .map(|d| serde_json::from_str(&d))
                    .transpose()
                    .map_err(|_| StoreError::Corrupt("audit detail".into()))?,
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
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ? ORDER BY id LIMIT ?)",
    )
    .bind(ms(before))
    .bind(i64::from(limit))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(deleted)
}
