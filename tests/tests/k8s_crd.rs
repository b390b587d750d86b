//! The `MeatspaceTask` CRD against a real kube-apiserver: the checked-in
//! YAML installs and becomes Established, resources round-trip with every
//! optional field set and with every optional field unset (so pruning,
//! defaulting and schema mistakes show up), `kubectl get mst` shows the
//! printer columns, and the apiserver rejects what the schema forbids.
//!
//! The apiserver comes from `scripts/control-plane.sh` (the test command
//! starts one) and its admin kubeconfig from `MEATSPACE_TEST_KUBECONFIG`
//! (see `meatspace_tests::k8s`). A missing control plane is a test failure,
//! never a skip. Each test works in a namespace of its own with a random
//! name, so tests run in parallel and a second run on the same control plane
//! starts clean.

use chrono::{DateTime, Utc};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt, Resource, ResourceExt};
use meatspace_crds::{MeatspaceTask, MeatspaceTaskStatus, desired, resource_name};
use meatspace_domain::{Task, TaskState};
use meatspace_tests::k8s::{
    TEST_MANAGER, admin_client, create_namespace, drop_namespace, install_crd, kubectl,
};
use serde_json::{Value, json};
use uuid::Uuid;

/// Field manager of everything these tests write.
const MANAGER: &str = TEST_MANAGER;

async fn client() -> Client {
    admin_client().await
}

/// A namespace of this test alone, with the CRD installed: the admin's
/// client, the namespace and the API of its MeatspaceTasks.
async fn task_namespace() -> (Client, String, Api<MeatspaceTask>) {
    let client = client().await;
    install_crd(&client).await;
    let ns = create_namespace(&client, "mst").await;
    let api = Api::namespaced(client.clone(), &ns);
    (client, ns, api)
}

fn at(secs: i64, nanos: u32) -> DateTime<Utc> {
    DateTime::from_timestamp(1_900_000_000 + secs, nanos).expect("valid timestamp")
}

/// A draft as the store creates it: every optional field unset.
fn draft_task() -> Task {
    Task {
        id: Uuid::new_v4(),
        description: "Check whether the library at 12 Elm Street is open today.".into(),
        state: TaskState::Draft,
        worker_id: None,
        created_at: at(0, 0),
        updated_at: at(0, 0),
        published_at: None,
        assigned_at: None,
        started_at: None,
        ended_at: None,
        expires_at: at(86_400, 0),
        start_by: None,
        active_until: None,
        open_issues: 0,
        last_event_id: 0,
        location: None,
        presence: meatspace_domain::Presence::None,
        result_schema: None,
        review: None,
        result: None,
        requirements: Vec::new(),
    }
}

/// A completed task: every optional field of the task set, timestamps with
/// sub-second digits as the store keeps them, and the longest description
/// the API accepts, in characters that take two bytes each (the schema's
/// limit counts characters, like the API's).
fn completed_task() -> Task {
    Task {
        description: "ü".repeat(meatspace_domain::MAX_DESCRIPTION_CHARS),
        state: TaskState::Completed,
        worker_id: Some(Uuid::new_v4()),
        updated_at: at(3_000, 999_999_000),
        published_at: Some(at(10, 123_456_000)),
        assigned_at: Some(at(100, 500_000_000)),
        started_at: Some(at(300, 1_000)),
        ended_at: Some(at(3_000, 999_999_000)),
        start_by: Some(at(1_000, 500_000_000)),
        active_until: Some(at(3_900, 300_000_000)),
        open_issues: 3,
        last_event_id: 9_007_199_254_740_993, // above 2^53: must not pass through a float
        location: Some(
            meatspace_domain::Location::new(
                -33.868_812_345,
                151.209_312_345,
                Some(250),
                Some("Circular Quay, Sydney".into()),
            )
            .unwrap(),
        ),
        presence: meatspace_domain::Presence::Require,
        result_schema: Some(serde_json::json!({
            "type": "object", "additionalProperties": false, "required": ["open"],
            "properties": { "open": { "type": "boolean", "title": "Open?" } }
        })),
        requirements: vec![
            serde_json::from_value(serde_json::json!({ "qualification": "vehicle", "in": ["car", 3] }))
                .unwrap(),
            serde_json::from_value(
                serde_json::json!({ "qualification": "level", "at_least": 2, "at_most": 9_000_000_000i64 }),
            )
            .unwrap(),
        ],
        review: Some(meatspace_domain::Review {
            state: meatspace_domain::ReviewState::Accepted,
            revisions: 2,
            ..meatspace_domain::Review::new(600)
        }),
        ..draft_task()
    }
}

