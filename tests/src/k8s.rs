//! Kubernetes for the suites: the throwaway control plane's admin client,
//! the checked-in CRD, namespaces of one test each, `kubectl`, and the
//! controller's least-privilege identity.
//!
//! The apiserver comes from `scripts/control-plane.sh` (the test command
//! starts one) and its admin kubeconfig from [`KUBECONFIG_ENV`]. A missing
//! control plane is a test failure, never a skip. Tests work in namespaces
//! of their own with random names, so they run in parallel and a second run
//! on the same control plane starts clean.
//!
//! [`ControllerIdentity`] is what the Helm chart gives the controller: a
//! ServiceAccount bound to a Role with exactly the rules the mirror and its
//! leader election need, and a kubeconfig that authenticates with a token of
//! that ServiceAccount, so a test runs the mirror as the controller and not
//! as an admin.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub use crate::prometheus::counter;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use meatspace_controller::leader::LeaseSettings;
use uuid::Uuid;

/// Environment variable naming the admin kubeconfig of the test control plane.
pub const KUBECONFIG_ENV: &str = "MEATSPACE_TEST_KUBECONFIG";
/// Field manager of everything the tests themselves write.
pub const TEST_MANAGER: &str = "meatspace-tests";
/// Name of the MeatspaceTask CRD.
pub const CRD_NAME: &str = "meatspacetasks.meatspace.dev";

/// Path of the admin kubeconfig; panics with instructions when unset.
pub fn admin_kubeconfig() -> PathBuf {
    match std::env::var_os(KUBECONFIG_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "{KUBECONFIG_ENV} is not set: these tests need a real kube-apiserver. Run the suite \
             with scripts/test, which starts a throwaway control plane, or start one with \
             `scripts/control-plane.sh start DIR` and `source DIR/env`."
        ),
    }
}

/// A client authenticated by the kubeconfig at `path`.
pub async fn client_from(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("read kubeconfig {}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
    Client::try_from(config).expect("build a Kubernetes client")
}

/// A client with the control plane's admin rights.
pub async fn admin_client() -> Client {
    client_from(&admin_kubeconfig()).await
}

/// The CRD exactly as checked in under deploy/ (the unit tests of
/// meatspace-crds make sure it matches the types).
pub fn checked_in_crd() -> CustomResourceDefinition {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(meatspace_crds::CRD_PATH);
    let yaml =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Applies the checked-in CRD with server-side apply and waits until the
/// apiserver serves it. Every test does this; applying the same object
/// again is a no-op, so parallel tests do not disturb each other.
pub async fn install_crd(client: &Client) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        CRD_NAME,
        &PatchParams::apply(TEST_MANAGER).force(),
        &Patch::Apply(checked_in_crd()),
    )
    .await
    .unwrap_or_else(|e| panic!("the apiserver refused the CRD: {e}"));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let crd = crds.get(CRD_NAME).await.expect("read the CRD back");
        let conditions = crd
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return crd;
        }
        if let Some(bad) = conditions
            .iter()
            .find(|c| c.type_ == "NamesAccepted" && c.status == "False")
        {
            panic!("the apiserver did not accept the CRD's names: {bad:?}");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the CRD is not Established after 30s: {conditions:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A namespace of this test alone, named `<prefix>-<random>`.
pub async fn create_namespace(client: &Client, prefix: &str) -> String {
    let name = format!("{prefix}-{}", &Uuid::new_v4().simple().to_string()[..12]);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    name
}

/// Leaves the namespace to be deleted. This control plane has no namespace
/// controller, so it stays Terminating; that only keeps new objects out.
pub async fn drop_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete namespace {name}: {e}"));
}

/// Runs kubectl with the kubeconfig at `kubeconfig` and returns what it
/// said, whether or not it succeeded.
pub fn kubectl_as(kubeconfig: &Path, args: &[&str]) -> Output {
    let program = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned());
    Command::new(&program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("run {program} (kubectl must be installed): {e}"))
}

