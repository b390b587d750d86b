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

/// A call to the route `suffix` of worker `id`, as the client's principal.
fn worker_call(method: Method, id: Uuid, suffix: &str) -> Call<'static> {
    Call::new(
        method,
        format!("/api/v1/workers/{id}{suffix}"),
        Auth::Principal,
    )
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
        let call = worker_call(Method::POST, id, "/suspend").body(Body::json(&body)?);
        self.client.json(call).await
    }

    /// Lets a suspended worker work again (with its existing token).
    pub async fn reinstate(&self, id: Uuid) -> Result<Worker, Error> {
        self.client
            .json(worker_call(Method::POST, id, "/reinstate"))
            .await
    }

    /// The worker's qualifications, lapsed ones included.
    pub async fn qualifications(&self, id: Uuid) -> Result<QualificationList, Error> {
        self.client
            .json(worker_call(Method::GET, id, "/qualifications"))
            .await
    }

    /// Grants the worker a qualification (or replaces its value and expiry).
    pub async fn qualify(
        &self,
        id: Uuid,
        name: &str,
        grant: &Grant,
    ) -> Result<Qualification, Error> {
        let call = worker_call(Method::PUT, id, &format!("/qualifications/{name}"))
            .body(Body::json(grant)?);
        self.client.json(call).await
    }

    /// Revokes a qualification; a task the worker holds stays its own.
    pub async fn unqualify(&self, id: Uuid, name: &str) -> Result<QualificationList, Error> {
        let call = worker_call(Method::DELETE, id, &format!("/qualifications/{name}"));
        self.client.json(call).await
    }

    /// A new token for the worker; the old one stops working at once.
    pub async fn rotate(&self, id: Uuid) -> Result<RotatedWorker, Error> {
        self.client
            .json(worker_call(Method::POST, id, "/rotate"))
            .await
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
