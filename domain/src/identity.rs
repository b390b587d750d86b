//! Who may do what: the kinds of principal, the scopes an API key carries,
//! and the privileged actions the audit trail records. Plain data; the
//! server checks a request's scopes against [`Scope`] and the store keeps
//! [`Scopes`] in their text form.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A registered worker (its token's digest stays in the store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Worker {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// When an operator suspended the worker: its token and sessions are
    /// refused until it is reinstated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_at: Option<DateTime<Utc>>,
}

/// The principal the development key acts as, when it is enabled: a
/// built-in operator with every scope. Tasks created before identity
/// existed belong to it.
pub const DEVELOPMENT_PRINCIPAL: Uuid = Uuid::from_u128(0xde00);

/// What a principal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    /// Runs the install: manages keys, workers, invites, reads the audit.
    Operator,
    /// Creates tasks and drives them.
    Agent,
    /// Does tasks (a registered worker).
    Worker,
    /// The server or the controller acting on its own (deadlines).
    System,
}

crate::names! {
    PrincipalKind {
        Operator => "operator",
        Agent => "agent",
        Worker => "worker",
        System => "system",
    }
}

/// A principal as other records refer to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct PrincipalRef {
    pub id: Uuid,
    pub kind: PrincipalKind,
    pub name: String,
}

/// One thing an API key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub enum Scope {
    /// Create tasks, and drive the tasks the key's principal owns.
    #[serde(rename = "tasks")]
    Tasks,
    /// Register workers (`POST /api/v1/workers`).
    #[serde(rename = "workers:register")]
    RegisterWorkers,
    /// Create worker invites.
    #[serde(rename = "invites")]
    Invites,
    /// Everything: keys, workers, invites, the audit trail, any task.
    #[serde(rename = "operator")]
    Operator,
}

crate::names! {
    Scope {
        Tasks => "tasks",
        RegisterWorkers => "workers:register",
        Invites => "invites",
        Operator => "operator",
    }
}

/// The scopes of a key, a small set kept sorted and without repeats.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(from = "Vec<Scope>", into = "Vec<Scope>")]
pub struct Scopes(Vec<Scope>);

impl Scopes {
    pub fn new(scopes: impl IntoIterator<Item = Scope>) -> Self {
        let mut v: Vec<Scope> = scopes.into_iter().collect();
        v.sort();
        v.dedup();
        Scopes(v)
    }

    /// The scopes a new key of this kind gets when none are asked for.
    pub fn default_for(kind: PrincipalKind) -> Self {
        match kind {
            PrincipalKind::Operator => Scopes::new([Scope::Operator]),
            _ => Scopes::new([Scope::Tasks]),
        }
    }

    /// Whether a key with these scopes may do what `needed` allows. The
    /// operator scope allows everything.
    pub fn allow(&self, needed: Scope) -> bool {
        self.0.contains(&needed) || self.0.contains(&Scope::Operator)
    }

    pub fn iter(&self) -> impl Iterator<Item = Scope> + '_ {
        self.0.iter().copied()
    }

    /// The stored form: names separated by spaces.
    pub fn to_text(&self) -> String {
        self.0
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Reads the stored form; `None` names a scope this build does not know.
    pub fn from_text(s: &str) -> Option<Self> {
        s.split_whitespace()
            .map(Scope::parse)
            .collect::<Option<Vec<_>>>()
            .map(Scopes::new)
    }
}

impl From<Vec<Scope>> for Scopes {
    fn from(v: Vec<Scope>) -> Self {
        Scopes::new(v)
    }
}

impl From<Scopes> for Vec<Scope> {
    fn from(s: Scopes) -> Self {
        s.0
    }
}

/// Which credential did an agent-side action, as its events record it
/// (`data.by`): the task's token (whoever holds it: the agent or a
/// sub-agent it handed the task to), an API key, or the development key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(tag = "via", rename_all = "snake_case")]
pub enum ActedBy {
    AgentToken,
    ApiKey { principal_id: Uuid, key_id: Uuid },
    DevelopmentKey,
}

/// An API key as operators see it: never its secret or digest.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = KeyView))]
pub struct ApiKey {
    /// The id embedded in the key (`msk_<id>_…`).
    pub id: Uuid,
    pub name: String,
    /// Whom the key acts as.
    pub principal: PrincipalRef,
    pub scopes: Scopes,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    /// Coarse: written about once a minute.
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub rotated_at: Option<DateTime<Utc>>,
    /// Until then the secret the last rotation replaced still works.
    pub previous_valid_until: Option<DateTime<Utc>>,
}

/// One privileged action.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = AuditEntryView))]
pub struct AuditEntry {
    /// Ascending with time; the trail is append-only.
    pub id: i64,
    pub at: DateTime<Utc>,
    /// Who acted.
    pub principal: PrincipalRef,
    pub action: AuditAction,
    /// What was acted on: `key:<id>`, `worker:<id>`, `invite:<id>`, `task:<id>`, `route:<path>`.
    pub target: String,
    /// The client's address.
    pub address: Option<String>,
    pub detail: Option<serde_json::Value>,
}