/// Runs kubectl as the admin; panics unless it succeeds. Returns stdout.
pub fn kubectl(args: &[&str]) -> String {
    let output = kubectl_as(&admin_kubeconfig(), args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "kubectl {} failed: {}\n{stdout}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The rules the controller needs and nothing more, as the Helm chart
/// grants them (deploy/helm/meatspace/templates/controller-rbac.yaml, with
/// the mirror and the Lease in one namespace): its MeatspaceTask resources
/// and their status, and its one Lease. `create` cannot be restricted to a
/// name, so it is granted on leases in general; get and update only on the
/// controller's own Lease.
pub fn controller_rules(lease_name: &str) -> Vec<PolicyRule> {
    let rule = |group: &str, resource: &str, names: Option<&str>, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        resource_names: names.map(|n| vec![n.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    vec![
        rule(
            "meatspace.dev",
            "meatspacetasks",
            None,
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(
            "meatspace.dev",
            "meatspacetasks/status",
            None,
            &["get", "patch"],
        ),
        rule("coordination.k8s.io", "leases", None, &["create"]),
        rule(
            "coordination.k8s.io",
            "leases",
            Some(lease_name),
            &["get", "update"],
        ),
    ]
}

/// The rules the chart adds for requested tasks
/// (`controller.mirror.requests.enabled`): the agent-token Secrets, by name
/// (no list or watch), and (`controller.rbac.events`) Events.
pub fn requested_task_rules() -> Vec<PolicyRule> {
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    vec![
        rule("", "secrets", &["create", "get", "delete"]),
        rule("", "events", &["create", "patch"]),
        rule("events.k8s.io", "events", &["create", "patch"]),
    ]
}

/// A ServiceAccount with the controller's Role in one namespace, and a
/// kubeconfig that authenticates as it.
#[derive(Debug)]
pub struct ControllerIdentity {
    pub namespace: String,
    pub service_account: String,
    /// The one Lease the Role lets it read and renew.
    pub lease_name: String,
    /// Token kubeconfig of the ServiceAccount (same server and CA as the
    /// admin kubeconfig).
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl ControllerIdentity {
    /// Creates the ServiceAccount `meatspace-controller`, its Role and
    /// RoleBinding in `namespace` (as the admin `client`) and mints a token
    /// for it through the TokenRequest API.
    pub async fn create(client: &Client, namespace: &str, lease_name: &str) -> Self {
        Self::create_with(client, namespace, lease_name, Vec::new()).await
    }

    /// As [`ControllerIdentity::create`], with `extra` rules in the Role
    /// (e.g. [`requested_task_rules`]).
    pub async fn create_with(
        client: &Client,
        namespace: &str,
        lease_name: &str,
        extra: Vec<PolicyRule>,
    ) -> Self {
        let service_account = "meatspace-controller";
        let dir = tempfile::tempdir().expect("temporary directory");
        let kubeconfig = dir.path().join("controller.kubeconfig");
        let mut rules = controller_rules(lease_name);
        rules.extend(extra);
        let token = service_account_with_rules(client, namespace, service_account, rules).await;
        write_token_kubeconfig(&kubeconfig, namespace, service_account, &token);
        ControllerIdentity {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            lease_name: lease_name.to_owned(),
            kubeconfig,
            _dir: dir,
        }
    }

    /// `kubectl auth can-i ARGS` as this identity: true for "yes".
    pub fn can_i(&self, args: &[&str]) -> bool {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let out = kubectl_as(&self.kubeconfig, &all);
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        match answer.as_str() {
            "yes" => true,
            "no" => false,
            _ => panic!(
                "kubectl auth can-i {}: unexpected answer {answer:?}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
}

/// Creates `object` in `namespace`; panics, naming it, when that fails.
async fn create_in<K>(client: &Client, namespace: &str, object: K)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let name = object.meta().name.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {} {namespace}/{name}: {e}", K::kind(&())));
}

/// Creates ServiceAccount `name` in `namespace`, a Role and RoleBinding of
/// the same name with `rules` (none when empty), and returns a token of it.
pub async fn service_account_with_rules(
    client: &Client,
    namespace: &str,
    name: &str,
    rules: Vec<PolicyRule>,
) -> String {
    let meta = || ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectMeta::default()
    };
    create_in(
        client,
        namespace,
        ServiceAccount {
            metadata: meta(),
            ..ServiceAccount::default()
        },
    )
    .await;
    if !rules.is_empty() {
        create_in(
            client,
            namespace,
            Role {
                metadata: meta(),
                rules: Some(rules),
            },
        )
        .await;
        create_in(
            client,
            namespace,
            RoleBinding {
                metadata: meta(),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: name.to_owned(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: name.to_owned(),
                    namespace: Some(namespace.to_owned()),
                    ..Subject::default()
                }]),
            },
        )
        .await;
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("mint a token for {namespace}/{name}: {e}"))
        .status
        .and_then(|s| s.token)
        .expect("a TokenRequest answer carries a token")
}

/// Writes a kubeconfig at `path` for the admin kubeconfig's cluster that
/// authenticates with `token`.
pub fn write_token_kubeconfig(path: &Path, namespace: &str, user: &str, token: &str) {
    let admin = admin_kubeconfig();
    let kubeconfig = Kubeconfig::read_from(&admin)
        .unwrap_or_else(|e| panic!("read kubeconfig {}: {e}", admin.display()));
    let cluster = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .unwrap_or_else(|| panic!("{} names no cluster", admin.display()));
    let server = cluster.server.expect("the cluster has a server URL");
    let ca = cluster
        .certificate_authority_data
        .expect("the admin kubeconfig carries the CA inline (control-plane.sh writes it so)");
    // JSON is YAML, and kubectl and kube read both.
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "test", "user": user, "namespace": namespace}}],
        "current-context": user,
    });
    std::fs::write(path, config.to_string())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A namespace of one test with the CRD installed and the controller's
/// identity in it (allowed the Lease `lease`), seen by the admin.
pub struct MirrorNamespace {
    pub admin: Client,
    pub ns: String,
    pub identity: ControllerIdentity,
    /// The admin's view of the namespace's MeatspaceTasks.
    pub api: Api<meatspace_crds::MeatspaceTask>,
    lease: String,
}

impl std::fmt::Debug for MirrorNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorNamespace")
            .field("ns", &self.ns)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl MirrorNamespace {
    /// Installs the CRD and creates the namespace `<prefix>-<random>` with
    /// the controller's identity in it.
    pub async fn create(prefix: &str, lease: &str) -> MirrorNamespace {
        let admin = admin_client().await;
        install_crd(&admin).await;
        let ns = create_namespace(&admin, prefix).await;
        let identity = ControllerIdentity::create(&admin, &ns, lease).await;
        let api = Api::namespaced(admin.clone(), &ns);
        MirrorNamespace {
            admin,
            ns,
            identity,
            api,
            lease: lease.to_owned(),
        }
    }

    /// The controller's Lease, held as `identity` for `duration`.
    pub fn lease(&self, identity: &str, duration: Duration) -> LeaseSettings {
        LeaseSettings {
            name: self.lease.clone(),
            namespace: self.ns.clone(),
            identity: identity.to_owned(),
            duration,
        }
    }

    /// Who holds the Lease, if anyone.
    pub async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.admin.clone(), &self.ns);
        leases
            .get_opt(&self.lease)
            .await
            .expect("read the Lease")
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    /// The namespace's MeatspaceTasks.
    pub async fn list(&self) -> Vec<meatspace_crds::MeatspaceTask> {
        self.api
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("LIST {}: {e}", self.ns))
            .items
    }

    /// The names of the namespace's MeatspaceTasks.
    pub async fn names(&self) -> std::collections::BTreeSet<String> {
        self.list()
            .await
            .iter()
            .map(kube::ResourceExt::name_any)
            .collect()
    }
}
