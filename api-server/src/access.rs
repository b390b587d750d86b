//! Identity and access outside requests: the first operator key (made by
//! the `bootstrap-operator` command, or given by configuration), the
//! principal of a Kubernetes namespace, and the upkeep that writes keys'
//! last use and trims the audit trail.

use std::sync::Arc;
use std::time::Duration;

use meatspace_domain::identity::{PrincipalKind, PrincipalRef, Scopes};
use meatspace_store::token::TokenHash;
use meatspace_store::{NewApiKey, Store, StoreError};
use uuid::Uuid;

use crate::auth::{Credentials, KEY_PREFIX, issue_key};

/// Shortest secret accepted in a key given by configuration.
pub const MIN_CONFIGURED_SECRET_CHARS: usize = 32;

/// An operator key for a new principal named `name`.
pub fn new_operator_key(name: &str) -> (NewApiKey, String) {
    let id = Uuid::new_v4();
    let (secret, digest) = issue_key(id);
    let key = NewApiKey {
        id,
        principal: PrincipalRef {
            id: Uuid::new_v4(),
            kind: PrincipalKind::Operator,
            name: name.to_owned(),
        },
        new_principal: true,
        name: format!("{name} (bootstrap)"),
        scopes: Scopes::default_for(PrincipalKind::Operator),
        digest,
        expires_at: None,
        created_at: meatspace_domain::clock::now(),
    };
    (key, secret)
}

/// Stores a new operator with one key and returns the key (`bootstrap-operator`).
pub async fn bootstrap_operator(store: &dyn Store, name: &str) -> Result<String, StoreError> {
    let (key, secret) = new_operator_key(name);
    let audit = meatspace_store::NewAudit {
        at: key.created_at,
        principal_id: key.principal.id,
        action: meatspace_domain::identity::AuditAction::KeyCreated,
        target: format!("key:{}", key.id),
        address: None,
        detail: Some(serde_json::json!({ "via": "bootstrap-operator" })),
    };
    store.create_api_key(key, audit).await?;
    Ok(secret)
}

/// Why a key given by configuration is refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "MEATSPACE_BOOTSTRAP_OPERATOR_KEY must be msk_<32 hex digits>_<at least \
     {MIN_CONFIGURED_SECRET_CHARS} characters>"
)]
pub struct MalformedKey;

/// The id a configured key names, if it has the right form.
pub fn configured_key_id(key: &str) -> Result<Uuid, MalformedKey> {
    let rest = key.strip_prefix(KEY_PREFIX).ok_or(MalformedKey)?;
    let (id, secret) = rest.split_once('_').ok_or(MalformedKey)?;
    if id.len() != 32 || secret.chars().count() < MIN_CONFIGURED_SECRET_CHARS {
        return Err(MalformedKey);
    }
    Uuid::try_parse(id).map_err(|_| MalformedKey)
}

/// Stores the configured operator key unless its id is known; true when
/// stored now.
pub async fn store_configured_key(store: &dyn Store, key: &str) -> anyhow::Result<bool> {
    let id = configured_key_id(key)?;
    let (mut new, _) = new_operator_key("bootstrap operator");
    new.id = id;
    new.digest = TokenHash::of(key);
    new.name = "configured operator key".to_owned();
    // One principal for every replica that stores it: derived from the key id.
    new.principal.id = Uuid::from_u128(id.as_u128() ^ 0x6f70_6572_6174_6f72);
    // (`new_principal` stays set: the store makes it unless another
    // replica did.)
    Ok(store.insert_configured_key(new).await?)
}

/// How often keys' last use is written and the audit trail trimmed.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Runs until `closed` resolves: every [`UPKEEP_INTERVAL`], writes the keys
/// used since the last round and deletes audit entries older than
/// `retention`.
pub async fn upkeep(
    store: Arc<dyn Store>,
    clock: meatspace_domain::clock::Clock,
    credentials: Credentials,
    retention: chrono::TimeDelta,
    closed: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(closed);
    let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut closed => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = credentials.key_use.flush(store.as_ref()).await {
            tracing::warn!(error = %e, "cannot record when keys were last used");
        }
        let before = clock.now() - retention;
        if let Err(e) = store.purge_audit_before(before, 1000).await {
            tracing::warn!(error = %e, "cannot trim the audit trail");
        }
    }
    // The last uses seen before the shutdown.
    let _ = credentials.key_use.flush(store.as_ref()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_key_must_have_the_key_form() {
        let id = Uuid::new_v4();
        let good = format!("msk_{}_{}", id.simple(), "a".repeat(40));
        assert_eq!(configured_key_id(&good).unwrap(), id);
        for bad in [
            "msk_nothex_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".to_owned(),
            format!("msk_{}_{}", id.simple(), "short"),
            format!("mst_{}_{}", id.simple(), "a".repeat(40)),
            format!("msk_{}", id.simple()),
        ] {
            assert!(configured_key_id(&bad).is_err(), "{bad}");
        }
    }
}