/// A privileged action, as the audit trail names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub enum AuditAction {
    #[serde(rename = "key.created")]
    KeyCreated,
    #[serde(rename = "key.rotated")]
    KeyRotated,
    #[serde(rename = "key.revoked")]
    KeyRevoked,
    #[serde(rename = "worker.suspended")]
    WorkerSuspended,
    #[serde(rename = "worker.reinstated")]
    WorkerReinstated,
    #[serde(rename = "worker.token_rotated")]
    WorkerTokenRotated,
    #[serde(rename = "invite.created")]
    InviteCreated,
    #[serde(rename = "invite.revoked")]
    InviteRevoked,
    #[serde(rename = "task.cancelled_by_operator")]
    TaskCancelledByOperator,
    #[serde(rename = "worker.qualified")]
    WorkerQualified,
    #[serde(rename = "worker.unqualified")]
    WorkerUnqualified,
    #[serde(rename = "worker.blocked")]
    WorkerBlocked,
    #[serde(rename = "worker.unblocked")]
    WorkerUnblocked,
    /// The development key was presented while it is turned off.
    #[serde(rename = "dev_key.refused")]
    DevKeyRefused,
    /// An operator signed in to the console (with the key the entry names).
    #[serde(rename = "console.signed_in")]
    ConsoleSignedIn,
    #[serde(rename = "console.signed_out")]
    ConsoleSignedOut,
}

crate::names! {
    AuditAction {
        KeyCreated => "key.created",
        KeyRotated => "key.rotated",
        KeyRevoked => "key.revoked",
        WorkerSuspended => "worker.suspended",
        WorkerReinstated => "worker.reinstated",
        WorkerTokenRotated => "worker.token_rotated",
        InviteCreated => "invite.created",
        InviteRevoked => "invite.revoked",
        TaskCancelledByOperator => "task.cancelled_by_operator",
        DevKeyRefused => "dev_key.refused",
        WorkerQualified => "worker.qualified",
        WorkerUnqualified => "worker.unqualified",
        WorkerBlocked => "worker.blocked",
        WorkerUnblocked => "worker.unblocked",
        ConsoleSignedIn => "console.signed_in",
        ConsoleSignedOut => "console.signed_out",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invites_use_counts_before_its_revocation_and_both_before_its_expiry() {
        let t = |s| DateTime::from_timestamp(s, 0).unwrap();
        let open = Invite {
            id: Uuid::nil(),
            created_at: t(0),
            expires_at: t(100),
            used_at: None,
            revoked_at: None,
            created_by: Uuid::nil(),
        };
        let used = Invite {
            used_at: Some(t(10)),
            ..open.clone()
        };
        let revoked = Invite {
            revoked_at: Some(t(20)),
            ..open.clone()
        };
        let both = Invite {
            revoked_at: Some(t(20)),
            ..used.clone()
        };
        assert_eq!(open.state(t(99)), InviteState::Open);
        assert_eq!(open.state(t(100)), InviteState::Expired);
        assert_eq!(used.state(t(200)), InviteState::Used);
        assert_eq!(revoked.state(t(200)), InviteState::Revoked);
        assert_eq!(both.state(t(50)), InviteState::Used);
    }

    #[test]
    fn names_round_trip() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
            let json = serde_json::to_value(s).unwrap();
            assert_eq!(json, s.as_str());
        }
        for a in AuditAction::ALL {
            assert_eq!(AuditAction::parse(a.as_str()), Some(a));
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
        for k in [
            PrincipalKind::Operator,
            PrincipalKind::Agent,
            PrincipalKind::Worker,
            PrincipalKind::System,
        ] {
            assert_eq!(PrincipalKind::parse(k.as_str()), Some(k));
        }
    }

    #[test]
    fn scopes_keep_one_of_each_and_operator_allows_all() {
        let s = Scopes::new([Scope::Invites, Scope::Tasks, Scope::Tasks]);
        assert_eq!(s.to_text(), "tasks invites");
        assert_eq!(Scopes::from_text("invites tasks"), Some(s.clone()));
        assert_eq!(Scopes::from_text("tasks bogus"), None);
        assert!(s.allow(Scope::Tasks) && !s.allow(Scope::RegisterWorkers));
        let op = Scopes::default_for(PrincipalKind::Operator);
        assert!(Scope::ALL.iter().all(|&n| op.allow(n)));
        let agent = Scopes::default_for(PrincipalKind::Agent);
        assert!(agent.allow(Scope::Tasks) && !agent.allow(Scope::Operator));
    }
}

/// Where a worker invite link stands, as operators see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InviteState {
    /// It still signs a worker up.
    Open,
    /// A worker signed up with it.
    Used,
    /// An operator revoked it before it was used.
    Revoked,
    /// Its time ran out unused.
    Expired,
}

crate::names! {
    InviteState {
        Open => "open",
        Used => "used",
        Revoked => "revoked",
        Expired => "expired",
    }
}

/// A one-time invite link to the worker web app, as operators see it:
/// never its link, whose code only the person invited holds.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = InviteView))]
pub struct Invite {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// When a worker signed up with it; an invite works once.
    pub used_at: Option<DateTime<Utc>>,
    /// When an operator revoked it; a revoked invite signs no one up.
    pub revoked_at: Option<DateTime<Utc>>,
    /// The principal whose key created it.
    pub created_by: Uuid,
}

impl Invite {
    /// Where the invite stands at `now`: a use is what counts most, then a
    /// revocation, then the expiry.
    pub fn state(&self, now: DateTime<Utc>) -> InviteState {
        if self.used_at.is_some() {
            InviteState::Used
        } else if self.revoked_at.is_some() {
            InviteState::Revoked
        } else if self.expires_at <= now {
            InviteState::Expired
        } else {
            InviteState::Open
        }
    }
}
