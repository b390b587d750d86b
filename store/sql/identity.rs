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
    ApiKey, AuditEntry, AuditFilter, IdentityStore, Invite, InviteRecord, KeyRecord, NewApiKey,
    NewAudit, OpenTasksCursor, Session, StoreError, Worker,
};
use sqlx::Row as _;
use uuid::Uuid;

use crate::dialect::{self as d, Conn, Row, Tx};
use crate::sql::read_all;

pub(crate) const WORKER_COLUMNS: &str = "id, name, created_at, suspended_at";

/// Rows read one by id or a page at a time in id order.
pub(crate) struct Table<T> {
    columns: &'static str,
    /// The table, or the tables joined, the columns are read from.
    from: &'static str,
    /// The id column, as `columns` and `from` name it.
    id: &'static str,
    from_row: fn(&Row) -> Result<T, StoreError>,
}

const KEYS: Table<KeyRecord> = Table {
    columns: "k.id, k.name, k.scopes, k.digest, k.previous_digest, k.previous_valid_until, \
        k.expires_at, k.created_at, k.rotated_at, k.last_used_at, k.revoked_at, \
        p.id AS principal_id, p.kind AS principal_kind, p.name AS principal_name",
    from: "api_keys k JOIN principals p ON p.id = k.principal_id",
    id: "k.id",
    from_row: key_from_row,
};

const PRINCIPALS: Table<PrincipalRef> = Table {
    columns: "id AS principal_id, kind AS principal_kind, name AS principal_name",
    from: "principals",
    id: "id",
    from_row: principal_from_row,
};

pub(crate) const WORKERS: Table<Worker> = Table {
    columns: WORKER_COLUMNS,
    from: "workers",
    id: "id",
    from_row: worker_from_row,
};

const TASK_OWNERS: Table<Uuid> = Table {
    columns: "owner_id",
    from: "tasks",
    id: "id",
    from_row: |row| d::read_id(row, "owner_id"),
};

const INVITES: Table<InviteRecord> = Table {
    columns: "id, code_hash, created_at, expires_at, used_at, revoked_at, created_by",
    from: "worker_invites",
    id: "id",
    from_row: invite_from_row,
};

impl<T> Table<T> {
    /// Row `id`, read in `conn` (a write's, to read what it wrote).
    pub(crate) async fn find(&self, conn: &mut Conn, id: Uuid) -> Result<Option<T>, StoreError> {
        let Table {
            columns,
            from,
            id: column,
            ..
        } = self;
        let row = sqlx::query(&format!("SELECT {columns} FROM {from} WHERE {column} = $1"))
            .bind(d::id(id))
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(self.from_row).transpose()
    }

    /// Row `id`, read on a reader.
    async fn read(&self, store: &d::Store, id: Uuid) -> Result<Option<T>, StoreError> {
        self.find(&mut *d::reader(store).acquire().await?, id).await
    }

