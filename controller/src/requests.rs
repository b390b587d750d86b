//! Requested tasks: an agent in the cluster applies a `MeatspaceTask` with
//! `spec.origin: Requested`, and this reconciler makes it real and keeps it
//! current.
//!
//! For each requested resource, level-triggered (fetch → decide → apply →
//! write status, like the mirror):
//!
//! 1. **Create the task, once.** The resource's UID keys a row of the
//!    store's `task_requests` table, written in the transaction that creates
//!    the task, so a restart or a racing replica never makes a second task.
//!    The agent token is generated before the task and kept in a Secret
//!    owned by the resource (`<name>-agent-token`, key `token`, with the
//!    task id under `task-id`); creating that Secret is atomic in the
//!    apiserver, so whichever replica gets there first fixes the task's id
//!    and token, and a retry after a crash finds them again. The store keeps
//!    only the token's digest; the token appears in no resource, log or
//!    error.
//! 2. **Apply the spec**: `publish`, each new entry of `responses` (the
//!    store's issues are the durable record of what was answered, so an
//!    answer is applied once even across restarts, and acknowledged in the
//!    status), `expiresAt` later than the task's end (an extension), and
//!    `cancel`.
//! 3. **Write the status** like a mirrored task's, plus the open issues,
//!    the acknowledgements, the Secret's name and the Created and
//!    SpecApplied conditions, and record Kubernetes Events for new worker
//!    issues and the terminal transition (when allowed to).
//!
//! A finalizer cancels a task that is not terminal when its resource is
//! deleted, and deletes the Secret (its owner reference lets the garbage
//! collector do so too). Work arrives from the watch, from the store's
//! change stream (mapped from task id to resource), and from a periodic
//! requeue of live tasks as a safety net. Runs only where the mirror runs:
//! in the replica holding the Lease.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, Event as Finalize};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use meatspace_crds::{
    CONDITION_CREATED, CONDITION_SPEC_APPLIED, FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL,
    MeatspaceTask, MeatspaceTaskStatus, OpenIssue, Origin, ResponseAction, ResponseResult,
    ResponseStatus, VerdictAction, condition,
};
use meatspace_domain::clock::Clock;
use meatspace_domain::{
    Command, Extension, Issue, IssueAction, IssueStatus, Policy, Refusal, Task, TaskState, Verdict,
};
use meatspace_store::token::{self, TokenHash};
use meatspace_store::{Change, Store, StoreError};
use meatspace_store::{NewTask, requests::TaskRequest};
use serde_json::json;
use uuid::Uuid;

use crate::Error;
use crate::error::kube_call;

/// Finalizer of requested resources: the task is cancelled before the
/// resource goes.
pub const FINALIZER: &str = "meatspace.dev/cancel-task";
/// Label on each token Secret: the UID of the resource it belongs to.
pub const RESOURCE_UID_LABEL: &str = "meatspace.dev/resource-uid";
/// Key of the agent token in the Secret.
pub const TOKEN_KEY: &str = "token";
/// Key of the task id in the Secret.
pub const TASK_ID_KEY: &str = "task-id";

/// How requested tasks are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSettings {
    /// Lifetimes: the default, and the bounds a resource's
    /// `lifetimeSeconds` must keep (the API server's policy).
    pub policy: Policy,
    /// Record Kubernetes Events on the resources (needs the Events RBAC).
    pub events: bool,
    /// How often a live task's resource is reconciled even when nothing
    /// was heard of it (a safety net; changes arrive as they happen).
    pub resync_interval: Duration,
}

/// What the reconcile closures share.
struct Context {
    store: Arc<dyn Store>,
    client: kube::Client,
    namespace: String,
    settings: RequestSettings,
    /// Where the time is read (the controller's clock).
    clock: Clock,
    recorder: Option<Recorder>,
    /// Task id → its resource, for routing the store's changes; filled by
    /// every reconcile that knows the task (before it writes anything).
    resources: Mutex<HashMap<Uuid, ObjectRef<MeatspaceTask>>>,
}