/// Writes `mst` the way the mirror does: the object with server-side apply,
/// then its status with server-side apply on the status subresource.
/// Returns the generation the apiserver gave the object.
async fn apply(api: &Api<MeatspaceTask>, mst: &MeatspaceTask) -> i64 {
    let name = mst.name_any();
    let object = MeatspaceTask {
        status: None,
        ..mst.clone()
    };
    let applied = api
        .patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&object))
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    if let Some(status) = &mst.status {
        let body = json!({
            "apiVersion": MeatspaceTask::api_version(&()),
            "kind": MeatspaceTask::kind(&()),
            "status": status,
        });
        api.patch_status(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&body))
            .await
            .unwrap_or_else(|e| panic!("apply status of {name}: {e}"));
    }
    applied
        .metadata
        .generation
        .expect("the apiserver sets a generation")
}

/// The object as the apiserver stores it, as raw JSON: a field that was
/// dropped, renamed, re-formatted or defaulted shows up here even when the
/// typed read would hide it.
async fn raw(client: &Client, ns: &str, name: &str) -> Value {
    let object = dynamic_api(client, ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("GET {ns}/{name}: {e}"));
    serde_json::to_value(object).expect("JSON")
}

/// The MeatspaceTask API without the types, to send what they cannot express.
fn dynamic_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::erase::<MeatspaceTask>(&()),
    )
}

#[tokio::test]
async fn crd_is_established_with_its_names_and_columns() {
    let client = client().await;
    let crd = install_crd(&client).await;
    let accepted = &crd
        .status
        .as_ref()
        .expect("status")
        .accepted_names
        .as_ref()
        .expect("names");
    assert_eq!(accepted.kind, "MeatspaceTask");
    assert_eq!(accepted.plural, "meatspacetasks");
    assert_eq!(
        accepted.short_names.as_deref(),
        Some(&["mst".to_owned()][..])
    );
    assert_eq!(
        accepted.categories.as_deref(),
        Some(&["meatspace".to_owned()][..])
    );

    // What the apiserver serves is what the types generate: nothing in the
    // schema or the columns was dropped or rewritten on the way in.
    let generated = MeatspaceTask::crd().spec;
    let mut names = crd.spec.names.clone();
    // The apiserver fills in listKind, which the generated CRD leaves out.
    assert_eq!(names.list_kind.take().as_deref(), Some("MeatspaceTaskList"));
    assert_eq!(names, generated.names);
    assert_eq!(crd.spec.scope, generated.scope);
    assert_eq!(
        serde_json::to_value(&crd.spec.versions).unwrap(),
        serde_json::to_value(&generated.versions).unwrap()
    );
}

#[tokio::test]
async fn resource_with_every_optional_field_set_reads_back_equal() {
    let (client, ns, api) = task_namespace().await;

    let mut mst = desired(&completed_task(), &ns);
    let generation = apply(&api, &mst).await;
    // The fields desired() leaves to the mirror, set too.
    let status = mst.status.as_mut().unwrap();
    status.observed_generation = Some(generation);
    for c in &mut status.conditions {
        c.observed_generation = Some(generation);
    }
    assert!(
        status_has_every_optional_field(status),
        "the fixture must set every optional field: {status:?}"
    );
    apply(&api, &mst).await;

    let back = api.get(&mst.name_any()).await.expect("read back");
    assert_eq!(back.spec, mst.spec);
    assert_eq!(back.status, mst.status);
    assert_eq!(back.labels(), mst.labels());

    let stored = raw(&client, &ns, &mst.name_any()).await;
    assert_eq!(stored["spec"], serde_json::to_value(&mst.spec).unwrap());
    assert_eq!(stored["status"], serde_json::to_value(&mst.status).unwrap());
    drop_namespace(&client, &ns).await;
}

fn status_has_every_optional_field(s: &MeatspaceTaskStatus) -> bool {
    let MeatspaceTaskStatus {
        state: _,
        worker_id,
        created_at: _,
        published_at,
        assigned_at,
        started_at,
        ended_at,
        start_by,
        active_until,
        open_issues: _,
        last_event_id: _,
        observed_generation,
        conditions,
        task_id: _,
        expires_at: _,
        token_secret_name: _,
        issues: _,
        responses: _,
        review,
        // Requested resources only (with showUntrustedWorkerText).
        untrusted_result: _,
    } = s;
    review.is_some()
        && worker_id.is_some()
        && published_at.is_some()
        && assigned_at.is_some()
        && started_at.is_some()
        && ended_at.is_some()
        && start_by.is_some()
        && active_until.is_some()
        && observed_generation.is_some()
        && !conditions.is_empty()
        && conditions
            .iter()
            .all(|c| c.observed_generation.is_some() && !c.message.is_empty())
}

