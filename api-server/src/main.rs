//! `meatspace-api-server`: parse configuration, open the store, serve.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use meatspace_api::config::{Config, Subcommand};
use meatspace_api::http::{metrics, telemetry};
use meatspace_api::{AppState, ServeOptions, router, serve, startup};
use tokio::sync::watch;

fn main() -> std::process::ExitCode {
    let config = Config::parse();
    telemetry::init(config.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line, each cause once, on stderr (and in the log).
            let text = startup::one_line(&e);
            eprintln!("error: {text}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    // Nothing is created, generated, printed, bound or opened before the
    // configuration as a whole is valid.
    let database = config.check()?;
    if let Some(Subcommand::BootstrapOperator { name }) = &config.command {
        return startup::bootstrap_operator(&config, &database, name).await;
    }
    let public_origin = config.public_origin()?;
    let mut lock = startup::claim_data_dir(&config, &database)?;
    let listener = startup::bind(config.listen_addr).await?;
    let addr = listener.local_addr()?;
    if let Some(lock) = lock.as_mut() {
        lock.record_address(addr)?;
    }
    let dev_key = startup::dev_key(&config)?;
    let server_key = startup::server_key(&config)?;
    let store = startup::open_store(&config, &database).await?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    // The embedded default runs the reconcilers here, so one process is the
    // whole system.
    let controller = config.run_controller_here().then(|| {
        let mut controller_config =
            meatspace_controller::ControllerConfig::from(config.controller.clone())
                .with_policy(config.policy.clone().into());
        controller_config.webhooks.server_key = Some(server_key.clone());
        controller_config.notify.server_key = Some(server_key.clone());
        controller_config.notify.links_origin = match &public_origin {
            meatspace_api::public_url::PublicOrigin::Configured { origin, .. } => origin.clone(),
            meatspace_api::public_url::PublicOrigin::FromRequest => format!("http://{addr}"),
        };
        tokio::spawn(meatspace_controller::run(
            Arc::clone(&store),
            controller_config,
            stopped(),
        ))
    });
    let state = AppState::build(store, config.settings(dev_key, server_key, public_origin));
    tokio::spawn(meatspace_api::access::upkeep(
        Arc::clone(&state.store),
        state.clock.clone(),
        state.credentials.clone(),
        chrono::TimeDelta::days(i64::from(config.audit_retention_days)),
        stopped(),
    ));
    tokio::spawn(metrics::upkeep(state.metrics.clone()));
    let shutdown = {
        let (stopped, feed) = (stopped(), state.feed.clone());
        async move {
            stopped.await;
            // Long polls answer now rather than hold the shutdown up.
            feed.close();
        }
    };
    tokio::spawn(async move {
        startup::shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });

    tracing::info!(%addr, embedded_controller = controller.is_some(), "listening");
    let mut serve_options = config.serve_options();
    serve_options.max_connections = usize::try_from(meatspace_api::fd_limit::raise_and_fit(
        serve_options.max_connections as u64,
        u64::from(config.db_max_connections) + 2,
    ))
    .unwrap_or(usize::MAX);
    // The metrics listener: bound before serving, so a taken port fails the
    // start rather than a scrape; it stops with the API listener.
    let metrics_listener = startup::bind_metrics(config.metrics_listen_addr).await?;
    tracing::info!(addr = %metrics_listener.local_addr()?, "serving /metrics");
    let metrics = tokio::spawn(serve(
        metrics_listener,
        metrics::router(state.metrics.clone()),
        ServeOptions {
            max_connections: 64,
            ..ServeOptions::default()
        },
        stopped(),
    ));
    serve(listener, router(state), serve_options, shutdown).await?;
    metrics
        .await
        .context("metrics listener panicked")?
        .context("metrics listener failed")?;
    if let Some(handle) = controller {
        handle
            .await
            .context("controller task panicked")?
            .context("controller failed")?;
    }
    // The data directory stays locked until the embedded controller is done.
    drop(lock);
    Ok(())
}
