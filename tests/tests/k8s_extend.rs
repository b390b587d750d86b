//! An extended deadline reaches the Kubernetes mirror: after
//! `POST /api/v1/tasks/{id}/extend`, the task's `MeatspaceTask` shows the
//! new `spec.expiresAt` (the database is the authority; the mirror follows
//! every change). Against a real kube-apiserver (`MEATSPACE_TEST_KUBECONFIG`,
//! started by `scripts/test`), on both backends.

mod controller_support;

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::api::Api;
use meatspace_controller::ControllerConfig;
use meatspace_controller::kubernetes::MirrorSettings;
use meatspace_crds::MeatspaceTask;
use meatspace_tests::Db;
use meatspace_tests::k8s::{
    ControllerIdentity, admin_client, create_namespace, drop_namespace, install_crd,
};
use meatspace_tests::server::{Expect, TestServer, str_at, task_and_token};
use reqwest::StatusCode;
use serde_json::json;

use controller_support::InProcess;

meatspace_tests::api_tests!(the_mirror_shows_the_extended_deadline);

async fn the_mirror_shows_the_extended_deadline(db: Db) {
    // The mirror counts into the process's Prometheus recorder.
    meatspace_api::http::metrics::handle();
    let admin = admin_client().await;
    install_crd(&admin).await;
    let ns = create_namespace(&admin, "extend").await;
    let identity = ControllerIdentity::create(&admin, &ns, "meatspace-controller").await;
    let server = TestServer::start(db).await;
    let controller = InProcess::start(
        &server.store,
        ControllerConfig {
            mirror: Some(MirrorSettings {
                namespace: ns.clone(),
                kubeconfig: Some(identity.kubeconfig.clone()),
                resync_interval: Duration::from_secs(600),
                lease: None,
                requests: None,
            }),
            ..controller_support::config()
        },
    );
    let created = server
        .create_task_with(json!({ "description": "Check the boiler", "expires_in_seconds": 3600 }))
        .await;
    let (id, token) = task_and_token(&created);
    let change = server
        .agent(&token)
        .post(&format!("/api/v1/tasks/{id}/extend"))
        .json(&json!({ "add_seconds": 7200 }))
        .expect_json(StatusCode::OK)
        .await;
    let extended: DateTime<Utc> = str_at(&change, "/task/expires_at").parse().unwrap();
    let api: Api<MeatspaceTask> = Api::namespaced(admin.clone(), &ns);
    let what = format!("the resource shows the new deadline {extended}");
    meatspace_tests::eventually(Duration::from_secs(30), &what, || async {
        let resource = api
            .get_opt(&id.to_string())
            .await
            .expect("read the resource");
        resource
            .is_some_and(|r| r.spec.expires_at == Some(extended))
            .then_some(())
    })
    .await;
    controller.stop().await;
    drop_namespace(&admin, &ns).await;
}
