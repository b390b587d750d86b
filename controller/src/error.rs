//! The controller's one error type. Each variant names itself for the
//! `error` label of `meatspace_reconcile_errors_total`, so an alert can tell
//! an unreachable database from a real fault.

use meatspace_store::StoreError;

#[cfg(feature = "kubernetes")]
/// Longest wait for one apiserver request (not a watch). kube's client sets
/// no read timeout, so without this a hung apiserver would hold a
/// reconciler (or the leader elector) for ever.
pub const KUBE_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(feature = "kubernetes")]
/// Runs one apiserver request with [`KUBE_CALL_TIMEOUT`]; `what` names it
/// in the error.
pub(crate) async fn kube_call<T>(
    what: &'static str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(KUBE_CALL_TIMEOUT, call)
        .await
        .map_err(|_| Error::KubeTimeout(what))?
        .map_err(Error::Kube)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database cannot be reached (connection refused, pool timed out,
    /// SQLite busy). Transient: the reconciler retries.
    #[error("database unavailable: {0}")]
    StoreUnavailable(#[source] StoreError),
    /// Any other store failure.
    #[error("store: {0}")]
    Store(#[source] StoreError),
    /// A call to the Kubernetes apiserver failed.
    #[cfg(feature = "kubernetes")]
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// A call to the Kubernetes apiserver got no answer in time.
    #[cfg(feature = "kubernetes")]
    #[error("kubernetes: no answer to {0} within {KUBE_CALL_TIMEOUT:?}")]
    KubeTimeout(&'static str),
    /// No usable kubeconfig or in-cluster configuration.
    #[cfg(feature = "kubernetes")]
    #[error("kubernetes configuration: {0}")]
    KubeConfig(String),
    /// A reconciler task ended by itself, which only a panic does.
    #[error("a reconciler stopped unexpectedly: {0}")]
    ReconcilerStopped(String),
}

impl Error {
    /// Value of the `error` label in metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::StoreUnavailable(_) => "store_unavailable",
            Error::Store(_) => "store",
            #[cfg(feature = "kubernetes")]
            Error::Kube(_) => "kube",
            #[cfg(feature = "kubernetes")]
            Error::KubeTimeout(_) => "kube_timeout",
            #[cfg(feature = "kubernetes")]
            Error::KubeConfig(_) => "kube_config",
            Error::ReconcilerStopped(_) => "reconciler_stopped",
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        if e.is_unavailable() {
            Error::StoreUnavailable(e)
        } else {
            Error::Store(e)
        }
    }
}
