//! `meatspace-controller`: parses the configuration (refusing to start
//! without the server key that signs webhooks), sets up logging and
//! metrics, opens the store (running migrations), serves `/livez`,
//! `/readyz` and `/metrics`, and runs the reconcilers of
//! [`meatspace_controller::run`] until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use meatspace_controller::{Config, health, metrics, telemetry};
use meatspace_store::{BackendKind, ConnectOptions, redact_url};
use meatspace_store_connect::connect;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    telemetry::init(&config.log, config.log_format).context("invalid log filter")?;
    // Any task may name a webhook (the API server accepts webhook_url
    // whenever it runs), and a delivery this process cannot sign is a
    // webhook that silently never fires: refuse to start instead.
    let Some(secret_key) = config.secret_key.as_deref().filter(|k| !k.is_empty()) else {
        anyhow::bail!(
            "MEATSPACE_SECRET_KEY is not set: tasks may name a webhook_url, and without the \
             server key the controller cannot sign their deliveries. Give the controller the \
             same MEATSPACE_SECRET_KEY as the API server."
        );
    };
    let server_key = meatspace_store::secret::ServerKey::from_text(secret_key)
        .context("MEATSPACE_SECRET_KEY")?;
    tracing::info!(?config, "starting meatspace-controller");
    let handle = metrics::install_recorder().context("install the Prometheus recorder")?;

    let options = ConnectOptions {
        max_connections: config.db_max_connections,
        ..ConnectOptions::default()
    };
    let policy: meatspace_domain::Policy = config.policy.clone().into();
    policy.check().context("invalid task policy")?;
    let store = connect(&config.database_url, policy, &options)
        .await
        .with_context(|| format!("open the store at {}", redact_url(&config.database_url)))?;
    if store.backend() == BackendKind::Sqlite {
        tracing::warn!(
            "SQLite only signals changes within one process: deadlines that another process \
             (the API server) creates are seen within --max-sleep-seconds, not at once. The API \
             server runs these reconcilers itself for SQLite."
        );
    }

    let listener = TcpListener::bind(config.listen_addr)
        .await
        .with_context(|| format!("listen on {}", config.listen_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /livez, /readyz and /metrics");
    let (stop_http, http_stopped) = watch::channel(false);
    let http = tokio::spawn(
        axum::serve(listener, health::router(store.clone(), handle))
            .with_graceful_shutdown(async move {
                let mut stopped = http_stopped;
                let _ = stopped.wait_for(|s| *s).await;
            })
            .into_future(),
    );

    let mut controller_config =
        meatspace_controller::ControllerConfig::from(config.controller.clone()).with_policy(policy);
    controller_config.webhooks.server_key = Some(server_key.clone());
    controller_config.notify.server_key = Some(server_key);
    controller_config.notify.links_origin = config.public_url.clone();
    let result = meatspace_controller::run(store, controller_config, shutdown_signal()).await;
    // Probes keep answering until the reconcilers have finished their batches.
    let _ = stop_http.send(true);
    http.await
        .context("health server task")?
        .context("health server")?;
    result.context("controller")?;
    Ok(())
}

/// Resolves on SIGTERM (Kubernetes) or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}
