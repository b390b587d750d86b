//! Requested tasks: a cluster-native agent applies a `MeatspaceTask` with
//! `spec.origin: Requested` and drives the task through the resource alone,
//! against the real kube-apiserver and PostgreSQL of the test command, with
//! the controller library in this process authenticated as the chart's
//! ServiceAccount (its Role plus the Secrets rule of
//! `controller.mirror.requests.enabled`), never as an admin.
//!
//! Checked: apply → Published → a worker drives the task over HTTP (an
//! issue, the agent's answer appended to `spec.responses`, completion) →
//! `kubectl wait --for=condition=Terminal` returns; the token Secret works
//! against the REST API and is readable by nobody else's Role; cancel
//! through the spec; delete while open (the finalizer cancels the task);
//! two replicas and a restart create exactly one task per resource; each
//! answer reaches the worker once across restarts (also one given over the
//! REST API meanwhile); the CEL rules refuse each bad edit. `apply_to_open_lag` prints the lag from an
//! apply to an open task (run it with `--nocapture`; no assertion on time).

mod controller_support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use meatspace_controller::ControllerConfig;
use meatspace_controller::kubernetes::MirrorSettings;
use meatspace_controller::requests::RequestSettings;
use meatspace_crds::MeatspaceTask;
use meatspace_domain::TaskState;
use meatspace_tests::Db;
use meatspace_tests::k8s::{
    ControllerIdentity, admin_client, create_namespace, drop_namespace, install_crd, kubectl,
    kubectl_as, requested_task_rules, service_account_with_rules, write_token_kubeconfig,
};
use meatspace_tests::server::{Expect, TestServer, str_at};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use controller_support::{InProcess, median_and_max};
use meatspace_tests::eventually;

/// Generous bound for anything the controller must do (a busy 2-core machine).
const PATIENCE: Duration = Duration::from_secs(60);

/// A namespace with the CRD, the controller's identity, and an API server.
struct Setup {
    admin: Client,
    ns: String,
    identity: ControllerIdentity,
    api: Api<MeatspaceTask>,
    server: TestServer,
}

impl Setup {
    async fn new(prefix: &str) -> Setup {
        meatspace_api::http::metrics::handle();
        let admin = admin_client().await;
        install_crd(&admin).await;
        let ns = create_namespace(&admin, prefix).await;
        let identity = ControllerIdentity::create_with(
            &admin,
            &ns,
            "meatspace-controller",
            requested_task_rules(),
        )
        .await;
        let api = Api::namespaced(admin.clone(), &ns);
        let server = TestServer::start(Db::Postgres).await;
        Setup {
            admin,
            ns,
            identity,
            api,
            server,
        }
    }

    /// The controller config of one replica (no Lease: replicas then race,
    /// which is what the exactly-once test wants).
    fn config(&self) -> ControllerConfig {
        ControllerConfig {
            mirror: Some(MirrorSettings {
                namespace: self.ns.clone(),
                kubeconfig: Some(self.identity.kubeconfig.clone()),
                resync_interval: Duration::from_secs(600),
                lease: None,
                requests: Some(RequestSettings {
                    policy: self.server.options.policy,
                    events: true,
                    resync_interval: Duration::from_secs(600),
                }),
            }),
            ..controller_support::config()
        }
    }

    fn controller(&self) -> InProcess {
        InProcess::start(&self.server.store, self.config())
    }

    /// Applies `spec` (merged into a requested resource) as the agent.
    async fn apply(&self, name: &str, spec: Value) {
        let mut full = json!({ "origin": "Requested" });
        for (k, v) in spec.as_object().expect("a spec object") {
            full[k] = v.clone();
        }
        let body = json!({
            "apiVersion": "meatspace.dev/v1alpha1",
            "kind": "MeatspaceTask",
            "metadata": { "name": name },
            "spec": full,
        });
        self.api
            .patch(name, &PatchParams::apply("agent"), &Patch::Apply(&body))
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    }

