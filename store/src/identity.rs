//! Records of identity and access: API keys and the principals
//! they belong to, and the audit trail of privileged actions. The store
//! keeps only digests of key secrets; [`KeyRecord::check`] is the one place
//! that decides whether a presented secret is good at a given instant.

use chrono::{DateTime, Utc};
pub use meatspace_domain::identity::{ApiKey, AuditEntry};
use meatspace_domain::identity::{AuditAction, PrincipalKind, PrincipalRef, Scopes};
use uuid::Uuid;

use crate::token::TokenHash;

/// Prefix of API keys: `msk_<key id, 32 hex digits>_<secret>`.
pub const KEY_PREFIX: &str = "msk_";

/// A key with the digests its secrets are checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub key: ApiKey,
    pub digest: TokenHash,
    /// The digest a rotation replaced, good until `key.previous_valid_until`.
    pub previous_digest: Option<TokenHash>,
}

/// Why a key's secret is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    /// The secret matches neither digest (or the previous one's grace ended).
    Wrong,
    Revoked,
    Expired,
}

impl KeyRecord {
    /// Whether `secret` opens this key at `now`. The digests are compared
    /// in constant time, both of them, so the answer's timing does not
    /// tell which one matched.
    pub fn check(&self, secret: &str, now: DateTime<Utc>) -> Result<(), KeyRefusal> {
        let current = self.digest.verify(secret);
        let previous = self
            .previous_digest
            .as_ref()
            .is_some_and(|d| d.verify(secret))
            && self
                .key
                .previous_valid_until
                .is_some_and(|until| now < until);
        if !(current || previous) {
            return Err(KeyRefusal::Wrong);
        }
        if self.key.revoked_at.is_some() {
            return Err(KeyRefusal::Revoked);
        }
        if self.key.expires_at.is_some_and(|at| now >= at) {
            return Err(KeyRefusal::Expired);
        }
        Ok(())
    }
}

/// A key to store. `principal` is created with it when `new_principal`.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    pub id: Uuid,
    pub principal: PrincipalRef,
    pub new_principal: bool,
    pub name: String,
    pub scopes: Scopes,
    pub digest: TokenHash,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl NewApiKey {
    /// The key as it reads back once stored.
    pub fn to_key(&self) -> ApiKey {
        ApiKey {
            id: self.id,
            name: self.name.clone(),
            principal: self.principal.clone(),
            scopes: self.scopes.clone(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            last_used_at: None,
            revoked_at: None,
            rotated_at: None,
            previous_valid_until: None,
        }
    }
}

/// The insert of a [`NewAudit`], in SQL both databases accept: `at`,
/// `principal_id`, `action`, `target`, `address`, `detail` as `$1`…`$6`.
pub const INSERT_AUDIT_SQL: &str = "INSERT INTO audit (at, principal_id, action, target, address, detail) \
     VALUES ($1, $2, $3, $4, $5, $6)";

/// An entry to append to the audit trail, in the transaction of the action
/// it records.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAudit {
    pub at: DateTime<Utc>,
    /// Who acted.
    pub principal_id: Uuid,
    pub action: AuditAction,
    /// What was acted on: `key:<id>`, `worker:<id>`, `invite:<id>`, `task:<id>`.
    pub target: String,
    /// The client's address, as the server saw it.
    pub address: Option<String>,
    pub detail: Option<serde_json::Value>,
}

/// Which audit entries to read: newest first, with `id < before` when set.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub principal: Option<Uuid>,
    /// Only entries of this action.
    pub action: Option<meatspace_domain::identity::AuditAction>,
    /// Only entries about this target (`worker:<id>`, `key:<id>`, ...).
    pub target: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub before: Option<i64>,
    pub limit: u32,
}

/// The principal an audit row names, when the store no longer finds it (a
/// worker, or a row written by another build).
pub fn unknown_principal(id: Uuid) -> PrincipalRef {
    PrincipalRef {
        id,
        kind: PrincipalKind::System,
        name: String::new(),
    }
}

/// The principal that owns the tasks requested from Kubernetes namespace
/// `namespace`: the same id in every process, from the name alone.
pub fn namespace_principal(namespace: &str) -> PrincipalRef {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("meatspace namespace\0{namespace}"));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    PrincipalRef {
        id: uuid::Builder::from_random_bytes(bytes).into_uuid(),
        kind: PrincipalKind::Agent,
        name: format!("kubernetes:{namespace}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn record(secret: &str) -> KeyRecord {
        let at = Utc.timestamp_opt(1000, 0).unwrap();
        let new = NewApiKey {
            id: Uuid::from_u128(1),
            principal: PrincipalRef {
                id: Uuid::from_u128(2),
                kind: PrincipalKind::Agent,
                name: "a".into(),
            },
            new_principal: true,
            name: "k".into(),
            scopes: Scopes::default_for(PrincipalKind::Agent),
            digest: TokenHash::of(secret),
            expires_at: None,
            created_at: at,
        };
        KeyRecord {
            key: new.to_key(),
            digest: new.digest,
            previous_digest: None,
        }
    }

    #[test]
    fn a_namespace_has_one_principal() {
        let a = namespace_principal("team-a");
        assert_eq!(a, namespace_principal("team-a"));
        assert_ne!(a.id, namespace_principal("team-b").id);
        assert_eq!(a.name, "kubernetes:team-a");
    }

    #[test]
    fn a_key_opens_with_its_secret_until_revoked_or_expired() {
        let now = Utc.timestamp_opt(2000, 0).unwrap();
        let mut r = record("msk_a");
        assert_eq!(r.check("msk_a", now), Ok(()));
        assert_eq!(r.check("msk_b", now), Err(KeyRefusal::Wrong));
        r.key.expires_at = Some(now);
        assert_eq!(r.check("msk_a", now), Err(KeyRefusal::Expired));
        r.key.expires_at = None;
        r.key.revoked_at = Some(now);
        assert_eq!(r.check("msk_a", now), Err(KeyRefusal::Revoked));
        // A wrong secret learns nothing about the key's state.
        assert_eq!(r.check("msk_b", now), Err(KeyRefusal::Wrong));
    }

    #[test]
    fn a_rotated_secret_works_through_its_grace_period_only() {
        let now = Utc.timestamp_opt(2000, 0).unwrap();
        let mut r = record("msk_new");
        r.previous_digest = Some(TokenHash::of("msk_old"));
        r.key.previous_valid_until = Some(now + chrono::TimeDelta::seconds(60));
        assert_eq!(r.check("msk_old", now), Ok(()));
        assert_eq!(r.check("msk_new", now), Ok(()));
        let later = now + chrono::TimeDelta::seconds(60);
        assert_eq!(r.check("msk_old", later), Err(KeyRefusal::Wrong));
        assert_eq!(r.check("msk_new", later), Ok(()));
    }
}