#[tokio::test]
async fn resource_with_every_optional_field_unset_reads_back_equal() {
    let (client, ns, api) = task_namespace().await;

    let mut mst = desired(&draft_task(), &ns);
    mst.metadata.labels = None;
    let status = mst.status.as_mut().unwrap();
    status.conditions.clear();
    apply(&api, &mst).await;

    let back = api.get(&mst.name_any()).await.expect("read back");
    assert_eq!(back.spec, mst.spec);
    assert_eq!(back.status, mst.status);

    // Nothing defaulted: the stored status has exactly the required fields.
    let stored = raw(&client, &ns, &mst.name_any()).await;
    let task = draft_task();
    assert_eq!(
        stored["status"],
        json!({
            "state": "draft",
            "taskId": mst.spec.task_id,
            "createdAt": task.created_at,
            "expiresAt": task.expires_at,
            "openIssues": 0,
            "lastEventId": 0,
        })
    );
    assert_eq!(stored["spec"], serde_json::to_value(&mst.spec).unwrap());
    assert!(stored["metadata"].get("labels").is_none(), "{stored}");

    // And a resource whose status was never written has none at all.
    let bare = MeatspaceTask::new(&resource_name(Uuid::new_v4()), mst.spec.clone());
    api.create(&PostParams::default(), &bare)
        .await
        .expect("create without status");
    let back = api.get(&bare.name_any()).await.expect("read back");
    assert_eq!(back.status, None);
    assert_eq!(back.spec, bare.spec);
    drop_namespace(&client, &ns).await;
}

/// Splits `kubectl get` output into its header and rows of cells. Cells are
/// separated by at least two spaces, which keeps "OPEN ISSUES" whole.
fn table(output: &str) -> Vec<Vec<String>> {
    output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn kubectl_get_mst_shows_state_open_issues_expiry_and_age() {
    let (client, ns, api) = task_namespace().await;

    let worker = Uuid::new_v4();
    let open = Task {
        state: TaskState::Assigned,
        worker_id: Some(worker),
        published_at: Some(at(10, 0)),
        assigned_at: Some(at(20, 0)),
        start_by: Some(at(920, 0)),
        open_issues: 2,
        last_event_id: 7,
        ..draft_task()
    };
    let mst = desired(&open, &ns);
    apply(&api, &mst).await;
    let name = mst.name_any();
    let expires = mst
        .spec
        .expires_at
        .expect("a mirrored resource has spec.expiresAt")
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);

    for resource in [
        "mst",
        "meatspacetasks",
        "meatspacetask.meatspace.dev",
        "meatspace",
    ] {
        let rows = table(&kubectl(&["get", resource, "-n", &ns]));
        assert_eq!(rows.len(), 2, "kubectl get {resource}: {rows:?}");
        assert_eq!(
            rows[0],
            ["NAME", "STATE", "OPEN ISSUES", "EXPIRES", "AGE"],
            "kubectl get {resource}"
        );
        let row = &rows[1];
        assert_eq!(
            row[..4],
            [name.as_str(), "assigned", "2", expires.as_str()],
            "kubectl get {resource}"
        );
        assert!(
            row[4].ends_with('s') || row[4].ends_with('m'),
            "AGE is a short duration, got {:?}",
            row[4]
        );
    }

    let wide = table(&kubectl(&["get", "mst", "-n", &ns, "-o", "wide"]));
    assert_eq!(
        wide[0],
        [
            "NAME",
            "STATE",
            "OPEN ISSUES",
            "EXPIRES",
            "AGE",
            "ORIGIN",
            "TASK",
            "WORKER",
            "LAST EVENT"
        ]
    );
    assert_eq!(
        wide[1][5..],
        [
            "Mirrored".to_owned(),
            open.id.to_string(),
            worker.to_string(),
            "7".to_owned()
        ]
    );

    // status.state is a selectable field.
    let selected = kubectl(&[
        "get",
        "mst",
        "-n",
        &ns,
        "--field-selector",
        "status.state=assigned",
        "-o",
        "name",
    ]);
    assert_eq!(
        selected.trim(),
        format!("meatspacetask.meatspace.dev/{name}")
    );
    let none = kubectl(&[
        "get",
        "mst",
        "-n",
        &ns,
        "--field-selector",
        "status.state=open",
        "-o",
        "name",
    ]);
    assert_eq!(none.trim(), "");
    drop_namespace(&client, &ns).await;
}