/// Reconcile errors: the controller's, or the finalizer helper's.
#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error(transparent)]
    Controller(#[from] Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl ReconcileError {
    fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Controller(e) => e.metric_label(),
            ReconcileError::Finalizer(_) => "finalizer",
        }
    }
}

/// Reconciles requested resources in `namespace` until cancelled.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    client: kube::Client,
    namespace: String,
    settings: RequestSettings,
    clock: Clock,
    identity: String,
) {
    let api: Api<MeatspaceTask> = Api::namespaced(client.clone(), &namespace);
    let recorder = settings.events.then(|| {
        Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.to_owned(),
                instance: Some(identity),
            },
        )
    });
    let ctx = Arc::new(Context {
        store: store.clone(),
        client,
        namespace: namespace.clone(),
        settings,
        clock,
        recorder,
        resources: Mutex::default(),
    });
    // The store's changes, routed to the resource of the task; a gap (lost
    // notifications) reconciles every resource.
    let (mut refs_tx, refs_rx) = mpsc::channel::<ObjectRef<MeatspaceTask>>(1024);
    let (mut gaps_tx, gaps_rx) = mpsc::channel::<()>(1);
    let follower = {
        let ctx = ctx.clone();
        async move {
            let mut backoff = crate::backoff::Backoff::default();
            loop {
                match ctx.store.changes().await {
                    Ok(mut changes) => {
                        backoff.reset();
                        // Changes before the subscription are unknown.
                        let _ = gaps_tx.try_send(());
                        while let Some(change) = changes.next().await {
                            match change {
                                Change::Task(id) => {
                                    let found = ctx
                                        .resources
                                        .lock()
                                        .unwrap_or_else(PoisonError::into_inner)
                                        .get(&id)
                                        .cloned();
                                    if let Some(r) = found {
                                        let _ = refs_tx.send(r).await;
                                    }
                                }
                                Change::Gap => {
                                    let _ = gaps_tx.try_send(());
                                }
                                // Credentials are the API servers' concern.
                                Change::Credential(_) => {}
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %Error::from(e), "requests cannot follow task changes; retrying")
                    }
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    };
    // Mirrored resources carry the managed-by label; the rest may be requests.
    let selector = format!("{MANAGED_BY_LABEL}!={MANAGED_BY}");
    let controller = Controller::new(api, watcher::Config::default().labels(&selector))
        .reconcile_on(refs_rx)
        .reconcile_all_on(gaps_rx)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    tracing::info!(%namespace, "reconciling requested tasks");
    tokio::select! {
        () = controller => tracing::warn!("the requests controller ended"),
        () = follower => {}
    }
}

fn error_policy(_obj: Arc<MeatspaceTask>, e: &ReconcileError, _ctx: Arc<Context>) -> Action {
    crate::metrics::failed("requests", e.metric_label());
    tracing::warn!(error = %e, "reconciling a requested task failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile(obj: Arc<MeatspaceTask>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    // A resource without the label that is not a request is none of ours.
    if obj.spec.origin != Origin::Requested {
        return Ok(Action::await_change());
    }
    let api: Api<MeatspaceTask> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    finalizer::finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Finalize::Apply(obj) => apply(&obj, &ctx).await,
            Finalize::Cleanup(obj) => cleanup(&obj, &ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

/// The resource is being deleted: cancels its task unless it has ended (or
/// is gone), and deletes its token Secret.
#[tracing::instrument(skip_all, fields(name = %obj.name_any()))]
async fn cleanup(obj: &MeatspaceTask, ctx: &Context) -> Result<Action, Error> {
    let uid = obj.uid().unwrap_or_default();
    if let Some(request) = ctx.store.task_request(&uid).await? {
        match ctx
            .store
            .apply(
                request.task_id,
                Command::Cancel {
                    reason: Some("the MeatspaceTask resource was deleted".to_owned()),
                },
                ctx.clock.now(),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(task_id = %request.task_id, "cancelled the task of a deleted resource")
            }
            // Already terminal, or removed by retention: nothing to cancel.
            Err(StoreError::Refused(_) | StoreError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        ctx.resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&request.task_id);
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let name = secret_name(&obj.name_any(), &uid);
    if let Some(secret) = kube_call("get secret", secrets.get_opt(&name)).await?
        && owned_by(&secret, &uid)
    {
        match kube_call(
            "delete secret",
            secrets.delete(&name, &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => {}
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Action::await_change())
}

/// Why a resource has no task.
struct NotCreated {
    reason: &'static str,
    message: String,
}

#[tracing::instrument(skip_all, fields(name = %obj.name_any()))]
async fn apply(obj: &MeatspaceTask, ctx: &Context) -> Result<Action, Error> {
    let uid = obj.uid().unwrap_or_default();
    let secret_name = secret_name(&obj.name_any(), &uid);
    let task_id = match ctx.store.task_request(&uid).await? {
        Some(request) => request.task_id,
        None => match create(obj, &uid, &secret_name, ctx).await? {
            Ok(id) => id,
            Err(not_created) => {
                let mut status = obj.status.clone().unwrap_or_else(empty_status);
                status.observed_generation = obj.metadata.generation;
                set_condition(
                    &mut status.conditions,
                    condition(
                        CONDITION_CREATED,
                        false,
                        not_created.reason,
                        not_created.message,
                        ctx.clock.now(),
                    ),
                );
                write_status(obj, status, ctx).await?;
                return Ok(Action::await_change());
            }
        },
    };
    ctx.resources
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(task_id, ObjectRef::from_obj(obj));
    let Some(task) = ctx.store.task(task_id).await? else {
        // Removed by retention: the resource keeps its last status.
        return Ok(Action::await_change());
    };
    let previous = obj.status.clone().unwrap_or_else(empty_status);
    let (task, acks, problem) = drive(obj, task, &previous.responses, ctx).await?;

    let mut status = meatspace_crds::status(&task);
    status.observed_generation = obj.metadata.generation;
    status.token_secret_name = Some(secret_name);
    status.responses = acks;
    let show_worker_text = obj.spec.show_untrusted_worker_text == Some(true);
    status.issues = open_issues(&task, show_worker_text, ctx).await?;
    if show_worker_text {
        status.untrusted_result = task.result.clone();
    }
    let mut conditions = previous.conditions.clone();
    for c in status.conditions.drain(..) {
        set_condition(&mut conditions, c);
    }
    set_condition(
        &mut conditions,
        condition(
            CONDITION_CREATED,
            true,
            "Created",
            format!("The controller created task {}.", task.id),
            task.created_at,
        ),
    );
    let (applied, reason, message) = match problem {
        None => (
            true,
            "Applied",
            "Every field of the spec is applied to the task.".to_owned(),
        ),
        Some((reason, message)) => (false, reason, message),
    };
    set_condition(
        &mut conditions,
        condition(
            CONDITION_SPEC_APPLIED,
            applied,
            reason,
            message,
            ctx.clock.now(),
        ),
    );
    status.conditions = conditions;
    record_events(obj, &previous, &status, ctx).await;
    write_status(obj, status, ctx).await?;
    Ok(if task.state.is_terminal() {
        Action::await_change()
    } else {
        Action::requeue(ctx.settings.resync_interval)
    })
}

/// Creates the Secret (if no earlier attempt did) and the task, once.
/// Returns the id of the resource's task, or why there is none.
async fn create(
    obj: &MeatspaceTask,
    uid: &str,
    secret_name: &str,
    ctx: &Context,
) -> Result<Result<Uuid, NotCreated>, Error> {
    let lifetime = match ctx.settings.policy.lifetime(obj.spec.lifetime_seconds) {
        Ok(lifetime) => lifetime,
        Err((min, max)) => {
            return Ok(Err(NotCreated {
                reason: "InvalidLifetime",
                message: format!(
                    "spec.lifetimeSeconds must be between {min} and {max} on this server"
                ),
            }));
        }
    };
    let location = match &obj.spec.location {
        None => None,
        Some(l) => match meatspace_domain::Location::new(
            l.latitude,
            l.longitude,
            l.radius_m.map(|r| u32::try_from(r).unwrap_or(0)),
            l.address.clone(),
        ) {
            Ok(location) => Some(location),
            Err(e) => {
                return Ok(Err(NotCreated {
                    reason: "InvalidLocation",
                    message: format!("spec.location: {e}"),
                }));
            }
        },
    };
    let result_schema = match &obj.spec.result_schema {
        None => None,
        Some(schema) => match meatspace_domain::result::ResultSchema::parse(schema) {
            Ok(parsed) => Some(parsed.as_json().clone()),
            Err(errors) => {
                let each: Vec<String> = errors
                    .iter()
                    .map(|e| format!("{}: {}", e.pointer, e.message))
                    .collect();
                return Ok(Err(NotCreated {
                    reason: "InvalidResultSchema",
                    message: format!(
                        "spec.resultSchema is outside the supported subset: {}",
                        each.join("; ")
                    ),
                }));
            }
        },
    };
    let review = match &obj.spec.review {
        None => None,
        Some(terms) => match meatspace_domain::Review::requested(
            // Negative values are outside the bounds too.
            terms
                .auto_accept_seconds
                .map(|s| u32::try_from(s).unwrap_or(0)),
        ) {
            Ok(review) => Some(review),
            Err((min, max)) => {
                return Ok(Err(NotCreated {
                    reason: "InvalidReview",
                    message: format!(
                        "spec.review.autoAcceptSeconds must be between {min} and {max}"
                    ),
                }));
            }
        },
    };
    let requirements = match obj
        .spec
        .requirements
        .iter()
        .map(meatspace_crds::TaskRequirement::domain)
        .collect::<Result<Vec<_>, _>>()
        .and_then(|rs| meatspace_domain::qualification::check_requirements(&rs).map(|()| rs))
    {
        Ok(requirements) => requirements,
        Err(message) => {
            return Ok(Err(NotCreated {
                reason: "InvalidRequirements",
                message: format!("spec.requirements: {message}"),
            }));
        }
    };
    let (task_id, agent_token) = match token_secret(obj, uid, secret_name, ctx).await? {
        Ok(pair) => pair,
        Err(not_created) => return Ok(Err(not_created)),
    };
    let now = ctx.clock.now();
    // The namespace is the agent: its tasks belong to its principal.
    let owner = meatspace_store::identity::namespace_principal(&ctx.namespace);
    ctx.store.ensure_principal(&owner, now).await?;
    let new = NewTask {
        id: task_id,
        description: obj.spec.description.clone(),
        agent_token_hash: TokenHash::of(&agent_token),
        created_at: now,
        expires_at: now + lifetime,
        owner_id: owner.id,
        location,
        presence: obj
            .spec
            .presence
            .map_or(meatspace_domain::Presence::None, |p| p.domain()),
        result_schema,
        review,
        requirements,
    };
    let request = TaskRequest {
        resource_uid: uid.to_owned(),
        task_id,
        namespace: ctx.namespace.clone(),
        name: obj.name_any(),
        created_at: now,
    };
    let row = ctx.store.create_requested_task(new, &request).await?;
    if row.task_id == task_id {
        tracing::info!(%task_id, "created the requested task");
    }
    Ok(Ok(row.task_id))
}

/// The task id and agent token the resource's Secret holds, creating the
/// Secret with fresh ones if it does not exist.
async fn token_secret(
    obj: &MeatspaceTask,
    uid: &str,
    name: &str,
    ctx: &Context,
) -> Result<Result<(Uuid, String), NotCreated>, Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    // Two rounds: another replica may create it between our get and create.
    for _ in 0..2 {
        if let Some(secret) = kube_call("get secret", secrets.get_opt(name)).await? {
            if !owned_by(&secret, uid) {
                return Ok(Err(NotCreated {
                    reason: "SecretConflict",
                    message: format!(
                        "Secret {name} exists and does not belong to this resource; delete it or rename the resource"
                    ),
                }));
            }
            let field = |key: &str| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .and_then(|v| String::from_utf8(v.0.clone()).ok())
            };
            return Ok(
                match (
                    field(TASK_ID_KEY).and_then(|s| Uuid::parse_str(&s).ok()),
                    field(TOKEN_KEY),
                ) {
                    (Some(id), Some(token)) => Ok((id, token)),
                    _ => Err(NotCreated {
                        reason: "SecretConflict",
                        message: format!(
                            "Secret {name} lacks the {TASK_ID_KEY} or {TOKEN_KEY} key"
                        ),
                    }),
                },
            );
        }
        let task_id = Uuid::new_v4();
        // The API server's format: the token names its task.
        let agent_token = token::generate_for(token::AGENT_PREFIX, task_id);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(ctx.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
                    (RESOURCE_UID_LABEL.to_owned(), uid.to_owned()),
                ])),
                owner_references: Some(vec![OwnerReference {
                    api_version: MeatspaceTask::api_version(&()).into_owned(),
                    kind: MeatspaceTask::kind(&()).into_owned(),
                    name: obj.name_any(),
                    uid: uid.to_owned(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".to_owned()),
            data: Some(BTreeMap::from([
                (
                    TOKEN_KEY.to_owned(),
                    ByteString(agent_token.clone().into_bytes()),
                ),
                (
                    TASK_ID_KEY.to_owned(),
                    ByteString(task_id.to_string().into_bytes()),
                ),
            ])),
            ..Secret::default()
        };
        match kube_call(
            "create secret",
            secrets.create(&PostParams::default(), &secret),
        )
        .await
        {
            Ok(_) => return Ok(Ok((task_id, agent_token))),
            // Someone else created it: read theirs.
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::KubeTimeout("create secret (conflicting writers)"))
}

/// Applies what the spec asks of the task. Returns the task after it, the
/// acknowledgement of every response, and the first refusal (as a reason
/// and message for the SpecApplied condition).
async fn drive(
    obj: &MeatspaceTask,
    mut task: Task,
    acked: &[ResponseStatus],
    ctx: &Context,
) -> Result<(Task, Vec<ResponseStatus>, Option<(&'static str, String)>), Error> {
    let store = &ctx.store;
    let spec = &obj.spec;
    let mut problem = None;
    if spec.publish == Some(true) && task.state == TaskState::Draft {
        match store
            .apply(task.id, Command::Publish, ctx.clock.now())
            .await
        {
            Ok(applied) => task = applied.task,
            Err(StoreError::Refused(r)) => problem = Some(("PublishRefused", r.to_string())),
            Err(e) => return Err(e.into()),
        }
    }
    let mut acks: Vec<ResponseStatus> = Vec::with_capacity(spec.responses.len());
    if !spec.responses.is_empty() {
        let mut issues = store.issues(task.id).await?;
        for response in &spec.responses {
            if let Some(done) = acked
                .iter()
                .find(|a| a.issue_event_id == response.issue_event_id)
            {
                acks.push(done.clone());
                continue;
            }
            let action = match response.action {
                ResponseAction::Clarify => IssueAction::Clarify,
                ResponseAction::Acknowledge => IssueAction::Acknowledge,
                ResponseAction::Cancel => IssueAction::Cancel,
            };
            let open = issues
                .iter()
                .any(|i| i.event_id == response.issue_event_id && i.status == IssueStatus::Open);
            let result = if open {
                let command = Command::RespondToIssue {
                    issue_event_id: response.issue_event_id,
                    action,
                    text: response.text.clone(),
                };
                match store.apply(task.id, command, ctx.clock.now()).await {
                    Ok(applied) => {
                        task = applied.task;
                        Ok(())
                    }
                    // Answered meanwhile: judged from the store below.
                    Err(StoreError::Refused(Refusal::IssueNotOpen(..))) => {
                        issues = store.issues(task.id).await?;
                        answered(&issues, response.issue_event_id, action)
                    }
                    Err(StoreError::Refused(r)) => Err(r.to_string()),
                    Err(e) => return Err(e.into()),
                }
            } else {
                answered(&issues, response.issue_event_id, action)
            };
            acks.push(match result {
                Ok(()) => ResponseStatus {
                    issue_event_id: response.issue_event_id,
                    result: ResponseResult::Accepted,
                    message: None,
                },
                Err(message) => ResponseStatus {
                    issue_event_id: response.issue_event_id,
                    result: ResponseResult::Refused,
                    message: Some(message),
                },
            });
        }
    }
    // The verdict on the submission that waits now, if the agent gave one;
    // verdicts on earlier submissions were applied when they waited.
    let waiting = task
        .review
        .as_ref()
        .filter(|r| r.is_waiting() && task.state == TaskState::Active)
        .map(|r| i32::try_from(r.revisions).unwrap_or(i32::MAX));
    if let Some(verdict) = waiting.and_then(|n| spec.verdicts.iter().find(|v| v.submission == n)) {
        let text = verdict.text.clone().unwrap_or_default();
        let verdict = match verdict.action {
            VerdictAction::Accept => Verdict::Accept,
            VerdictAction::Revise => Verdict::Revise { text },
            VerdictAction::Reject => Verdict::Reject { reason: text },
        };
        match store
            .apply(task.id, Command::Review(verdict), ctx.clock.now())
            .await
        {
            Ok(applied) => task = applied.task,
            Err(StoreError::Refused(r)) => {
                problem.get_or_insert(("VerdictRefused", r.to_string()));
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(until) = spec.expires_at
        && until > task.expires_at
        && !task.state.is_terminal()
    {
        match store
            .apply(
                task.id,
                Command::Extend(Extension::Until(until)),
                ctx.clock.now(),
            )
            .await
        {
            Ok(applied) => task = applied.task,
            Err(StoreError::Refused(r)) => {
                problem.get_or_insert(("ExtensionRefused", r.to_string()));
            }
            Err(e) => return Err(e.into()),
        }
    }
    if spec.cancel == Some(true) && !task.state.is_terminal() {
        let command = Command::Cancel {
            reason: Some("spec.cancel of the MeatspaceTask resource".to_owned()),
        };
        match store.apply(task.id, command, ctx.clock.now()).await {
            Ok(applied) => task = applied.task,
            // Ended meanwhile (e.g. completed): nothing left to cancel.
            Err(StoreError::Refused(_)) => {
                if let Some(now) = store.task(task.id).await? {
                    task = now;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((task, acks, problem))
}

/// The acknowledgement of an answer to an issue that is not open: the
/// store's record says whether that answer was applied (by an earlier
/// reconcile that did not get to write the status, or the same answer over
/// the API) or what happened instead.
fn answered(issues: &[Issue], event_id: i64, action: IssueAction) -> Result<(), String> {
    match issues.iter().find(|i| i.event_id == event_id) {
        None => Err(format!(
            "no worker issue with event id {event_id} exists on this task"
        )),
        Some(i) => match (i.status, i.resolution.as_deref()) {
            (IssueStatus::Resolved, Some(r)) if r == action.as_str() => Ok(()),
            (IssueStatus::Resolved, r) => Err(format!(
                "issue {event_id} was already answered ({})",
                r.unwrap_or("unknown")
            )),
            (IssueStatus::Closed, r) => Err(format!(
                "issue {event_id} was closed before an answer ({})",
                r.unwrap_or("the task ended")
            )),
            (IssueStatus::Open, _) => Err(format!("issue {event_id} is still open")),
        },
    }
}

/// The task's open issues, with the worker's text when the resource asked
/// for it.
async fn open_issues(task: &Task, with_text: bool, ctx: &Context) -> Result<Vec<OpenIssue>, Error> {
    if task.open_issues == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for issue in ctx.store.issues(task.id).await? {
        if issue.status != IssueStatus::Open {
            continue;
        }
        let untrusted_worker_text = if with_text {
            ctx.store
                .events(task.id, issue.event_id - 1, 1)
                .await?
                .into_iter()
                .find(|e| e.id == issue.event_id)
                .and_then(|e| {
                    e.data
                        .get("text")
                        .and_then(|t| t.as_str())
                        .map(str::to_owned)
                })
        } else {
            None
        };
        out.push(OpenIssue {
            event_id: issue.event_id,
            kind: issue.kind.as_str().to_owned(),
            untrusted_worker_text,
        });
    }
    Ok(out)
}

/// Records Kubernetes Events for what changed since the status the
/// resource had: new worker issues, the terminal transition. Advisory: a
/// failure (e.g. no Events RBAC) is logged and ignored.
async fn record_events(
    obj: &MeatspaceTask,
    before: &MeatspaceTaskStatus,
    after: &MeatspaceTaskStatus,
    ctx: &Context,
) {
    let Some(recorder) = &ctx.recorder else {
        return;
    };
    let mut events = Vec::new();
    for issue in &after.issues {
        if !before.issues.iter().any(|i| i.event_id == issue.event_id) {
            events.push(KubeEvent {
                type_: KubeEventType::Warning,
                reason: "WorkerIssue".into(),
                note: Some(format!(
                    "The worker raised an issue ({}), event id {}: answer it in spec.responses.",
                    issue.kind, issue.event_id
                )),
                action: "RaiseIssue".into(),
                secondary: None,
            });
        }
    }
    let ended = |s: &MeatspaceTaskStatus| s.state.is_some_and(|s| s.is_terminal());
    if ended(after) && !ended(before) {
        let state = after.state;
        events.push(KubeEvent {
            type_: if state == Some(TaskState::Completed) {
                KubeEventType::Normal
            } else {
                KubeEventType::Warning
            },
            reason: "Terminal".into(),
            note: Some(format!(
                "The task ended in state {}.",
                state.map_or("unknown", TaskState::as_str)
            )),
            action: "End".into(),
            secondary: None,
        });
    }
    let reference = obj.object_ref(&());
    for event in events {
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "cannot record a Kubernetes Event");
        }
    }
}

/// Writes the status with server-side apply, unless it is what the
/// resource already has.
async fn write_status(
    obj: &MeatspaceTask,
    status: MeatspaceTaskStatus,
    ctx: &Context,
) -> Result<(), Error> {
    if obj.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<MeatspaceTask> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let body = json!({
        "apiVersion": MeatspaceTask::api_version(&()),
        "kind": MeatspaceTask::kind(&()),
        "status": status,
    });
    kube_call(
        "apply status",
        api.patch_status(
            &obj.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        ),
    )
    .await?;
    Ok(())
}

/// Replaces the condition of the same type, keeping its transition time
/// when its status did not change (as Kubernetes conventions ask).
fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        }
        None => conditions.push(new),
    }
}

fn empty_status() -> MeatspaceTaskStatus {
    MeatspaceTaskStatus {
        state: None,
        task_id: None,
        expires_at: None,
        worker_id: None,
        created_at: None,
        published_at: None,
        assigned_at: None,
        started_at: None,
        ended_at: None,
        start_by: None,
        active_until: None,
        open_issues: 0,
        last_event_id: 0,
        observed_generation: None,
        conditions: Vec::new(),
        token_secret_name: None,
        issues: Vec::new(),
        responses: Vec::new(),
        review: None,
        untrusted_result: None,
    }
}

/// Name of the Secret holding a resource's agent token:
/// `<name>-agent-token`, or one made from the UID when that is too long.
pub fn secret_name(resource_name: &str, uid: &str) -> String {
    const SUFFIX: &str = "-agent-token";
    if resource_name.len() + SUFFIX.len() <= 253 {
        format!("{resource_name}{SUFFIX}")
    } else {
        format!("meatspace-task-{uid}{SUFFIX}")
    }
}

fn owned_by(secret: &Secret, uid: &str) -> bool {
    secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, TimeDelta, Utc};

    fn issue(event_id: i64, status: IssueStatus, resolution: Option<&str>) -> Issue {
        Issue {
            event_id,
            task_id: Uuid::nil(),
            kind: meatspace_domain::IssueKind::Other,
            status,
            resolution: resolution.map(str::to_owned),
            resolved_at: None,
        }
    }

    #[test]
    fn an_answer_found_in_the_store_is_accepted_once_not_applied_again() {
        let issues = [
            issue(3, IssueStatus::Resolved, Some("clarify")),
            issue(5, IssueStatus::Closed, Some("task_cancelled")),
        ];
        assert_eq!(answered(&issues, 3, IssueAction::Clarify), Ok(()));
        assert!(answered(&issues, 3, IssueAction::Acknowledge).is_err());
        assert!(answered(&issues, 5, IssueAction::Clarify).is_err());
        assert!(answered(&issues, 9, IssueAction::Clarify).is_err());
    }

    /// A Kubernetes object name (DNS-1123 subdomain): at most 253
    /// characters, lowercase letters, digits, '-' and '.', beginning and
    /// ending with a letter or digit.
    fn is_object_name(name: &str) -> bool {
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        !name.is_empty()
            && name.len() <= 253
            && name.chars().all(|c| alnum(c) || c == '-' || c == '.')
            && name.starts_with(alnum)
            && name.ends_with(alnum)
    }

    #[test]
    fn secret_names_are_valid_and_distinct() {
        const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        assert_eq!(secret_name("fetch-milk", UID), "fetch-milk-agent-token");
        // The name form while the suffix fits (up to 241 characters), the
        // UID form beyond, up to the longest name the apiserver allows.
        assert_eq!(secret_name(&"a".repeat(241), UID).len(), 253);
        assert_eq!(
            secret_name(&"a".repeat(242), UID),
            format!("meatspace-task-{UID}-agent-token")
        );
        // Resources of one namespace: each its own name and UID, short and
        // long names, some long ones sharing their first 241 characters.
        let mut resources = Vec::new();
        for (i, len) in [1, 63, 240, 241, 242, 250, 253].into_iter().enumerate() {
            for letter in ['a', 'b'] {
                let uid = Uuid::from_u128((i as u128) << 8 | letter as u128).to_string();
                resources.push((letter.to_string().repeat(len), uid));
            }
        }
        resources.push(("a".repeat(241) + "z", Uuid::from_u128(1000).to_string()));
        resources.push(("a".repeat(252) + "z", Uuid::from_u128(1001).to_string()));
        let mut seen = std::collections::BTreeMap::new();
        for (resource, uid) in &resources {
            let name = secret_name(resource, uid);
            assert!(
                is_object_name(&name),
                "{} characters: {name} is not a valid object name",
                resource.len()
            );
            assert_eq!(secret_name(resource, uid), name, "stable");
            if let Some(other) = seen.insert(name.clone(), resource) {
                panic!(
                    "resources of {} and {} characters share the Secret {name}",
                    other.len(),
                    resource.len()
                );
            }
        }
    }

    #[test]
    fn transition_times_stay_while_a_condition_holds() {
        let t0 = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let t1 = t0 + TimeDelta::seconds(60);
        let applied =
            |status, reason: &str, at| condition("SpecApplied", status, reason, String::new(), at);
        let mut conditions = vec![applied(true, "Applied", t0)];
        // At t1: the same status keeps the time of t0, another one takes t1.
        for (status, reason, since) in [(true, "Applied", t0), (false, "ExtensionRefused", t1)] {
            set_condition(&mut conditions, applied(status, reason, t1));
            assert_eq!(
                conditions[0].last_transition_time,
                applied(status, reason, since).last_transition_time,
                "{reason}"
            );
        }
    }
}
