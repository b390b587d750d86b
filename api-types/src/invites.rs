//! Invite links to the worker web app.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Optional body of `POST /api/v1/workers/invites`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = InviteRequest))]
#[serde(deny_unknown_fields)]
pub struct CreateInvite {
    /// Seconds the link stays valid (60 to 2592000; default 604800, a week).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_in_seconds: Option<u64>,
}

/// Answer of `POST /api/v1/workers/invites`.
#[derive(Clone, Serialize, Deserialize, derive_more::Debug)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct CreatedInvite {
    /// The invite's id (to list or revoke it).
    pub id: Uuid,
    /// The one-time link to give the person. Shown only now.
    #[debug(skip)]
    pub invite_url: String,
    pub expires_at: DateTime<Utc>,
    /// The principal whose key created it.
    pub created_by: Uuid,
}

pub use meatspace_domain::identity::Invite;

crate::page! {
    /// A page of invites, by id.
    InvitePage { invites: Invite }
}
