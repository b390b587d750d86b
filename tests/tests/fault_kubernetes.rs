//! Faults between the controller and the Kubernetes apiserver, against the
//! real kube-apiserver of the test control plane.
//!
//! - **A frozen apiserver under the Lease holder.** The leader reaches the
//!   apiserver through a TCP relay on 127.0.0.1 that the test freezes: from
//!   then on the relay swallows every byte in both directions, so each
//!   request hangs exactly as if the apiserver had been stopped with
//!   SIGSTOP, while a second replica still reaches it directly. Promise:
//!   the frozen leader stops leading (its `meatspace_leader` gauge drops to
//!   0 and its mirror stops) *before* the other replica takes the Lease
//!   over, so two mirrors never write at once; and after the thaw the old
//!   leader stays a follower.
//! - **A refused write.** The controller's RBAC Role loses `patch` on
//!   MeatspaceTasks, a task is created (its resource write is refused with
//!   403 by the apiserver), then the permission comes back. Promise: the
//!   mirror retries that one task with backoff, so its resource appears
//!   within seconds of the permission's return, not at the next full resync
//!   (set to 300 s here).

mod controller_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use kube::api::{Api, Patch, PatchParams};
use kube::config::Kubeconfig;
use meatspace_controller::kubernetes::MirrorSettings;
use meatspace_controller::leader::{LEADER_GAUGE, LeaseSettings};
use meatspace_crds::resource_name;
use meatspace_domain::Policy;
use meatspace_tests::k8s::{
    MirrorNamespace, TEST_MANAGER, controller_rules, counter, drop_namespace,
};
use meatspace_tests::{Db, TestDb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use controller_support::{InProcess, draft_named, with_mirror};

/// The Lease the controller identity may hold.
const LEASE: &str = "meatspace-controller";

/// The two tests read process-wide metrics of the mirror; one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// A namespace for one test (the metrics recorder installed first: the
/// mirror counts into it).
async fn cluster() -> MirrorNamespace {
    meatspace_api::http::metrics::handle();
    MirrorNamespace::create("fault", LEASE).await
}

/// Mirror settings for `c`'s namespace, reached through `kubeconfig`.
fn mirror(c: &MirrorNamespace, kubeconfig: &Path, lease: Option<LeaseSettings>) -> MirrorSettings {
    MirrorSettings {
        namespace: c.ns.clone(),
        kubeconfig: Some(kubeconfig.to_owned()),
        // Only the retries and the change stream may bring a resource
        // in step within a test.
        resync_interval: Duration::from_secs(300),
        lease,
        requests: None,
    }
}

/// Replaces the controller's Role rules in `c`'s namespace.
async fn set_rules(c: &MirrorNamespace, rules: Vec<PolicyRule>) {
    let roles: Api<Role> = Api::namespaced(c.admin.clone(), &c.ns);
    let role = Role {
        metadata: kube::api::ObjectMeta {
            name: Some(c.identity.service_account.clone()),
            ..Default::default()
        },
        rules: Some(rules),
    };
    roles
        .patch(
            &c.identity.service_account,
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(&role),
        )
        .await
        .expect("update the controller's Role");
}

/// Whether `identity` leads, by its `meatspace_leader` gauge.
fn leads(identity: &str) -> bool {
    let text = meatspace_api::http::metrics::handle().render();
    counter(&text, LEADER_GAUGE, &[("identity", identity)]) > 0.0
}

/// Waits until `check` holds (within `limit`); returns how long it took.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let check = || {
        let holds = check();
        async move { holds.await.then_some(()) }
    };
    meatspace_tests::eventually_timed(limit, what, check)
        .await
        .1
}

// ---- a TCP relay that can be frozen ------------------------------------------------------

