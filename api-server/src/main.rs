//! `meatspace-api-server`: parse configuration, open the store, serve.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use meatspace_api::agent_integrations::Integrations;
use meatspace_api::auth::DevKey;
use meatspace_api::config::{Config, Database};
use meatspace_api::photo::PhotoLimits;
use meatspace_api::startup::{self, DataDirLock};
use meatspace_api::{AppState, Settings, router, serve, telemetry};
use meatspace_domain::Policy;
use meatspace_store::secret::ServerKey;
use meatspace_store::{ConnectOptions, redact_url};
use meatspace_store_connect::connect;
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
    if let Some(meatspace_api::config::Subcommand::BootstrapOperator { name }) = &config.command {
        return bootstrap_operator(&config, &database, name).await;
    }
    let public_origin = config.public_origin()?;
    let url = config.database_url();
    let sqlite = matches!(database, Database::Sqlite { .. });
    if sqlite {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("create the data directory {}", config.data_dir.display()))?;
    }
    // One process owns a SQLite database (and runs its embedded controller).
    let mut lock = match &database {
        Database::Sqlite { dir: Some(dir) } => Some(DataDirLock::acquire(dir)?),
        _ => None,
    };
    let listener = startup::bind(config.listen_addr).await?;
    let addr = listener.local_addr()?;
    if let Some(lock) = lock.as_mut() {
        lock.record_address(addr)?;
    }
    let dev_key = match config.dev_key.as_deref().filter(|k| !k.is_empty()) {
        Some(key) => key.to_owned(),
        // Turned off: no key is accepted, so none is made or printed.
        None if !config.dev_key_enabled => DevKey::generate(),
        None => {
            // `check` refused PostgreSQL without a key: this is SQLite. The
            // key is kept next to the data, so a restart keeps it.
            let key = startup::load_or_create_dev_key(&config.data_dir)?;
            // Printed on purpose: the embedded default has no other way to
            // hand the developer a key. Never done with PostgreSQL.
            println!(
                "meatspace dev key (kept in {}; set MEATSPACE_DEV_KEY to choose one): {key}",
                config.data_dir.join(startup::DEV_KEY_FILE).display()
            );
            key
        }
    };

    // The server key: configured, or for the embedded default generated once
    // and kept next to the database (0600), so replays and webhook secrets
    // survive a restart. Never generated for PostgreSQL: several replicas
    // and the controller must share one key.
    let server_key = match config.secret_key.as_deref().filter(|k| !k.is_empty()) {
        Some(text) => ServerKey::from_text(text).context("MEATSPACE_SECRET_KEY")?,
        None => ServerKey::load_or_create(&config.data_dir).context("the server secret key")?,
    };

    let policy: Policy = config.policy.clone().into();
    let options = ConnectOptions {
        max_connections: config.db_max_connections,
        acquire_timeout: std::time::Duration::from_secs(config.db_acquire_timeout_seconds),
    };
    let store = connect(&url, policy, &options).await.map_err(|e| {
        let hint = match (&database, e.is_unavailable()) {
            (Database::Postgres, true) => {
                " (is PostgreSQL running and reachable, and does DATABASE_URL name it?)"
            }
            _ => "",
        };
        let cause = startup::one_line(&anyhow::Error::new(e));
        anyhow::anyhow!("open the database {}: {cause}{hint}", redact_url(&url))
    })?;
    tracing::info!(database = %redact_url(&url), "store ready");
    if let Some(key) = config
        .bootstrap_operator_key
        .as_deref()
        .filter(|k| !k.is_empty())
        && meatspace_api::access::store_configured_key(store.as_ref(), key)
            .await
            .context("MEATSPACE_BOOTSTRAP_OPERATOR_KEY")?
    {
        tracing::info!("stored the operator key given by configuration");
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    // The embedded default runs the reconcilers here, so one process is the
    // whole system.
    let controller = config.run_controller_here().then(|| {
        let store = Arc::clone(&store);
        let mut controller_config =
            meatspace_controller::ControllerConfig::from(config.controller.clone())
                .with_policy(policy);
        controller_config.webhooks.server_key = Some(server_key.clone());
        let mut rx = stop_rx.clone();
        tokio::spawn(async move {
            meatspace_controller::run(store, controller_config, async move {
                let _ = rx.wait_for(|stop| *stop).await;
            })
            .await
        })
    });
    let state = AppState::build(
        store,
        Settings {
            clock: meatspace_domain::clock::Clock::system(),
            dev_key: DevKey::new(&dev_key).with_enabled(config.dev_key_enabled),
            policy,
            photo_limits: PhotoLimits {
                max_pixels: config.max_photo_pixels,
                max_task_bytes: config.max_photo_bytes_per_task,
                decode_memory: meatspace_api::photo::DecodeMemory::new(
                    config.photo_decode_memory_bytes,
                ),
                ..PhotoLimits::new(config.max_photo_bytes, config.max_photo_dimension)
            },
            rate_limit: config.rate_limit(),
            integrations: Integrations {
                server_key: server_key.clone(),
                sse_heartbeat: std::time::Duration::from_secs(config.sse_heartbeat_seconds),
                idempotency_ttl: chrono::TimeDelta::seconds(
                    i64::try_from(config.idempotency_ttl_seconds).unwrap_or(86_400),
                ),
                webhook_allow: config.controller.webhooks.webhook_allow.clone(),
                webhook_give_up: std::time::Duration::from_secs(
                    config.controller.webhooks.webhook_give_up_seconds,
                ),
            },
            mcp_allowed_hosts: meatspace_mcp::AllowedHosts::parse(&config.mcp_allowed_hosts),
            public_origin,
        },
    );
    tokio::spawn({
        let mut rx = stop_rx.clone();
        meatspace_api::access::upkeep(
            Arc::clone(&state.store),
            state.clock.clone(),
            state.credentials.clone(),
            chrono::TimeDelta::days(i64::from(config.audit_retention_days)),
            async move {
                let _ = rx.wait_for(|stop| *stop).await;
            },
        )
    });
    tokio::spawn(meatspace_api::metrics::upkeep(state.metrics.clone()));
    let shutdown = {
        let mut rx = stop_rx.clone();
        let feed = state.feed.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
            // Long polls answer now rather than hold the shutdown up.
            feed.close();
        }
    };
    tokio::spawn(async move {
        shutdown_signal().await;
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
    let metrics = {
        let mut rx = stop_rx.clone();
        let app = meatspace_api::metrics::router(state.metrics.clone());
        tokio::spawn(serve(
            metrics_listener,
            app,
            meatspace_api::ServeOptions {
                max_connections: 64,
                ..meatspace_api::ServeOptions::default()
            },
            async move {
                let _ = rx.wait_for(|stop| *stop).await;
            },
        ))
    };
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

/// `bootstrap-operator`: opens the database (migrating it), stores a new
/// operator with one key, prints the key once.
async fn bootstrap_operator(
    config: &Config,
    database: &Database,
    name: &str,
) -> anyhow::Result<()> {
    if matches!(database, Database::Sqlite { .. }) {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("create the data directory {}", config.data_dir.display()))?;
    }
    let url = config.database_url();
    let policy: Policy = config.policy.clone().into();
    let store = connect(&url, policy, &ConnectOptions::default())
        .await
        .with_context(|| format!("open the database {}", redact_url(&url)))?;
    let key = meatspace_api::access::bootstrap_operator(store.as_ref(), name).await?;
    // The one place the key is shown; it is stored only as a digest.
    println!("{key}");
    eprintln!(
        "operator key for {name:?} printed above; it is shown once. Use it as \
         Authorization: Bearer <key> (or MEATSPACE_API_KEY for the CLI)."
    );
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
