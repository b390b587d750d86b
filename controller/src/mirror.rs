//! The Kubernetes mirror: every task in the store appears as a
//! `MeatspaceTask` custom resource in one namespace, so `kubectl get mst`
//! shows the system at a glance.
//!
//! The store is the authority. The mirror keeps a watch-fed cache of the
//! resources it manages and, for each task, compares what the cluster has
//! (the cache, or the resource as the mirror's own last write left it while
//! the watch has not announced that write yet) with [`desired`] (a pure function of the task): a differing spec or
//! status is written back with server-side apply under one field manager
//! (reverting hand edits), a missing resource is recreated, a resource whose
//! task is gone (retention) is deleted. An unchanged task costs no request.
//!
//! Work arrives three ways: the store's change stream (a task changed, so
//! the cluster follows within moments), the watch (someone edited or
//! deleted a resource), and a periodic full resync as a safety net. With
//! leader election on, only the replica holding the Lease mirrors
//! ([`crate::kubernetes`] runs it).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use meatspace_crds::{
    FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL, MeatspaceTask, MeatspaceTaskStatus, desired,
};
use meatspace_domain::Task;
use meatspace_store::{Change, Store};
use serde_json::json;
use tokio_util::time::{DelayQueue, delay_queue};
use uuid::Uuid;

use crate::Error;
use crate::error::kube_call;
use crate::leader::LeaseSettings;
use crate::requests::RequestSettings;

/// What the mirror must do for one task.
#[derive(Debug, Clone, PartialEq)]
enum Plan {
    Nothing,
    /// Write the spec (and then the status), or only the status.
    Apply {
        spec: bool,
        status: bool,
        want: Box<MeatspaceTask>,
    },
    Delete,
}

/// Decides what to write, from the task (if it still exists) and the
/// resource the cluster has (if any). Pure.
fn plan(task: Option<&Task>, observed: Option<&MeatspaceTask>, namespace: &str) -> Plan {
    let Some(task) = task else {
        return if observed.is_some() {
            Plan::Delete
        } else {
            Plan::Nothing
        };
    };
    let want = desired(task, namespace);
    let (spec, status) = match observed {
        None => (true, true),
        Some(o) => {
            let labelled = o.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY);
            let spec = o.spec != want.spec || !labelled;
            let status = o.status.as_ref() != Some(&with_generation(&want, o.metadata.generation));
            (spec, status)
        }
    };
    if spec || status {
        Plan::Apply {
            spec,
            status,
            want: Box::new(want),
        }
    } else {
        Plan::Nothing
    }
}

/// The desired status, stamped with the generation it was written for.
fn with_generation(want: &MeatspaceTask, generation: Option<i64>) -> MeatspaceTaskStatus {
    let mut status = want
        .status
        .clone()
        .unwrap_or_else(|| unreachable!("desired() sets a status"));
    status.observed_generation = generation;
    status
}

struct Mirror {
    store: Arc<dyn Store>,
    api: Api<MeatspaceTask>,
    namespace: String,
    cache: reflector::Store<MeatspaceTask>,
    /// Our own writes whose watch events have not all arrived yet, by
    /// resource name. Such an event needs no reconcile: the state is what
    /// we wrote (task changes arrive through the store), and reconciling
    /// the state between our spec and our status write would see a stale
    /// status and write it a second time. Until the watch has announced
    /// them, the cache is behind our own writes, so plans compare with the
    /// object as our last write left it instead: on a busy machine the
    /// watch can lag seconds behind a burst of writes, and a resync
    /// comparing with the stale cache would rewrite every unchanged task.
    own_writes: Mutex<HashMap<String, OwnWrite>>,
}

/// The resource as our last write left it, and the resourceVersions our
/// writes produced that the watch has not announced yet.
struct OwnWrite {
    written: Arc<MeatspaceTask>,
    unannounced: Vec<String>,
}

