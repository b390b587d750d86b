//! The store's writes that the engine decides (commands, creates,
//! reconciles, redemptions, suspensions): one source for both backends,
//! compiled by each over its `dialect` module like `identity.rs` (see
//! there). [`d::engine`] runs an engine operation where the backend runs
//! its writes: on PostgreSQL the store itself is the engine's backend; on
//! SQLite the writer's connection is, in an inline job.

use chrono::{DateTime, Utc};
use meatspace_domain::Command;
use meatspace_domain::identity::ActedBy;
use meatspace_store::engine;
use meatspace_store::idempotency::{IdempotencyBegin, IdempotencyClaim};
use meatspace_store::requests::TaskRequest;
use meatspace_store::token::TokenHash;
use meatspace_store::{Applied, EngineWrites, NewAudit, NewTask, StoreError, Worker};
use uuid::Uuid;

use crate::dialect as d;

#[async_trait::async_trait]
impl EngineWrites for d::Store {
    #[tracing::instrument(level = "debug", skip(self, command), fields(command = command.name()), err(level = "debug"))]
    async fn apply(
        &self,
        task_id: Uuid,
        command: Command,
        now: DateTime<Utc>,
    ) -> Result<Applied, StoreError> {
        d::engine(self, move |b, policy| {
            Box::pin(engine::apply(b, task_id, command, None, now, policy))
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip(self, command), fields(command = command.name()), err(level = "debug"))]
    async fn apply_by(
        &self,
        task_id: Uuid,
        command: Command,
        by: ActedBy,
        now: DateTime<Utc>,
    ) -> Result<Applied, StoreError> {
        d::engine(self, move |b, policy| {
            Box::pin(engine::apply(b, task_id, command, Some(by), now, policy))
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip(self, command, audit), fields(command = command.name()), err(level = "debug"))]
    async fn apply_audited(
        &self,
        task_id: Uuid,
        command: Command,
        by: ActedBy,
        audit: NewAudit,
    ) -> Result<Applied, StoreError> {
        d::engine(self, move |b, policy| {
            Box::pin(
                async move { engine::apply_audited(b, task_id, command, by, &audit, policy).await },
            )
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip(self, token_hash), err)]
    async fn create_worker(
        &self,
        id: Uuid,
        name: &str,
        token_hash: TokenHash,
        now: DateTime<Utc>,
    ) -> Result<Worker, StoreError> {
        let worker = Worker {
            id,
            name: name.to_owned(),
            created_at: now,
            suspended_at: None,
        };
        d::engine(self, move |b, _| {
            Box::pin(async move { engine::create_worker(b, worker, &token_hash).await })
        })
        .await
    }

    async fn create_task_with_webhook(
        &self,
        new: NewTask,
        webhook_url: &str,
    ) -> Result<meatspace_domain::Task, StoreError> {
        let url = webhook_url.to_owned();
        d::engine(self, move |b, _| {
            Box::pin(async move { engine::create_task(b, new, Some(&url)).await })
        })
        .await
    }

    async fn idempotency_begin(
        &self,
        claim: &IdempotencyClaim,
    ) -> Result<IdempotencyBegin, StoreError> {
        let claim = claim.clone();
        d::engine(self, move |b, _| {
            Box::pin(async move { engine::idempotency_begin(b, &claim).await })
        })
        .await
    }

    async fn reconcile_due(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Applied>, StoreError> {
        d::engine(self, move |b, policy| {
            Box::pin(engine::reconcile_due(b, now, limit, policy))
        })
        .await
    }

    async fn redeem_invite(
        &self,
        invite_id: Uuid,
        worker_id: Uuid,
        name: &str,
        token_hash: TokenHash,
        now: DateTime<Utc>,
    ) -> Result<Option<Worker>, StoreError> {
        let worker = Worker {
            id: worker_id,
            name: name.to_owned(),
            created_at: now,
            suspended_at: None,
        };
        d::engine(self, move |b, _| {
            Box::pin(async move { engine::redeem_invite(b, invite_id, worker, &token_hash).await })
        })
        .await
    }

    async fn create_requested_task(
        &self,
        new: NewTask,
        request: &TaskRequest,
    ) -> Result<TaskRequest, StoreError> {
        let request = request.clone();
        d::engine(self, move |b, _| {
            Box::pin(async move { engine::create_requested_task(b, new, &request).await })
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip(self, audit), err)]
    async fn suspend_worker(
        &self,
        id: Uuid,
        audit: NewAudit,
    ) -> Result<Option<Worker>, StoreError> {
        d::engine(self, move |b, policy| {
            Box::pin(async move { engine::suspend_worker(b, id, &audit, policy).await })
        })
        .await
    }
}
