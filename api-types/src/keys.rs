//! API keys, as operators manage them.

use chrono::{DateTime, Utc};
use meatspace_domain::identity::{PrincipalKind, Scope};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An API key as operators see it: never its secret or digest.
pub use meatspace_domain::identity::ApiKey as Key;

/// Body of `POST /api/v1/keys`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = CreateKeyRequest))]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// What the key is for (1-200 characters).
    pub name: String,
    /// The kind of a new principal (default `agent`); ignored with `principal_id`.
    pub kind: Option<PrincipalKind>,
    /// Another key for this existing principal, instead of a new one.
    pub principal_id: Option<Uuid>,
    /// Default: `["tasks"]` for an agent, `["operator"]` for an operator.
    pub scopes: Option<Vec<Scope>>,
    pub expires_at: Option<DateTime<Utc>>,
}

impl CreateKey {
    /// A key for a new agent principal with the default scopes.
    pub fn new(name: impl Into<String>) -> Self {
        CreateKey {
            name: name.into(),
            kind: None,
            principal_id: None,
            scopes: None,
            expires_at: None,
        }
    }
}

/// A key and its secret, shown once: the answer of a create, or of a
/// rotation (the same id, a new secret).
#[derive(Clone, Serialize, Deserialize, derive_more::Debug)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = KeyWithSecret))]
pub struct KeySecret {
    pub key: Key,
    /// `msk_<key id>_<secret>`. Shown only now; store it securely.
    #[debug(skip)]
    pub secret: String,
}

/// Optional body of `POST /api/v1/keys/{id}/rotate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = RotateKeyRequest))]
#[serde(deny_unknown_fields)]
pub struct RotateKey {
    /// How long the current secret keeps working (0-604800 s; default 86400).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_seconds: Option<u64>,
}

/// Optional body of `POST /api/v1/keys/{id}/revoke`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = RevokeKeyRequest))]
#[serde(deny_unknown_fields)]
pub struct RevokeKey {
    /// Also cancel every non-terminal task the key's principal owns (when
    /// this is its last key, its tasks otherwise run on with their tokens).
    #[serde(default)]
    pub cancel_tasks: bool,
}

/// Answer of `POST /api/v1/keys/{id}/revoke`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct RevokedKey {
    pub key: Key,
    /// Tasks cancelled with it (`cancel_tasks`).
    pub cancelled_tasks: u64,
}

crate::page! {
    /// A page of API keys, by id.
    KeyPage { keys: Key }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reads_with_its_optional_fields_absent_or_set() {
        let key: Key = serde_json::from_value(serde_json::json!({
            "id": "0123456789abcdef0123456789abcdef",
            "name": "billing-agent",
            "principal": {"id": "00000000-0000-0000-0000-00000000de00", "kind": "agent", "name": "billing"},
            "scopes": ["tasks", "workers:register"],
            "created_at": "2030-01-01T00:00:00Z",
        }))
        .unwrap();
        assert_eq!(
            key.scopes.iter().collect::<Vec<_>>(),
            [Scope::Tasks, Scope::RegisterWorkers]
        );
        assert_eq!(key.principal.kind, PrincipalKind::Agent);
        assert!(key.revoked_at.is_none() && key.previous_valid_until.is_none());
        let rotated: KeySecret = serde_json::from_value(serde_json::json!({
            "key": {
                "id": key.id, "name": "n", "principal": key.principal, "scopes": ["operator"],
                "created_at": "2030-01-01T00:00:00Z", "rotated_at": "2030-01-02T00:00:00Z",
                "previous_valid_until": "2030-01-03T00:00:00Z",
            },
            "secret": "msk_0123456789abcdef0123456789abcdef_s3cret",
        }))
        .unwrap();
        assert!(rotated.key.previous_valid_until.is_some());
        assert!(
            !format!("{rotated:?}").contains("s3cret"),
            "the secret stays out of debug output"
        );
    }

    #[test]
    fn a_new_key_sends_only_what_was_chosen() {
        assert_eq!(
            serde_json::to_value(CreateKey::new("a")).unwrap(),
            serde_json::json!({ "name": "a" })
        );
        let mut full = CreateKey::new("a");
        full.kind = Some(PrincipalKind::Operator);
        full.scopes = Some(vec![Scope::Invites, Scope::RegisterWorkers]);
        assert_eq!(
            serde_json::to_value(full).unwrap(),
            serde_json::json!({ "name": "a", "kind": "operator", "scopes": ["invites", "workers:register"] })
        );
    }
}
