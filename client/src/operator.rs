//! What an operator does to workers and invites: [`WorkersAdmin`] lists,
//! suspends, reinstates and rotates the token of registered workers;
//! [`Invites`] lists and revokes invites. Both need scope `operator`.

use reqwest::Method;
use uuid::Uuid;

use crate::error::Error;
use crate::http::{Auth, Body, Call, Client};
use crate::types::{
    Grant, Invite, InvitePage, Qualification, QualificationList, RotatedWorker, Suspend, Worker,
    WorkerPage,
};

/// The registered workers, as an operator manages them.
#[derive(Debug, Clone)]
pub struct WorkersAdmin {
    client: Client,
}

impl WorkersAdmin {
    pub(crate) fn new(client: Client) -> Self {
        WorkersAdmin { client }
    }

    /// One page of workers (`cursor`: the previous page's `next_cursor`).
    pub async fn list(
        &self,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<WorkerPage, Error> {
        let mut call = Call::new(Method::GET, "/api/v1/workers".into(), Auth::Principal);
        call.page(cursor, limit);
        self.client.json(call).await
    }

    /// Suspends the worker: its token and sessions are refused, and the
    /// task it holds reopens for another worker.
    pub async fn suspend(&self, id: Uuid, reason: Option<&str>) -> Result<Worker, Error> {
        let body = Suspend {
            reason: reason.map(str::to_owned),
        };
        let call = Call::new(
            Method::POST,
            format!("/api/v1/workers/{id}/suspend"),
            Auth::Principal,
        )
        .body(Body::json(&body)?);
        self.client.json(call).await
    }

    /// Lets a suspended worker work again (with its existing token).
    pub async fn reinstate(&self, id: Uuid) -> Result<Worker, Error> {
        let call = Call::new(
            Method::POST,
            format!("/api/v1/workers/{id}/reinstate"),
            Auth::Principal,
        );
        self.client.json(call).await
    }

    /// The worker's qualifications, lapsed ones included.
    pub async fn qualifications(&self, id: Uuid) -> Result<QualificationList, Error> {
        let call = Call::new(
            Method::GET,
            format!("/api/v1/workers/{id}/qualifications"),
            Auth::Principal,
        );
        self.client.json(call).await
    }

    /// Grants the worker a qualification (or replaces its value and expiry).
    pub async fn qualify(
        &self,
        id: Uuid,
        name: &str,
        grant: &Grant,
    ) -> Result<Qualification, Error> {
        let call = Call::new(
            Method::PUT,
            format!("/api/v1/workers/{id}/qualifications/{name}"),
            Auth::Principal,
        )
        .body(Body::json(grant)?);
        self.client.json(call).await
    }

    /// Revokes a qualification; a task the worker holds stays its own.
    pub async fn unqualify(&self, id: Uuid, name: &str) -> Result<QualificationList, Error> {
        let call = Call::new(
            Method::DELETE,
            format!("/api/v1/workers/{id}/qualifications/{name}"),
            Auth::Principal,
        );
        self.client.json(call).await
    }

    /// A new token for the worker; the old one stops working at once.
    pub async fn rotate(&self, id: Uuid) -> Result<RotatedWorker, Error> {
        let call = Call::new(
            Method::POST,
            format!("/api/v1/workers/{id}/rotate"),
            Auth::Principal,
        );
        self.client.json(call).await
    }
}

/// The worker invites of the install.
#[derive(Debug, Clone)]
pub struct Invites {
    client: Client,
}

impl Invites {
    pub(crate) fn new(client: Client) -> Self {
        Invites { client }
    }

    /// One page of invites, each with who created it.
    pub async fn list(
        &self,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<InvitePage, Error> {
        let mut call = Call::new(
            Method::GET,
            "/api/v1/workers/invites".into(),
            Auth::Principal,
        );
        call.page(cursor, limit);
        self.client.json(call).await
    }

    /// Revokes an invite: its link no longer signs anyone in.
    pub async fn revoke(&self, id: Uuid) -> Result<Invite, Error> {
        let call = Call::new(
            Method::POST,
            format!("/api/v1/workers/invites/{id}/revoke"),
            Auth::Principal,
        );
        self.client.json(call).await
    }
}