    /// Waits until the resource satisfies `check`, and returns it.
    /// [`Setup::apply`], then waits until the resource's task is published
    /// (Published=True) and returns the resource.
    async fn apply_until_published(&self, name: &str, spec: Value) -> MeatspaceTask {
        self.apply(name, spec).await;
        self.until(name, "Published", |m| {
            condition(m, "Published").is_some_and(|(status, _)| status == "True")
        })
        .await
    }

    async fn until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&MeatspaceTask) -> bool,
    ) -> MeatspaceTask {
        eventually(PATIENCE, &format!("{name}: {what}"), || async {
            self.api
                .get_opt(name)
                .await
                .expect("read the resource")
                .filter(|m| check(m))
        })
        .await
    }

    /// Deletes the resource `name` and waits until it is gone (`what`
    /// names the wait in a failure).
    async fn delete(&self, name: &str, what: &str) {
        self.api
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
        eventually(PATIENCE, what, || async {
            self.api
                .get_opt(name)
                .await
                .unwrap_or_else(|e| panic!("read {name}: {e}"))
                .is_none()
                .then_some(())
        })
        .await;
    }

    /// [`Setup::new`], with a controller running on it.
    async fn with_controller(prefix: &str) -> (Setup, InProcess) {
        let s = Setup::new(prefix).await;
        let controller = s.controller();
        (s, controller)
    }

    /// Stops `controller`, then [`Setup::finish`].
    async fn finish_with(self, controller: InProcess) {
        controller.stop().await;
        self.finish().await;
    }

    async fn finish(self) {
        drop_namespace(&self.admin, &self.ns).await;
        self.server.stop().await;
    }
}

fn condition(m: &MeatspaceTask, type_: &str) -> Option<(String, String)> {
    m.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn state(m: &MeatspaceTask) -> Option<TaskState> {
    m.status.as_ref()?.state
}

/// The status's acknowledged responses: (issue event id, result).
fn response_results(m: &MeatspaceTask) -> Vec<(i64, meatspace_crds::ResponseResult)> {
    m.status
        .as_ref()
        .expect("a status")
        .responses
        .iter()
        .map(|r| (r.issue_event_id, r.result))
        .collect()
}

fn task_id(m: &MeatspaceTask) -> Uuid {
    m.status
        .as_ref()
        .and_then(|s| s.task_id)
        .expect("status.taskId")
}

/// The agent token the resource's Secret holds.
async fn token(s: &Setup, m: &MeatspaceTask) -> String {
    let name = m
        .status
        .as_ref()
        .and_then(|s| s.token_secret_name.clone())
        .expect("status.tokenSecretName");
    let secret = Api::<Secret>::namespaced(s.admin.clone(), &s.ns)
        .get(&name)
        .await
        .expect("the token Secret exists");
    assert!(
        secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| Some(&o.uid) == m.metadata.uid.as_ref() && o.controller == Some(true)),
        "the Secret is owned by the resource: {:?}",
        secret.metadata.owner_references
    );
    let bytes = secret.data.expect("data")["token"].0.clone();
    String::from_utf8(bytes).expect("utf-8 token")
}