impl Mirror {
    /// The resource as far as the mirror knows: as our own last write left
    /// it while the watch has not caught up with that write, else the
    /// watch-fed cache.
    fn observed(&self, id: Uuid) -> Option<Arc<MeatspaceTask>> {
        let name = meatspace_crds::resource_name(id);
        if let Some(own) = self
            .own_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name)
        {
            return Some(own.written.clone());
        }
        self.cache
            .get(&ObjectRef::new(&name).within(&self.namespace))
    }

    fn count_write(&self, op: &'static str) {
        metrics::counter!("meatspace_mirror_writes_total", "namespace" => self.namespace.clone(), "op" => op)
            .increment(1);
    }

    /// Reads the task and brings its resource in line with it. A task
    /// requested from Kubernetes is left to the resource that asked for it.
    async fn reconcile(&self, id: Uuid) -> Result<(), Error> {
        let task = self.store.task(id).await?;
        if task.is_some() && !self.store.requested_among(&[id]).await?.is_empty() {
            return Ok(());
        }
        self.reconcile_task(id, task.as_ref()).await
    }

    /// Brings the resource of task `id` in line with `task` (`None`: the
    /// task is gone).
    #[tracing::instrument(skip(self, task), fields(namespace = %self.namespace))]
    async fn reconcile_task(&self, id: Uuid, task: Option<&Task>) -> Result<(), Error> {
        let observed = self.observed(id);
        match plan(task, observed.as_deref(), &self.namespace) {
            Plan::Nothing => {}
            Plan::Delete => {
                self.count_write("delete");
                let name = meatspace_crds::resource_name(id);
                self.forget_own_write(&name);
                match kube_call("delete", self.api.delete(&name, &DeleteParams::default())).await {
                    Ok(_) => {
                        tracing::debug!(task_id = %id, "deleted the resource of a removed task")
                    }
                    Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            Plan::Apply {
                spec,
                status: _,
                want,
            } => {
                let name = want.name_any();
                let params = PatchParams::apply(FIELD_MANAGER).force();
                let mut generation = observed.as_ref().and_then(|o| o.metadata.generation);
                let mut versions = Vec::with_capacity(2);
                if spec {
                    let mut main = (*want).clone();
                    main.status = None;
                    self.count_write("apply");
                    let written = kube_call(
                        "apply",
                        self.api.patch(&name, &params, &Patch::Apply(&main)),
                    )
                    .await?;
                    generation = written.metadata.generation;
                    versions.extend(written.metadata.resource_version);
                }
                let body = json!({
                    "apiVersion": MeatspaceTask::api_version(&()),
                    "kind": MeatspaceTask::kind(&()),
                    "status": with_generation(&want, generation),
                });
                self.count_write("apply_status");
                let written = kube_call(
                    "apply status",
                    self.api.patch_status(&name, &params, &Patch::Apply(&body)),
                )
                .await?;
                versions.extend(written.metadata.resource_version.clone());
                // Recorded only once both writes went through: if the status
                // write failed, the event of the spec write retries it.
                let mut own = self
                    .own_writes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if own.len() > MAX_OWN_WRITES {
                    own.clear();
                }
                let entry = own.entry(name).or_insert_with(|| OwnWrite {
                    written: Arc::new(written.clone()),
                    unannounced: Vec::new(),
                });
                entry.written = Arc::new(written);
                entry.unannounced.extend(versions);
            }
        }
        Ok(())
    }

    /// Compares every task and every managed resource; writes only the
    /// differences. The tasks come from the pages just read, not one read
    /// each: a task that changes meanwhile is reconciled again from its
    /// change notification, which the loop handles after the resync. A
    /// failure on one task is reported and the others still go through;
    /// the ids that failed are returned, for retrying.
    async fn resync(&self) -> Result<Vec<Uuid>, Error> {
        let started = std::time::Instant::now();
        let mut seen = HashSet::new();
        let mut after = None;
        let mut failed = Vec::new();
        loop {
            let page = self.store.tasks_after(after, 500).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            seen.extend(page.iter().map(|t| t.id));
            let ids: Vec<Uuid> = page.iter().map(|t| t.id).collect();
            let requested: HashSet<Uuid> = self
                .store
                .requested_among(&ids)
                .await?
                .into_iter()
                .collect();
            // Boxed: with the plain futures, rustc cannot prove the spawned
            // mirror future Send (rust-lang/rust#102211).
            let reconciles: Vec<BoxFuture<'_, (Uuid, Result<(), Error>)>> = page
                .iter()
                .filter(|t| !requested.contains(&t.id))
                .map(|t| {
                    self.reconcile_task(t.id, Some(t))
                        .map(move |r| (t.id, r))
                        .boxed()
                })
                .collect();
            let mut results = futures::stream::iter(reconciles).buffer_unordered(8);
            while let Some((id, result)) = results.next().await {
                if let Err(e) = result {
                    report(Err(e), "reconcile");
                    failed.push(id);
                }
            }
        }
        // Resources whose task is gone (removed by retention while no
        // change reached us). The name is the task id.
        let orphans: Vec<Uuid> = self
            .cache
            .state()
            .iter()
            .filter_map(|r| Uuid::parse_str(&r.name_any()).ok())
            .filter(|id| !seen.contains(id))
            .collect();
        for id in orphans {
            if let Err(e) = self.reconcile(id).await {
                report(Err(e), "reconcile");
                failed.push(id);
            }
        }
        metrics::counter!("meatspace_mirror_resyncs_total", "namespace" => self.namespace.clone())
            .increment(1);
        tracing::debug!(tasks = seen.len(), failed = failed.len(), elapsed = ?started.elapsed(), "mirror resync done");
        Ok(failed)
    }

    /// Whether a watched object is in a state our own write produced (and
    /// forgets that state: each is announced once). Once the watch has
    /// announced every state our writes produced, the cache is current.
    fn is_own_write(&self, obj: &MeatspaceTask) -> bool {
        let Some(rv) = obj.metadata.resource_version.as_deref() else {
            return false;
        };
        let name = obj.name_any();
        let mut own = self
            .own_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = own.get_mut(&name) else {
            return false;
        };
        let Some(at) = entry.unannounced.iter().position(|v| v == rv) else {
            return false;
        };
        entry.unannounced.remove(at);
        if entry.unannounced.is_empty() {
            own.remove(&name);
        }
        true
    }

    /// Forgets our writes to `name`: someone else changed or deleted the
    /// resource (the watch says so), so the cache is newer than our write.
    /// A write that changed nothing is never announced either; its entry
    /// stays until then, which is harmless: it holds what the server has.
    fn forget_own_write(&self, name: &str) {
        self.own_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    /// Forgets the own writes not yet seen: after a re-list their events
    /// will not come.
    fn forget_own_writes(&self) {
        self.own_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// Bound of [`Mirror::own_writes`]; clearing it only costs a redundant
/// reconcile per entry.
const MAX_OWN_WRITES: usize = 100_000;

fn report(result: Result<(), Error>, what: &str) {
    if let Err(e) = result {
        crate::metrics::failed("mirror", e.metric_label());
        tracing::warn!(error = %e, "mirror {what} failed");
    }
}

/// Failed reconciles waiting for their retry, per task, with capped
/// exponential backoff (the kube-runtime `error_policy` pattern without its
/// whole `Controller`: our work items come from the store, not only from
/// watches). A task has at most one retry pending; any successful
/// reconcile of it clears it.
#[derive(Default)]
struct Retries {
    queue: DelayQueue<Uuid>,
    /// The pending retry and how many reconciles failed in a row.
    tasks: HashMap<Uuid, (Option<delay_queue::Key>, u32)>,
}

impl Retries {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(60);

    /// Records the outcome of reconciling `id`.
    fn record(&mut self, id: Uuid, result: Result<(), Error>) {
        match result {
            Ok(()) => {
                if let Some((Some(key), _)) = self.tasks.remove(&id) {
                    self.queue.remove(&key);
                }
            }
            Err(e) => {
                report(Err(e), "reconcile");
                self.failed(id);
            }
        }
    }

    /// Schedules a retry of `id` after its next backoff delay.
    fn failed(&mut self, id: Uuid) {
        let (key, failures) = self.tasks.entry(id).or_insert((None, 0));
        let delay = Self::FIRST
            .saturating_mul(1 << (*failures).min(16))
            .min(Self::MAX);
        *failures = failures.saturating_add(1);
        match key {
            Some(k) => self.queue.reset(k, delay),
            None => *key = Some(self.queue.insert(id, delay)),
        }
        tracing::debug!(task_id = %id, ?delay, "mirror reconcile will be retried");
    }

    /// The next task whose retry is due; pending while there is none.
    async fn due(&mut self) -> Uuid {
        loop {
            match futures::future::poll_fn(|cx| self.queue.poll_expired(cx)).await {
                Some(expired) => {
                    let id = expired.into_inner();
                    if let Some((key, _)) = self.tasks.get_mut(&id) {
                        *key = None;
                    }
                    return id;
                }
                // Empty: nothing to retry until a failure is recorded,
                // which happens outside this wait.
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// Where and how to mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorSettings {
    /// Namespace of the resources.
    pub namespace: String,
    /// Kubeconfig file; unset means the usual discovery (KUBECONFIG, then
    /// the in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
    /// Interval of the full resync.
    pub resync_interval: Duration,
    /// Lease to hold before mirroring; unset mirrors unconditionally.
    pub lease: Option<LeaseSettings>,
    /// Also turn requested resources (`spec.origin: Requested`) of the
    /// namespace into tasks; unset leaves them alone.
    pub requests: Option<RequestSettings>,
}

/// The mirror loop proper; runs until cancelled.
pub(crate) async fn mirror(store: Arc<dyn Store>, client: kube::Client, settings: &MirrorSettings) {
    let api: Api<MeatspaceTask> = Api::namespaced(client, &settings.namespace);
    let (cache, writer) = reflector::store();
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
    let mut events = reflector::reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().labels(&selector)),
    )
    .default_backoff()
    .boxed();
    let m = Mirror {
        store,
        api,
        namespace: settings.namespace.clone(),
        cache,
        own_writes: Mutex::default(),
    };
    // The store's changes; `None` while (re)subscribing, which is retried
    // with backoff and followed by a resync (changes may have been missed).
    let mut changes: Option<BoxStream<'static, Change>> = None;
    let mut subscribe_backoff = crate::backoff::Backoff::default();
    let mut subscribe_at = tokio::time::Instant::now();
    let mut retries = Retries::default();
    let mut resync = tokio::time::interval(settings.resync_interval);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ready = false;
    loop {
        let subscribed = changes.is_some();
        let change = async {
            match changes.as_mut() {
                Some(stream) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(subscribe_at), if !subscribed => {
                match m.store.changes().await {
                    Ok(stream) => {
                        changes = Some(stream);
                        subscribe_backoff.reset();
                        if ready {
                            // Changes while nobody listened sent nothing.
                            resync_and_retry(&m, &mut retries).await;
                            resync.reset();
                        }
                    }
                    Err(e) => {
                        let e = Error::from(e);
                        tracing::warn!(error = %e, "cannot follow task changes; retrying");
                        subscribe_at = tokio::time::Instant::now() + subscribe_backoff.next_delay();
                    }
                }
            }
            change = change => match change {
                Some(Change::Task(id)) if ready => retries.record(id, m.reconcile(id).await),
                Some(Change::Task(_)) => {}
                Some(Change::Gap) if ready => {
                    // Notifications were lost: compare everything.
                    resync_and_retry(&m, &mut retries).await;
                    resync.reset();
                }
                Some(Change::Gap | Change::Credential(_)) => {}
                None => {
                    tracing::warn!("the task change stream ended; subscribing again");
                    changes = None;
                    subscribe_at = tokio::time::Instant::now() + subscribe_backoff.next_delay();
                }
            },
            Some(event) = events.next() => match event {
                Ok(watcher::Event::Apply(obj)) if ready && m.is_own_write(&obj) => {}
                Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) if ready => {
                    m.forget_own_write(&obj.name_any());
                    if let Ok(id) = Uuid::parse_str(&obj.name_any()) {
                        retries.record(id, m.reconcile(id).await);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    // The cache is complete: catch up with everything.
                    ready = true;
                    m.forget_own_writes();
                    resync_and_retry(&m, &mut retries).await;
                    resync.reset();
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "watch of MeatspaceTask resources failed"),
            },
            id = retries.due(), if ready => retries.record(id, m.reconcile(id).await),
            _ = resync.tick(), if ready => resync_and_retry(&m, &mut retries).await,
        }
    }
}

/// A full resync whose per-task failures are queued for retry.
async fn resync_and_retry(m: &Mirror, retries: &mut Retries) {
    match m.resync().await {
        Ok(failed) => {
            for id in failed {
                retries.failed(id);
            }
        }
        // The store could not be read; the next resync, gap or change
        // tries again.
        Err(e) => report(Err(e), "resync"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use meatspace_domain::TaskState;

    fn task() -> Task {
        let t0: DateTime<Utc> = DateTime::from_timestamp(1_800_000_000, 0).expect("valid");
        Task {
            state: TaskState::Open,
            published_at: Some(t0),
            last_event_id: 1,
            ..Task::draft(Uuid::from_u128(1), "feed the cat".into(), t0, t0)
        }
    }

    fn as_applied(t: &Task, generation: i64) -> MeatspaceTask {
        let mut o = desired(t, "ns");
        o.metadata.generation = Some(generation);
        o.status = Some(with_generation(&o, Some(generation)));
        o
    }

    #[test]
    fn missing_resources_are_created_and_removed_tasks_deleted() {
        assert!(matches!(
            plan(Some(&task()), None, "ns"),
            Plan::Apply {
                spec: true,
                status: true,
                ..
            }
        ));
        assert_eq!(
            plan(None, Some(&as_applied(&task(), 1)), "ns"),
            Plan::Delete
        );
        assert_eq!(plan(None, None, "ns"), Plan::Nothing);
    }

    #[test]
    fn an_unchanged_task_costs_nothing() {
        assert_eq!(
            plan(Some(&task()), Some(&as_applied(&task(), 3)), "ns"),
            Plan::Nothing
        );
    }

    #[test]
    fn state_changes_write_only_the_status() {
        let observed = as_applied(&task(), 1);
        let mut t = task();
        t.state = TaskState::Cancelled;
        assert!(matches!(
            plan(Some(&t), Some(&observed), "ns"),
            Plan::Apply {
                spec: false,
                status: true,
                ..
            }
        ));
    }

    #[test]
    fn hand_edits_are_reverted() {
        let mut edited = as_applied(&task(), 2);
        edited.spec.description = "something else".into();
        assert!(matches!(
            plan(Some(&task()), Some(&edited), "ns"),
            Plan::Apply { spec: true, .. }
        ));
        let mut unlabelled = as_applied(&task(), 2);
        unlabelled.metadata.labels = None;
        assert!(matches!(
            plan(Some(&task()), Some(&unlabelled), "ns"),
            Plan::Apply { spec: true, .. }
        ));
        let mut stale = as_applied(&task(), 2);
        stale.metadata.generation = Some(3);
        assert!(matches!(
            plan(Some(&task()), Some(&stale), "ns"),
            Plan::Apply {
                spec: false,
                status: true,
                ..
            }
        ));
    }
}
