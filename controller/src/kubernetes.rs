//! The Kubernetes side of the controller, behind the `kubernetes` cargo
//! feature (the `meatspace-controller` binary has it; the API server, which
//! embeds the other reconcilers for SQLite, does not link kube at all).
//!
//! [`run`] is the one place that connects to the cluster, holds the Lease
//! ([`leader`]) when one is set, and while leading runs the [`mirror`] and
//! the [`requests`] reconciler side by side, so those modules never call
//! each other.

use std::sync::Arc;
use std::time::Duration;

use meatspace_crds::FIELD_MANAGER;
use meatspace_store::Store;
use tokio::sync::watch;

pub use crate::mirror::MirrorSettings;
use crate::{Error, Shutdown};
use crate::{leader, mirror, requests};

/// Connects to the cluster named by `settings`.
pub async fn client(settings: &MirrorSettings) -> Result<kube::Client, Error> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::KubeConfig(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| Error::KubeConfig(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::KubeConfig(e.to_string()))?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// Mirrors tasks (and reconciles requested ones) until shutdown, while
/// leading when a Lease is set.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    settings: MirrorSettings,
    clock: meatspace_domain::clock::Clock,
    mut shutdown: Shutdown,
) {
    let client = loop {
        match client(&settings).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::error!(error = %e, "cannot reach the cluster; retrying");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                    () = shutdown.requested() => return,
                }
            }
        }
    };
    let (leading_tx, mut leading) = watch::channel(settings.lease.is_none());
    // The elector lives exactly as long as this function: aborted with it
    // if it is dropped, awaited on shutdown so that it can release the
    // Lease before the process exits (a successor then need not wait the
    // Lease out). Without a Lease this replica always leads, and the
    // sender stays here so that `leading` keeps its value.
    let (elector, _always_leading) = match settings.lease.clone() {
        Some(lease) => {
            let elector = leader::run(client.clone(), lease, leading_tx, shutdown.clone());
            (Some(Elector(tokio::spawn(elector))), None)
        }
        None => (None, Some(leading_tx)),
    };
    while !shutdown.is_requested() {
        tokio::select! {
            led = leading.wait_for(|l| *l) => if led.is_err() {
                // Only a panic ends the elector before shutdown.
                tracing::error!("the leader elector stopped: mirroring ends");
                break;
            },
            () = shutdown.requested() => break,
        }
        tracing::info!(namespace = %settings.namespace, "mirroring tasks");
        let lost = async {
            let _ = leading.wait_for(|l| !*l).await;
        };
        let requested = async {
            match settings.requests.clone() {
                Some(r) => {
                    let identity = settings
                        .lease
                        .as_ref()
                        .map_or_else(|| FIELD_MANAGER.to_owned(), |l| l.identity.clone());
                    let namespace = settings.namespace.clone();
                    let clock = clock.clone();
                    requests::run(store.clone(), client.clone(), namespace, r, clock, identity)
                        .await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = mirror::mirror(store.clone(), client.clone(), &settings) => {}
            () = requested => {}
            () = lost => tracing::info!("lost the lease: mirroring stops"),
            () = shutdown.requested() => {}
        }
    }
    if let Some(mut elector) = elector
        && tokio::time::timeout(Duration::from_secs(5), &mut elector.0)
            .await
            .is_err()
    {
        tracing::warn!("the leader elector did not release the Lease within 5s");
    }
}

/// The leader elector's task; aborted when dropped.
struct Elector(tokio::task::JoinHandle<()>);

impl Drop for Elector {
    fn drop(&mut self) {
        self.0.abort();
    }
}