/// Relays 127.0.0.1:<port> to the apiserver. Frozen, it reads and drops
/// every byte both ways: the client's requests hang unanswered.
struct Relay {
    frozen: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    fn start(listener: TcpListener, upstream: String) -> Relay {
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, f.clone()));
                tokio::spawn(pipe(sr, cw, f.clone()));
            }
        });
        Relay { frozen, task }
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Writes to `out` a copy of `kubeconfig` whose server is `server` (the
/// TLS server name stays 127.0.0.1, which the apiserver's certificate
/// covers); returns the original server's `host:port`.
fn kubeconfig_via(kubeconfig: &Path, server: impl FnOnce(&str) -> String, out: &Path) -> String {
    let mut config = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let cluster = config.clusters[0].cluster.as_mut().expect("a cluster");
    let upstream = cluster.server.clone().expect("a server URL");
    let upstream = upstream
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_owned();
    cluster.server = Some(server(&upstream));
    // JSON is YAML: the kubeconfig reader takes it.
    std::fs::write(out, serde_json::to_vec(&config).expect("serialise")).expect("write");
    upstream
}

// ---- the tests -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_by_a_frozen_apiserver_steps_down_before_the_takeover() {
    let _serial = SERIAL.lock().await;
    let c = cluster().await;
    let duration = Duration::from_secs(3);
    let (a_id, b_id) = (format!("a-{}", c.ns), format!("b-{}", c.ns));

    // A's kubeconfig goes through the relay.
    let dir = tempfile::tempdir().expect("temporary directory");
    let via_relay: PathBuf = dir.path().join("relay.kubeconfig");
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the relay");
    let relay_addr = listener.local_addr().expect("relay address");
    let upstream = kubeconfig_via(
        &c.identity.kubeconfig,
        |_| format!("https://{relay_addr}"),
        &via_relay,
    );
    let relay = Relay::start(listener, upstream);

    let db_a = TestDb::new(Db::Postgres).await;
    let store_a = db_a.store(Policy::default()).await;
    let db_b = TestDb::new(Db::Postgres).await;
    let store_b = db_b.store(Policy::default()).await;
    let a_tasks: BTreeSet<String> = [draft_named(&store_a, "A: fold the laundry.").await]
        .iter()
        .map(|t| resource_name(t.id))
        .collect();
    let b_tasks: BTreeSet<String> = [draft_named(&store_b, "B: buy bread.").await]
        .iter()
        .map(|t| resource_name(t.id))
        .collect();

    let a = InProcess::start(
        &store_a,
        with_mirror(mirror(&c, &via_relay, Some(c.lease(&a_id, duration)))),
    );
    eventually(Duration::from_secs(15), "A to lead and mirror", || async {
        leads(&a_id) && c.names().await == a_tasks
    })
    .await;
    let b = InProcess::start(
        &store_b,
        with_mirror(mirror(
            &c,
            &c.identity.kubeconfig,
            Some(c.lease(&b_id, duration)),
        )),
    );
    // B follows: it is running when it has published its gauge at 0.
    eventually(
        Duration::from_secs(10),
        "B to run as a follower",
        || async {
            let text = meatspace_api::http::metrics::handle().render();
            text.contains(&format!("identity=\"{b_id}\""))
        },
    )
    .await;
    assert!(!leads(&b_id));

    // Freeze A's apiserver. Watch who leads, every 10 ms.
    relay.freeze(true);
    let frozen = Instant::now();
    let (mut a_down, mut b_up) = (None, None);
    while a_down.is_none() || b_up.is_none() {
        assert!(
            frozen.elapsed() < 4 * duration,
            "after {:?}: A stepped down {a_down:?}, B took over {b_up:?}",
            frozen.elapsed()
        );
        if a_down.is_none() && !leads(&a_id) {
            a_down = Some(frozen.elapsed());
        }
        if b_up.is_none() && c.lease_holder().await.as_deref() == Some(b_id.as_str()) {
            b_up = Some(frozen.elapsed());
            // At the moment B holds the Lease, A must already have stopped.
            assert!(
                !leads(&a_id),
                "B took the Lease {:?} after the freeze while A still led",
                frozen.elapsed()
            );
        }
        // The interval of a bounded poll.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (a_down, b_up) = (a_down.expect("A stepped down"), b_up.expect("B took over"));
    assert!(
        a_down < b_up,
        "A stepped down at {a_down:?}, B took over at {b_up:?}"
    );

    // B mirrors its store; after the thaw A stays a follower and writes
    // nothing (its task would reappear).
    eventually(Duration::from_secs(10), "B to mirror its store", || async {
        c.names().await == b_tasks
    })
    .await;
    relay.freeze(false);
    let thawed = Instant::now();
    while thawed.elapsed() < 2 * duration {
        assert!(!leads(&a_id), "A leads again after the thaw");
        assert_eq!(c.names().await, b_tasks, "A wrote after the thaw");
        assert_eq!(c.lease_holder().await.as_deref(), Some(b_id.as_str()));
        // A negative check over a period: real time is the behaviour.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "frozen apiserver under the leader (Lease of {} s): the leader stepped down after {} ms, \
         the follower took over after {} ms",
        duration.as_secs(),
        a_down.as_millis(),
        b_up.as_millis()
    );
    a.stop_within(Duration::from_secs(20)).await;
    b.stop_within(Duration::from_secs(20)).await;
    drop_namespace(&c.admin, &c.ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_the_apiserver_refused_is_retried_within_seconds() {
    let _serial = SERIAL.lock().await;
    let c = cluster().await;
    let db = TestDb::new(Db::Postgres).await;
    let store = db.store(Policy::default()).await;
    let first = draft_named(&store, "Feed the cat.").await;
    let controller = InProcess::start(
        &store,
        with_mirror(mirror(&c, &c.identity.kubeconfig, None)),
    );
    eventually(Duration::from_secs(15), "the mirror to run", || async {
        c.names().await.contains(&resource_name(first.id))
    })
    .await;

    // Take `patch` away: server-side apply of a new resource is refused.
    let without_patch: Vec<PolicyRule> = controller_rules(LEASE)
        .into_iter()
        .map(|mut r| {
            r.verbs.retain(|v| v != "patch");
            r
        })
        .collect();
    set_rules(&c, without_patch).await;
    eventually(Duration::from_secs(10), "RBAC to refuse patch", || async {
        !c.identity
            .can_i(&["patch", "meatspacetasks.meatspace.dev", "-n", &c.ns])
    })
    .await;
    let errors = || {
        let text = meatspace_api::http::metrics::handle().render();
        counter(
            &text,
            "meatspace_reconcile_errors_total",
            &[("reconciler", "mirror"), ("error", "kube")],
        )
    };
    let before = errors();
    let second = draft_named(&store, "Water the plants.").await;
    eventually(
        Duration::from_secs(10),
        "the apiserver to refuse the write",
        || async { errors() > before },
    )
    .await;
    assert!(!c.names().await.contains(&resource_name(second.id)));

    // Give it back: the retry (not a resync, 300 s away) writes it.
    set_rules(&c, controller_rules(LEASE)).await;
    let restored = Instant::now();
    eventually(
        Duration::from_secs(30),
        "the refused write to be retried",
        || async { c.names().await.contains(&resource_name(second.id)) },
    )
    .await;
    println!(
        "a write refused by the apiserver was retried and landed {} ms after the permission came back",
        restored.elapsed().as_millis()
    );
    controller.stop_within(Duration::from_secs(20)).await;
    drop_namespace(&c.admin, &c.ns).await;
}