/// Sends `body` as a JSON merge patch and expects the apiserver to refuse it
/// as invalid, naming `field` in its message.
async fn assert_rejected(
    api: &Api<MeatspaceTask>,
    name: &str,
    status: bool,
    body: Value,
    field: &str,
) {
    let params = PatchParams::default();
    let result = if status {
        api.patch_status(name, &params, &Patch::Merge(&body)).await
    } else {
        api.patch(name, &params, &Patch::Merge(&body)).await
    };
    match result {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{body}: {s:?}");
            assert!(
                s.message.contains(field),
                "{body}: message should name {field}: {}",
                s.message
            );
        }
        Err(e) => panic!("{body}: expected 422 Invalid, got {e}"),
        Ok(obj) => panic!("{body}: accepted, stored {:?} / {:?}", obj.spec, obj.status),
    }
}

#[tokio::test]
async fn invalid_resources_are_rejected() {
    let (client, ns, api) = task_namespace().await;
    let mst = desired(&draft_task(), &ns);
    apply(&api, &mst).await;
    let name = mst.name_any();

    let status_cases = [
        (json!({"status": {"openIssues": "two"}}), "openIssues"),
        (json!({"status": {"openIssues": -1}}), "openIssues"),
        (json!({"status": {"lastEventId": 1.5}}), "lastEventId"),
        (json!({"status": {"state": "done"}}), "state"),
        (
            json!({"status": {"publishedAt": "yesterday"}}),
            "publishedAt",
        ),
        (json!({"status": {"workerId": "bob"}}), "workerId"),
        (
            json!({"status": {"conditions": [{"type": "Terminal", "status": "False"}]}}),
            "conditions",
        ),
    ];
    for (body, field) in status_cases {
        assert_rejected(&api, &name, true, body, field).await;
    }
    let spec_cases = [
        (json!({"spec": {"taskId": "not-a-uuid"}}), "taskId"),
        (json!({"spec": {"expiresAt": 1_900_000_000}}), "expiresAt"),
        (json!({"spec": {"description": ""}}), "description"),
        (
            json!({"spec": {"description": "x".repeat(meatspace_domain::MAX_DESCRIPTION_CHARS + 1)}}),
            "description",
        ),
    ];
    for (body, field) in spec_cases {
        assert_rejected(&api, &name, false, body, field).await;
    }
    let place_cases = [
        (
            json!({"spec": {"location": {"latitude": 91.0, "longitude": 0.0}}}),
            "latitude",
        ),
        (
            json!({"spec": {"location": {"latitude": 1.0, "longitude": 2.0, "radiusM": 0}}}),
            "radiusM",
        ),
        (json!({"spec": {"presence": "require"}}), "presence"),
        (json!({"spec": {"presence": "sometimes"}}), "presence"),
    ];
    for (body, field) in place_cases {
        assert_rejected(&api, &name, false, body, field).await;
    }

    // A resource without its required spec fields is refused at creation.
    let dynamic = json!({
        "apiVersion": "meatspace.dev/v1alpha1",
        "kind": "MeatspaceTask",
        "metadata": {"name": resource_name(Uuid::new_v4())},
        "spec": {"description": "no id, no expiry"},
    });
    let object: DynamicObject = serde_json::from_value(dynamic).unwrap();
    match dynamic_api(&client, &ns)
        .create(&PostParams::default(), &object)
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(
                s.message.contains("taskId") && s.message.contains("expiresAt"),
                "{}",
                s.message
            );
        }
        other => panic!("a spec without taskId and expiresAt was not refused: {other:?}"),
    }

    // Fields the schema does not know are dropped, so nothing (a token, a
    // photo) can ride along in a resource by accident.
    let body = json!({"spec": {"agentToken": "mst_secret"}, "status": {"photo": "aGVsbG8="}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .expect("unknown spec fields are pruned, not refused");
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .expect("unknown status fields are pruned, not refused");
    let stored = raw(&client, &ns, &name).await;
    let text = stored.to_string();
    assert!(
        !text.contains("agentToken") && !text.contains("mst_secret"),
        "{stored}"
    );
    assert!(
        !text.contains("photo") && !text.contains("aGVsbG8="),
        "{stored}"
    );

    // The valid resource is unchanged by all of the above.
    let back = api.get(&name).await.expect("read back");
    assert_eq!(back.spec, mst.spec);
    assert_eq!(back.status, mst.status);
    drop_namespace(&client, &ns).await;
}