/// A requested task with a result schema and review: the worker submits
/// a typed result over HTTP; the resource shows the review waiting and the
/// result (with showUntrustedWorkerText); a revise verdict in spec.verdicts
/// reaches the worker, and an accept verdict on the second submission
/// completes the task. A schema outside the subset is refused at create
/// with a Created=False condition that names what is unsupported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_reviews_a_typed_result_through_the_resource() {
    let (s, controller) = Setup::with_controller("review").await;
    let schema = json!({ "type": "object", "required": ["open"],
        "properties": { "open": { "type": "boolean", "title": "Is the shop open?" } } });
    let spec = json!({
        "description": "Is the corner shop open?",
        "publish": true,
        "showUntrustedWorkerText": true,
        "resultSchema": schema,
        "review": { "autoAcceptSeconds": 3600 },
        "requirements": [{ "qualification": "level", "atLeast": 2 }],
    });
    let published = s.apply_until_published("shop-open", spec.clone()).await;
    let id = task_id(&published);
    let review_state = |m: &MeatspaceTask| {
        m.status
            .as_ref()
            .and_then(|st| st.review.as_ref())
            .map(|r| (r.state, r.revisions))
    };
    assert_eq!(
        review_state(&published),
        Some((meatspace_domain::ReviewState::AwaitingSubmission, 0))
    );

    let (worker_id, worker) = s.server.register_worker("Ola").await;
    // The requirement holds: the worker sees and claims the task.
    assert_eq!(
        s.server.task(id, &token(&s, &published).await).await["requirements"],
        json!([{ "qualification": "level", "at_least": 2 }])
    );
    s.server
        .worker(&worker)
        .post(&format!("/api/v1/worker/tasks/{id}/claim"))
        .expect_problem(StatusCode::NOT_FOUND)
        .await;
    s.server
        .dev(
            reqwest::Method::PUT,
            &format!("/api/v1/workers/{worker_id}/qualifications/level"),
        )
        .json(&json!({ "value": 3 }))
        .expect_json(StatusCode::OK)
        .await;
    for action in ["claim", "start"] {
        s.server.worker_post(id, &worker, action).await;
    }
    let submit = |open: bool| {
        s.server
            .worker(&worker)
            .post(&format!("/api/v1/worker/tasks/{id}/complete"))
            .json(&json!({ "result": { "open": open } }))
            .expect_json(StatusCode::OK)
    };
    submit(false).await;
    let waiting = s
        .until("shop-open", "the submission waits", |m| {
            review_state(m) == Some((meatspace_domain::ReviewState::Submitted, 0))
        })
        .await;
    let status = waiting.status.as_ref().expect("status");
    assert_eq!(status.untrusted_result, Some(json!({ "open": false })));
    assert!(
        status
            .review
            .as_ref()
            .expect("review")
            .auto_accept_at
            .is_some()
    );

    let mut with_verdicts = spec.clone();
    with_verdicts["verdicts"] =
        json!([{ "submission": 0, "action": "revise", "text": "Check the side door too." }]);
    s.apply("shop-open", with_verdicts.clone()).await;
    s.until("shop-open", "the revision is asked for", |m| {
        review_state(m) == Some((meatspace_domain::ReviewState::RevisionRequested, 1))
    })
    .await;
    submit(true).await;
    s.until("shop-open", "the second submission waits", |m| {
        review_state(m) == Some((meatspace_domain::ReviewState::Submitted, 1))
    })
    .await;
    with_verdicts["verdicts"] = json!([
        { "submission": 0, "action": "revise", "text": "Check the side door too." },
        { "submission": 1, "action": "accept" },
    ]);
    s.apply("shop-open", with_verdicts).await;
    let done = s
        .until("shop-open", "Completed", |m| {
            state(m) == Some(TaskState::Completed)
        })
        .await;
    assert_eq!(
        review_state(&done),
        Some((meatspace_domain::ReviewState::Accepted, 1))
    );
    assert_eq!(
        done.status
            .as_ref()
            .and_then(|st| st.untrusted_result.clone()),
        Some(json!({ "open": true }))
    );

    // A schema outside the subset: not created, and the condition says why.
    s.apply(
        "bad-schema",
        json!({ "description": "x", "resultSchema": { "type": "object",
            "properties": { "a": { "type": "string", "format": "email" } } } }),
    )
    .await;
    let refused = s
        .until("bad-schema", "Created=False", |m| {
            condition(m, "Created").is_some_and(|(status, _)| status == "False")
        })
        .await;
    let created = refused
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Created"))
        .expect("Created");
    assert_eq!(created.reason, "InvalidResultSchema");
    assert!(
        created.message.contains("/properties/a/format"),
        "{}",
        created.message
    );
    s.finish_with(controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_drives_a_requested_task_to_completion_through_the_resource() {
    let (s, controller) = Setup::with_controller("requested").await;
    let spec = json!({
        "description": "Buy a litre of milk at the corner shop.",
        "publish": true,
        "lifetimeSeconds": 7200,
        "showUntrustedWorkerText": true,
        "location": { "latitude": 51.5072, "longitude": -0.1276, "radiusM": 80,
                      "address": "Corner shop, Strand" },
        "presence": "flag",
    });
    let published = s.apply_until_published("fetch-milk", spec.clone()).await;
    let id = task_id(&published);
    assert_eq!(state(&published), Some(TaskState::Open));
    assert_eq!(
        condition(&published, "Created").map(|c| c.0).as_deref(),
        Some("True")
    );

    // The token in the Secret works against the REST API; nothing of it is
    // in the resource.
    let agent_token = token(&s, &published).await;
    let seen = s.server.task(id, &agent_token).await;
    assert_eq!(str_at(&seen, "/state"), "open", "{seen}");
    // The place the agent gave the resource is the task's.
    assert_eq!(
        seen["location"],
        json!({ "latitude": 51.5072, "longitude": -0.1276, "radius_m": 80,
                "address": "Corner shop, Strand" }),
        "{seen}"
    );
    assert_eq!(seen["presence"], "flag", "{seen}");
    let resource_text = serde_json::to_string(&published).unwrap();
    assert!(!resource_text.contains(&agent_token));

    // Nobody else's Role reads it: an agent allowed to manage MeatspaceTasks,
    // and a ServiceAccount with no Role at all.
    let agent_rules = vec![k8s_openapi::api::rbac::v1::PolicyRule {
        api_groups: Some(vec!["meatspace.dev".into()]),
        resources: Some(vec!["meatspacetasks".into()]),
        verbs: ["get", "list", "watch", "create", "patch", "delete"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    }];
    for (sa, rules) in [("agent", agent_rules), ("bystander", Vec::new())] {
        let t = service_account_with_rules(&s.admin, &s.ns, sa, rules).await;
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        write_token_kubeconfig(&kc, &s.ns, sa, &t);
        for verb in ["get", "list", "watch"] {
            let out = kubectl_as(&kc, &["auth", "can-i", verb, "secrets", "-n", &s.ns]);
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "no",
                "{sa} may not {verb} secrets"
            );
        }
    }

    // A worker claims, starts and raises an issue.
    let (_, worker_token) = s.server.claim_and_start(id).await;
    let worker = s.server.worker(&worker_token);
    s.server
        .raise_issue(
            id,
            &worker_token,
            "unclear_instructions",
            "Whole or skimmed?",
        )
        .await;
    let asked = s
        .until("fetch-milk", "the issue listed", |m| {
            m.status.as_ref().is_some_and(|st| st.issues.len() == 1)
        })
        .await;
    let issue = asked.status.as_ref().unwrap().issues[0].clone();
    assert_eq!(issue.kind, "unclear_instructions");
    assert_eq!(
        issue.untrusted_worker_text.as_deref(),
        Some("Whole or skimmed?")
    );
    assert_eq!(asked.status.as_ref().unwrap().open_issues, 1);

    // The agent answers by appending to spec.responses.
    let mut answered = spec.clone();
    answered["responses"] =
        json!([{ "issueEventId": issue.event_id, "action": "clarify", "text": "Whole." }]);
    s.apply("fetch-milk", answered).await;
    let answered = s
        .until("fetch-milk", "the answer acknowledged", |m| {
            m.status.as_ref().is_some_and(|st| {
                st.issues.is_empty()
                    && st.responses.len() == 1
                    && st.responses[0].result == meatspace_crds::ResponseResult::Accepted
            })
        })
        .await;
    assert_eq!(
        answered.status.as_ref().unwrap().responses[0].issue_event_id,
        issue.event_id
    );
    let feed = worker
        .get_json(&format!("/api/v1/worker/tasks/{id}/events?after=0"))
        .await;
    let answers: Vec<&Value> = feed["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "agent.issue_response")
        .collect();
    assert_eq!(answers.len(), 1, "the worker sees the answer once: {feed}");
    assert_eq!(answers[0]["data"]["text"], "Whole.");

    worker
        .post_json(
            &format!("/api/v1/worker/tasks/{id}/complete"),
            &json!({ "text": "Done." }),
        )
        .await;
    let ns = s.ns.clone();
    let waited = tokio::task::spawn_blocking(move || {
        kubectl(&[
            "wait",
            "--for=condition=Terminal",
            "mst/fetch-milk",
            "-n",
            &ns,
            "--timeout=60s",
        ])
    })
    .await
    .unwrap();
    assert!(waited.contains("condition met"), "{waited}");
    let done = s.api.get("fetch-milk").await.unwrap();
    assert_eq!(state(&done), Some(TaskState::Completed));
    assert_eq!(
        condition(&done, "Terminal"),
        Some(("True".into(), "Completed".into()))
    );
    assert_eq!(
        done.status.as_ref().unwrap().observed_generation,
        done.metadata.generation
    );

    // Kubernetes Events: the worker issue and the end.
    let listed = eventually(PATIENCE, "the Events", || async {
        let out = kubectl(&[
            "get",
            "events",
            "-n",
            &s.ns,
            "--field-selector",
            "involvedObject.name=fetch-milk",
            "-o",
            "jsonpath={.items[*].reason}",
        ]);
        (out.contains("WorkerIssue") && out.contains("Terminal")).then_some(out)
    })
    .await;
    assert!(!listed.contains(&agent_token));

    s.finish_with(controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_through_the_spec_and_delete_with_the_finalizer() {
    let (s, controller) = Setup::with_controller("requested-end").await;

    // spec.cancel on a draft.
    let spec = json!({ "description": "Water the plants on the balcony." });
    s.apply("plants", spec.clone()).await;
    let draft = s
        .until("plants", "created as a draft", |m| {
            state(m) == Some(TaskState::Draft)
        })
        .await;
    let plants = task_id(&draft);
    let mut cancelled = spec.clone();
    cancelled["cancel"] = json!(true);
    s.apply("plants", cancelled).await;
    s.until("plants", "cancelled", |m| {
        state(m) == Some(TaskState::Cancelled)
            && condition(m, "Terminal") == Some(("True".into(), "Cancelled".into()))
    })
    .await;
    assert_eq!(
        s.server.store.task(plants).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );

    // Deleting an open task's resource cancels it, then the resource and
    // its Secret go.
    s.apply(
        "walk-dog",
        json!({ "description": "Walk the dog around the block.", "publish": true }),
    )
    .await;
    let open = s
        .until("walk-dog", "open", |m| state(m) == Some(TaskState::Open))
        .await;
    assert!(
        open.finalizers()
            .iter()
            .any(|f| f == "meatspace.dev/cancel-task")
    );
    let walk = task_id(&open);
    let secret_name = open
        .status
        .as_ref()
        .unwrap()
        .token_secret_name
        .clone()
        .unwrap();
    s.delete("walk-dog", "the resource to go").await;
    assert_eq!(
        s.server.store.task(walk).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    let secrets = Api::<Secret>::namespaced(s.admin.clone(), &s.ns);
    assert!(secrets.get_opt(&secret_name).await.unwrap().is_none());

    // A terminal task's resource goes at once too.
    s.delete("plants", "the cancelled resource to go").await;

    s.finish_with(controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_and_a_restart_create_exactly_one_task_per_resource() {
    const N: usize = 8;
    let s = Setup::new("requested-once").await;
    // Two replicas without a Lease, each with its own connection pool:
    // both reconcile every resource, racing.
    let other_store = s.server.db.store(s.server.options.policy).await;
    let mut a = Some(s.controller());
    let b = InProcess::start(&other_store, s.config());
    for i in 0..N {
        s.apply(
            &format!("errand-{i}"),
            json!({ "description": format!("Errand number {i}."), "publish": true }),
        )
        .await;
        if i == N / 2 {
            // A restart mid-way.
            a.take().expect("running").stop().await;
        }
    }
    let a = s.controller();
    let mut ids = Vec::new();
    for i in 0..N {
        let m = s
            .until(&format!("errand-{i}"), "open", |m| {
                state(m) == Some(TaskState::Open)
            })
            .await;
        let request = s
            .server
            .store
            .task_request(&m.uid().unwrap())
            .await
            .unwrap()
            .expect("a request row");
        assert_eq!(request.task_id, task_id(&m));
        ids.push(task_id(&m));
    }
    // Exactly one task per resource, and no other.
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = s.server.store.tasks_after(after, 100).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        all.extend(page.into_iter().map(|t| t.id));
    }
    all.sort();
    ids.sort();
    assert_eq!(all, ids, "one task per resource");
    // And the mirror made no resource of its own for them.
    let labelled = s
        .api
        .list(
            &kube::api::ListParams::default()
                .labels("app.kubernetes.io/managed-by=meatspace-controller"),
        )
        .await
        .unwrap();
    assert!(labelled.items.is_empty(), "{:?}", labelled.items);

    a.stop().await;
    b.stop().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_apiserver_refuses_bad_edits() {
    let admin = admin_client().await;
    install_crd(&admin).await;
    let ns = create_namespace(&admin, "requested-cel").await;
    let api: Api<MeatspaceTask> = Api::namespaced(admin.clone(), &ns);
    let base = json!({
        "origin": "Requested",
        "description": "Buy stamps.",
        "lifetimeSeconds": 3600,
        "publish": true,
        "cancel": true,
        "expiresAt": "2040-01-01T00:00:00Z",
        "responses": [{ "issueEventId": 3, "action": "clarify", "text": "First class." }],
        "resultSchema": { "type": "object", "properties": { "n": { "type": "integer" } } },
        "review": { "autoAcceptSeconds": 600 },
        "verdicts": [{ "submission": 0, "action": "revise", "text": "Again." }],
    });
    let apply = |spec: Value| {
        let api = api.clone();
        async move {
            let body = json!({
                "apiVersion": "meatspace.dev/v1alpha1",
                "kind": "MeatspaceTask",
                "metadata": { "name": "stamps" },
                "spec": spec,
            });
            api.patch(
                "stamps",
                &PatchParams::apply("agent").force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
        }
    };
    apply(base.clone()).await.expect("a good resource");
    let with = |key: &str, value: Value| {
        let mut s = base.clone();
        match value {
            Value::Null => {
                s.as_object_mut().unwrap().remove(key);
            }
            v => s[key] = v,
        }
        s
    };
    let bad = [
        (
            with("description", json!("Buy envelopes.")),
            "spec.description is immutable",
        ),
        (
            with("lifetimeSeconds", json!(7200)),
            "spec.lifetimeSeconds is immutable",
        ),
        (with("cancel", json!(false)), "spec.cancel cannot be undone"),
        (
            with("publish", json!(false)),
            "spec.publish cannot be undone",
        ),
        (
            with("expiresAt", json!("2039-01-01T00:00:00Z")),
            "spec.expiresAt can only move later",
        ),
        (
            with("origin", json!("Mirrored")),
            "spec.origin is immutable",
        ),
        (
            with("taskId", json!(Uuid::new_v4())),
            "must not set spec.taskId",
        ),
        (
            with("responses", Value::Null),
            "spec.responses is append-only",
        ),
        (
            with("resultSchema", json!({ "type": "object" })),
            "spec.resultSchema is immutable",
        ),
        (
            with("review", json!({ "autoAcceptSeconds": 700 })),
            "spec.review is immutable",
        ),
        (
            with("verdicts", Value::Null),
            "spec.verdicts is append-only",
        ),
        (
            with("verdicts", json!([{ "submission": 0, "action": "accept" }])),
            "a verdict cannot be changed once given",
        ),
        (
            with(
                "verdicts",
                json!([{ "submission": 0, "action": "revise", "text": "Again." },
                       { "submission": 1, "action": "reject" }]),
            ),
            "text is required to revise or reject",
        ),
        (
            with(
                "responses",
                json!([{ "issueEventId": 3, "action": "clarify", "text": "Second class." }]),
            ),
            "a response cannot be changed once given",
        ),
        (
            with(
                "responses",
                json!([
                    { "issueEventId": 3, "action": "clarify", "text": "First class." },
                    { "issueEventId": 4, "action": "acknowledge" }
                ]),
            ),
            "text is required",
        ),
    ];
    for (spec, message) in bad {
        let refused = apply(spec.clone())
            .await
            .expect_err(&format!("refused: {spec}"));
        assert!(refused.contains(message), "{message:?} not in {refused:?}");
    }
    // Appending is fine, and so is a later expiry.
    let mut good = with("expiresAt", json!("2041-01-01T00:00:00Z"));
    good["responses"] = json!([
        { "issueEventId": 3, "action": "clarify", "text": "First class." },
        { "issueEventId": 4, "action": "cancel" }
    ]);
    apply(good)
        .await
        .expect("an append and an extension are allowed");

    // Bounds and kinds at creation.
    let create = |name: &'static str, spec: Value| {
        let api = api.clone();
        async move {
            let body = json!({
                "apiVersion": "meatspace.dev/v1alpha1",
                "kind": "MeatspaceTask",
                "metadata": { "name": name },
                "spec": spec,
            });
            api.patch(name, &PatchParams::apply("agent"), &Patch::Apply(&body))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    for (name, spec, message) in [
        (
            "short",
            json!({"origin": "Requested", "description": "x", "lifetimeSeconds": 0}),
            "greater than or equal to 1",
        ),
        (
            "long",
            json!({"origin": "Requested", "description": "x", "lifetimeSeconds": 2_592_001}),
            "less than or equal to 2592000",
        ),
        (
            "empty",
            json!({"origin": "Requested", "description": ""}),
            "at least 1 chars",
        ),
        (
            "mixed",
            json!({"origin": "Requested", "description": "x", "taskId": Uuid::new_v4()}),
            "must not set spec.taskId",
        ),
        (
            "unmarked",
            json!({"description": "x", "publish": true}),
            "fields of requested tasks",
        ),
    ] {
        let refused = create(name, spec).await.expect_err(name);
        assert!(
            refused.contains(message),
            "{name}: {message:?} not in {refused:?}"
        );
    }
    drop_namespace(&admin, &ns).await;
}

/// Each applied resource's task opens on the watch's word, not on the
/// resynchronisation (every 600 s here): 20 resources applied one after
/// another, each open well before a resync could have done it. The bound
/// tells the two apart; the figures are printed (`cargo test -p
/// meatspace-tests --test k8s_requested apply_to_open_lag -- --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_to_open_lag() {
    const N: usize = 20;
    let (s, controller) = Setup::with_controller("requested-lag").await;
    let mut lags = Vec::with_capacity(N);
    for i in 0..N {
        let name = format!("lag-{i}");
        let started = Instant::now();
        s.apply(
            &name,
            json!({ "description": format!("Errand {i}."), "publish": true }),
        )
        .await;
        let m = s
            .until(&name, "open", |m| state(m) == Some(TaskState::Open))
            .await;
        lags.push(started.elapsed().as_millis() as i64);
        assert_eq!(
            s.server
                .store
                .task(task_id(&m))
                .await
                .unwrap()
                .unwrap()
                .state,
            TaskState::Open
        );
    }
    let (median, worst) = median_and_max(&lags);
    println!(
        "apply → open task (status.state open), {N} resources one at a time, PostgreSQL: median {median} ms, worst {worst} ms"
    );
    let resync = s
        .config()
        .mirror
        .and_then(|m| m.requests)
        .map(|r| r.resync_interval)
        .expect("requests are on");
    assert!(
        u128::try_from(worst).unwrap_or(0) < resync.as_millis() / 10,
        "a task opened {worst} ms after its apply: the resync ({resync:?}), not the watch, did it"
    );
    s.finish_with(controller).await;
}

/// An answer is applied once, with the store as the record: one given over
/// the REST API while no controller runs is acknowledged, not sent again,
/// and a controller restart re-reads nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_answer_reaches_the_worker_once_across_restarts() {
    let (s, controller) = Setup::with_controller("requested-answers").await;
    let spec = json!({ "description": "Check the mailbox.", "publish": true });
    s.apply("mailbox", spec.clone()).await;
    let open = s
        .until("mailbox", "open", |m| state(m) == Some(TaskState::Open))
        .await;
    let id = task_id(&open);
    let agent_token = token(&s, &open).await;
    let (_, worker_token) = s.server.claim_and_start(id).await;
    for text in ["Which key?", "Which box?"] {
        s.server
            .raise_issue(id, &worker_token, "unclear_instructions", text)
            .await;
    }
    let asked = s
        .until("mailbox", "both issues listed", |m| {
            m.status.as_ref().is_some_and(|st| st.issues.len() == 2)
        })
        .await;
    let issues = asked.status.unwrap().issues;
    assert!(issues.iter().all(|i| i.untrusted_worker_text.is_none()));
    controller.stop().await;

    // With no controller running: the agent answers the first issue over
    // the API, and appends the same answer and one for the second issue.
    s.server
        .agent(&agent_token)
        .post(&format!(
            "/api/v1/tasks/{id}/issues/{}/respond",
            issues[0].event_id
        ))
        .json(&json!({ "action": "clarify", "text": "The small one." }))
        .expect_json(StatusCode::OK)
        .await;
    let mut answered = spec.clone();
    answered["responses"] = json!([
        { "issueEventId": issues[0].event_id, "action": "clarify", "text": "The small one." },
        { "issueEventId": issues[1].event_id, "action": "acknowledge", "text": "Fine." },
        { "issueEventId": 999_999, "action": "acknowledge", "text": "No such issue." },
    ]);
    s.apply("mailbox", answered).await;

    let controller = s.controller();
    let acked = s
        .until("mailbox", "three acknowledgements", |m| {
            m.status.as_ref().is_some_and(|st| st.responses.len() == 3)
        })
        .await;
    let results = response_results(&acked);
    use meatspace_crds::ResponseResult::{Accepted, Refused};
    assert_eq!(
        results,
        [
            (issues[0].event_id, Accepted),
            (issues[1].event_id, Accepted),
            (999_999, Refused)
        ]
    );
    // After a second restart the acknowledgements stay as they are. The
    // status already says so before the new controller does anything, so
    // wait until it has reconciled the resource: a third issue, raised now,
    // can only reach the status through a pass of the new controller, and
    // that pass applies the spec's responses before it writes the status.
    controller.stop().await;
    let controller = s.controller();
    let third = s
        .server
        .raise_issue(id, &worker_token, "unclear_instructions", "Which floor?")
        .await;
    let after_restart = s
        .until(
            "mailbox",
            "the third issue listed by the new controller",
            |m| {
                m.status
                    .as_ref()
                    .is_some_and(|st| st.issues.iter().any(|i| i.event_id == third))
            },
        )
        .await;
    let results_after = response_results(&after_restart);
    assert_eq!(
        results_after, results,
        "the acknowledgements changed across the restart"
    );
    let feed = s.server.feed(id, &agent_token).await;
    let answers = feed
        .iter()
        .filter(|e| e["type"] == "agent.issue_response")
        .count();
    assert_eq!(answers, 2, "each issue answered once: {feed:?}");
    s.finish_with(controller).await;
}
