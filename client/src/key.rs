//! [`Keys`]: the API keys an operator creates, lists, rotates and revokes
//! (`/api/v1/keys`, scope `operator`). A key's secret is in the answer of
//! its creation and of each rotation only; the server keeps a digest.

use reqwest::Method;
use uuid::Uuid;

use crate::error::Error;
use crate::http::{Auth, Body, Call, Client};
use crate::types::{CreateKey, Key, KeyPage, KeySecret, RevokeKey, RevokedKey, RotateKey};

/// The API keys of the install.
#[derive(Debug, Clone)]
pub struct Keys {
    client: Client,
}

/// A key id in a path: the 32 hex digits embedded in the key itself.
fn path(id: Uuid, suffix: &str) -> String {
    format!("/api/v1/keys/{}{suffix}", id.simple())
}

impl Keys {
    pub(crate) fn new(client: Client) -> Self {
        Keys { client }
    }

    /// A new key (for a new principal, or another one of an existing
    /// principal); its secret is shown only in this answer.
    pub async fn create(&self, req: &CreateKey) -> Result<KeySecret, Error> {
        let call =
            Call::new(Method::POST, "/api/v1/keys".into(), Auth::Principal).body(Body::json(req)?);
        self.client.json(call).await
    }

    /// One page of keys (`cursor`: the previous page's `next_cursor`).
    pub async fn list(&self, cursor: Option<&str>, limit: Option<u32>) -> Result<KeyPage, Error> {
        let mut call = Call::new(Method::GET, "/api/v1/keys".into(), Auth::Principal);
        call.page(cursor, limit);
        self.client.json(call).await
    }

    pub async fn get(&self, id: Uuid) -> Result<Key, Error> {
        let call = Call::new(Method::GET, path(id, ""), Auth::Principal);
        self.client.json(call).await
    }

    /// A new secret for the key; the old one keeps working for
    /// `grace_seconds` (the server's default, a day, when `None`).
    pub async fn rotate(&self, id: Uuid, grace_seconds: Option<u64>) -> Result<KeySecret, Error> {
        let body = RotateKey { grace_seconds };
        let call =
            Call::new(Method::POST, path(id, "/rotate"), Auth::Principal).body(Body::json(&body)?);
        self.client.json(call).await
    }

    /// Revokes the key at once; with `cancel_tasks`, also cancels the
    /// tasks of its principal that have not ended. Revoking twice changes
    /// nothing.
    pub async fn revoke(&self, id: Uuid, cancel_tasks: bool) -> Result<RevokedKey, Error> {
        let call = Call::new(Method::POST, path(id, "/revoke"), Auth::Principal)
            .body(Body::json(&RevokeKey { cancel_tasks })?);
        self.client.json(call).await
    }
}