    /// At most `limit` rows with ids after `after`, in id order.
    async fn page(
        &self,
        store: &d::Store,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<T>, StoreError> {
        let Table {
            columns, from, id, ..
        } = self;
        let sql = format!("SELECT {columns} FROM {from} WHERE {id} > $1 ORDER BY {id} LIMIT $2");
        let query = sqlx::query(&sql)
            .bind(d::id(after.unwrap_or_default()))
            .bind(i64::from(limit));
        read_all(store, query, self.from_row).await
    }

    /// Runs `update` of row `id` in a write of its own, with `audit` when
    /// it changed the row (see [`write_audited`]); the row as it is then.
    async fn update_audited(
        &self,
        store: &d::Store,
        id: Uuid,
        update: d::Query<'_>,
        audit: &NewAudit,
    ) -> Result<Option<T>, StoreError> {
        let mut tx = d::begin(store).await?;
        write_audited(&mut tx, update, audit).await?;
        let row = self.find(&mut tx, id).await?;
        tx.commit().await?;
        Ok(row)
    }
}

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

/// Runs `write` in `tx` and, when it changed a row, appends `audit` with
/// it; whether it changed one.
async fn write_audited(
    tx: &mut Tx,
    write: d::Query<'_>,
    audit: &NewAudit,
) -> Result<bool, StoreError> {
    let changed = write.execute(&mut **tx).await?.rows_affected() == 1;
    if changed {
        insert_audit(tx, audit).await?;
    }
    Ok(changed)
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

/// The principal of a row with `principal_id`, `principal_kind` and
/// `principal_name`.
fn principal_from_row(row: &Row) -> Result<PrincipalRef, StoreError> {
    Ok(PrincipalRef {
        id: d::read_id(row, "principal_id")?,
        kind: kind(row.try_get("principal_kind")?)?,
        name: row.try_get("principal_name")?,
    })
}

fn key_from_row(row: &Row) -> Result<KeyRecord, StoreError> {
    let scopes: &str = row.try_get("scopes")?;
    let key = ApiKey {
        id: d::read_id(row, "id")?,
        name: row.try_get("name")?,
        principal: principal_from_row(row)?,
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

pub(crate) fn invite_from_row(row: &Row) -> Result<InviteRecord, StoreError> {
    let hash: Vec<u8> = row.try_get("code_hash")?;
    Ok(InviteRecord {
        invite: Invite {
            id: d::read_id(row, "id")?,
            created_at: d::read_time(row, "created_at")?,
            expires_at: d::read_time(row, "expires_at")?,
            used_at: d::read_opt_time(row, "used_at")?,
            revoked_at: d::read_opt_time(row, "revoked_at")?,
            created_by: d::read_id(row, "created_by")?,
        },
        code_hash: TokenHash::from_slice(&hash)
            .ok_or_else(|| StoreError::Corrupt("invite code digest".into()))?,
    })
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

/// Records `p` unless it is recorded already: a configured key's principal
/// is derived from its name, so a replica given the same key may have made
/// it already (fresh ids never meet).
async fn insert_principal(
    conn: &mut Conn,
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
    .execute(conn)
    .await?;
    Ok(())
}

async fn insert_key(tx: &mut Conn, new: &NewApiKey) -> Result<(), StoreError> {
    if new.new_principal {
        insert_principal(&mut *tx, &new.principal, new.created_at).await?;
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

/// Runs `delete` and, when it deleted a row, appends `audit` with it.
async fn delete_audited(
    mut tx: Tx,
    delete: d::Query<'_>,
    audit: NewAudit,
) -> Result<bool, StoreError> {
    let deleted = write_audited(&mut tx, delete, &audit).await?;
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
        let insert = sqlx::query(
            "INSERT INTO worker_sessions (id, worker_id, secret_hash, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(d::id(id))
        .bind(d::id(worker_id))
        .bind(&secret_hash.0[..])
        .bind(d::time(now))
        .bind(d::time(expires_at));
        d::write_statement(self, insert).await?;
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
        let delete = sqlx::query("DELETE FROM worker_sessions WHERE id = $1").bind(d::id(id));
        Ok(d::write_statement(self, delete).await? > 0)
    }

    #[tracing::instrument(level = "debug", skip(self, code_hash, audit), err)]
    async fn create_invite(
        &self,
        id: Uuid,
        code_hash: TokenHash,
        expires_at: DateTime<Utc>,
        audit: NewAudit,
    ) -> Result<(), StoreError> {
        let mut tx = d::begin(self).await?;
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

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn invite(&self, id: Uuid) -> Result<Option<InviteRecord>, StoreError> {
        INVITES.read(self, id).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(key_id = %new.id), err)]
    async fn create_api_key(&self, new: NewApiKey, audit: NewAudit) -> Result<ApiKey, StoreError> {
        let mut tx = d::begin(self).await?;
        insert_key(&mut tx, &new).await?;
        insert_audit(&mut tx, &audit).await?;
        tx.commit().await?;
        Ok(new.to_key())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(key_id = %new.id), err)]
    async fn insert_configured_key(&self, new: NewApiKey) -> Result<bool, StoreError> {
        let mut tx = d::begin(self).await?;
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

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn api_key(&self, id: Uuid) -> Result<Option<KeyRecord>, StoreError> {
        KEYS.read(self, id).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn api_keys(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<ApiKey>, StoreError> {
        let keys = KEYS.page(self, after, limit).await?;
        Ok(keys.into_iter().map(|k| k.key).collect())
    }

    #[tracing::instrument(level = "debug", skip(self, digest, audit), err)]
    async fn rotate_api_key(
        &self,
        id: Uuid,
        digest: TokenHash,
        previous_valid_until: DateTime<Utc>,
        audit: NewAudit,
    ) -> Result<Option<ApiKey>, StoreError> {
        let rotate = sqlx::query(
            "UPDATE api_keys SET previous_digest = digest, previous_valid_until = $1, \
             digest = $2, rotated_at = $3 WHERE id = $4 AND revoked_at IS NULL",
        )
        .bind(d::time(previous_valid_until))
        .bind(&digest.0[..])
        .bind(d::time(audit.at))
        .bind(d::id(id));
        let mut tx = d::begin(self).await?;
        if write_audited(&mut tx, rotate, &audit).await? {
            d::announce_credential(&mut tx, id).await?;
        }
        let key = KEYS.find(&mut tx, id).await?;
        tx.commit().await?;
        Ok(key.map(|k| k.key))
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn revoke_api_key(
        &self,
        id: Uuid,
        audit: NewAudit,
    ) -> Result<Option<ApiKey>, StoreError> {
        let revoke =
            sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                .bind(d::time(audit.at))
                .bind(d::id(id));
        let mut tx = d::begin(self).await?;
        write_audited(&mut tx, revoke, &audit).await?;
        // Announced even when it was revoked already: a process that missed
        // the first announcement (or cached in between) drops it now.
        d::announce_credential(&mut tx, id).await?;
        let key = KEYS.find(&mut tx, id).await?;
        tx.commit().await?;
        Ok(key.map(|k| k.key))
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
        let mut tx = d::begin_statement(self).await?;
        insert_principal(&mut tx, principal, now).await?;
        tx.commit().await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn principal(&self, id: Uuid) -> Result<Option<PrincipalRef>, StoreError> {
        PRINCIPALS.read(self, id).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn task_owner(&self, task_id: Uuid) -> Result<Option<Uuid>, StoreError> {
        TASK_OWNERS.read(self, task_id).await
    }

    /// `owner`'s tasks (in `state`, when given) newest first, after `cursor`.
    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn owned_tasks(
        &self,
        owner: Uuid,
        state: Option<TaskState>,
        cursor: Option<OpenTasksCursor>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError> {
        let (created_at, id) = match cursor {
            Some(c) => (d::time(c.created_at), d::id(c.id)),
            None => d::past_every_task(),
        };
        let sql = format!(
            "SELECT {} FROM tasks WHERE owner_id = $1 AND ($2 IS NULL OR state = $2) \
             AND (created_at, id) < ($3, $4) ORDER BY created_at DESC, id DESC LIMIT $5",
            crate::TASK_COLUMNS
        );
        let query = sqlx::query(&sql)
            .bind(d::id(owner))
            .bind(state.map(TaskState::as_str))
            .bind(created_at)
            .bind(id)
            .bind(i64::from(limit));
        read_all(self, query, crate::task_from_row).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn worker(&self, id: Uuid) -> Result<Option<Worker>, StoreError> {
        WORKERS.read(self, id).await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn workers(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Worker>, StoreError> {
        WORKERS.page(self, after, limit).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn grant_qualification(
        &self,
        worker: Uuid,
        qualification: &Qualification,
        audit: NewAudit,
    ) -> Result<bool, StoreError> {
        let mut tx = d::begin(self).await?;
        if WORKERS.find(&mut tx, worker).await?.is_none() {
            return Ok(false);
        }
        let (text, int) = match &qualification.value {
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
        .bind(&qualification.name)
        .bind(text)
        .bind(int)
        .bind(d::time(qualification.granted_at))
        .bind(d::opt_time(qualification.expires_at))
        .execute(&mut *tx)
        .await?;
        insert_audit(&mut tx, &audit).await?;
        tx.commit().await?;
        Ok(true)
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
        let query = sqlx::query(
            "SELECT name, value_text, value_int, granted_at, expires_at \
             FROM worker_qualifications WHERE worker_id = $1 ORDER BY name",
        )
        .bind(d::id(worker));
        read_all(self, query, qualification_from_row).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn block_worker(
        &self,
        principal: Uuid,
        worker: Uuid,
        audit: NewAudit,
    ) -> Result<bool, StoreError> {
        let mut tx = d::begin(self).await?;
        if WORKERS.find(&mut tx, worker).await?.is_none() {
            return Ok(false);
        }
        let block = sqlx::query(
            "INSERT INTO worker_blocks (principal_id, worker_id, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (principal_id, worker_id) DO NOTHING",
        )
        .bind(d::id(principal))
        .bind(d::id(worker))
        .bind(d::time(audit.at));
        write_audited(&mut tx, block, &audit).await?;
        tx.commit().await?;
        Ok(true)
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
        let query = sqlx::query(
            "SELECT worker_id, created_at FROM worker_blocks WHERE principal_id = $1 \
             ORDER BY worker_id",
        )
        .bind(d::id(principal));
        read_all(self, query, |row| {
            Ok((
                d::read_id(row, "worker_id")?,
                d::read_time(row, "created_at")?,
            ))
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn blocked_by(&self, worker: Uuid) -> Result<Vec<Uuid>, StoreError> {
        let query = sqlx::query("SELECT principal_id FROM worker_blocks WHERE worker_id = $1")
            .bind(d::id(worker));
        read_all(self, query, |row| d::read_id(row, "principal_id")).await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn reinstate_worker(
        &self,
        id: Uuid,
        audit: NewAudit,
    ) -> Result<Option<Worker>, StoreError> {
        let lift = sqlx::query(
            "UPDATE workers SET suspended_at = NULL WHERE id = $1 AND suspended_at IS NOT NULL",
        )
        .bind(d::id(id));
        WORKERS.update_audited(self, id, lift, &audit).await
    }

    #[tracing::instrument(level = "debug", skip(self, token_hash, audit), err)]
    async fn rotate_worker_token(
        &self,
        id: Uuid,
        token_hash: TokenHash,
        audit: NewAudit,
    ) -> Result<Option<Worker>, StoreError> {
        let mut tx = d::begin(self).await?;
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
        let worker = WORKERS.find(&mut tx, id).await?;
        tx.commit().await?;
        Ok(worker)
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn invites(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Invite>, StoreError> {
        let records = INVITES.page(self, after, limit).await?;
        Ok(records.into_iter().map(|r| r.invite).collect())
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn revoke_invite(&self, id: Uuid, audit: NewAudit) -> Result<Option<Invite>, StoreError> {
        let revoke = sqlx::query(
            "UPDATE worker_invites SET revoked_at = $1 \
             WHERE id = $2 AND revoked_at IS NULL AND used_at IS NULL",
        )
        .bind(d::time(audit.at))
        .bind(d::id(id));
        let record = INVITES.update_audited(self, id, revoke, &audit).await?;
        Ok(record.map(|r| r.invite))
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn append_audit(&self, audit: NewAudit) -> Result<(), StoreError> {
        let mut tx = d::begin_statement(self).await?;
        insert_audit(&mut tx, &audit).await?;
        tx.commit().await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn audit(&self, f: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        let query = sqlx::query(
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
        .bind(f.target.as_deref());
        read_all(self, query, |r| {
            let principal = match r.try_get::<Option<&str>, _>("principal_kind")? {
                Some(_) => principal_from_row(r)?,
                None => unknown_principal(d::read_id(r, "principal_id")?),
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
        .await
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn purge_audit_before(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        crate::sql::delete_due(self, "audit", "id", "at < $1 ORDER BY id", before, limit).await
    }
}
