//! What the server process claims on the machine before it serves, once its
//! configuration has been checked ([`crate::config::Config::check`]): the
//! exclusive lock on the SQLite data directory, the listening socket, the
//! development and server keys kept next to the database, and the store;
//! and the `bootstrap-operator` command.
//!
//! Each failure is a sentence that says what to do, because these are the
//! first messages a new user reads.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use anyhow::Context;
use meatspace_domain::Policy;
use meatspace_store::secret::ServerKey;
use meatspace_store::{ConnectOptions, Store, redact_url};
use meatspace_store_connect::connect;

use crate::auth::DevKey;
use crate::config::{Config, Database, MIN_DEV_KEY_CHARS, StartupError};

/// The file in the data directory that holds the generated development key.
pub const DEV_KEY_FILE: &str = "dev.key";
/// The file in the data directory that the running server keeps locked.
pub const LOCK_FILE: &str = "server.lock";

/// The exclusive lock on a SQLite data directory, held for the life of the
/// process (the kernel drops it when the process dies, even by SIGKILL).
/// One process owns the database file: a second server there would run a
/// second embedded controller next to the first.
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Locks `dir`, or says which server already holds it.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, StartupError> {
        let path = dir.join(LOCK_FILE);
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path).map_err(|e| {
            StartupError(format!(
                "cannot open the lock file {}: {e}; check the permissions of the data directory",
                path.display()
            ))
        })?;
        match file.try_lock() {
            Ok(()) => Ok(DataDirLock { file, path }),
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() {
                    "another meatspace server".to_owned()
                } else {
                    format!("another meatspace server ({holder})")
                };
                Err(StartupError(format!(
                    "{who} already uses the data directory {}: one process owns its SQLite \
                     database. Stop that server, or give this one another directory \
                     (MEATSPACE_DATA_DIR or --data-dir, or another sqlite:// DATABASE_URL)",
                    dir.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => {
                Err(StartupError(format!("cannot lock {}: {e}", path.display())))
            }
        }
    }

    /// Writes where this server listens into the lock file, so a second
    /// server refused the directory can name it.
    pub fn record_address(&mut self, addr: SocketAddr) -> Result<(), StartupError> {
        let text = format!("listening on {addr}, pid {}\n", std::process::id());
        let write = |file: &mut File| -> std::io::Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(text.as_bytes())?;
            file.sync_data()
        };
        write(&mut self.file).map_err(|e| {
            StartupError(format!(
                "cannot write the lock file {}: {e}",
                self.path.display()
            ))
        })
    }
}

/// Binds the API listener; an address in use names the setting to change.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, StartupError> {
    bind_as(addr, "MEATSPACE_LISTEN_ADDR", "--listen-addr", 8080).await
}

/// Binds the `/metrics` listener, with the same advice as [`bind`].
pub async fn bind_metrics(addr: SocketAddr) -> Result<tokio::net::TcpListener, StartupError> {
    bind_as(
        addr,
        "MEATSPACE_METRICS_LISTEN_ADDR",
        "--metrics-listen-addr",
        9092,
    )
    .await
}

/// Binds `addr`, which the variable `env` (flag `flag`) chose; an example
/// address uses `port`.
async fn bind_as(
    addr: SocketAddr,
    env: &str,
    flag: &str,
    port: u16,
) -> Result<tokio::net::TcpListener, StartupError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        StartupError(match e.kind() {
            ErrorKind::AddrInUse => format!(
                "cannot listen on {addr}: the address is already in use (another meatspace \
                 server?). Stop the process that holds it, or choose another address with \
                 {env} (or {flag}), e.g. 127.0.0.1:{}",
                port + 1
            ),
            ErrorKind::AddrNotAvailable => format!(
                "cannot listen on {addr}: no network interface of this machine has that \
                 address; set {env} (or {flag}) to one it has, e.g. 127.0.0.1:{port}"
            ),
            _ => format!("cannot listen on {addr} ({env}): {e}"),
        })
    })
}

/// The development key of the embedded default: read from `dir/dev.key`,
/// or generated into it (mode 0600) on the first start, so a restart in the
/// same directory keeps the key that scripts and shells have exported.
pub fn load_or_create_dev_key(dir: &Path) -> Result<String, StartupError> {
    let path = dir.join(DEV_KEY_FILE);
    let key = meatspace_store::secret::private_file(&path, || format!("{}\n", DevKey::generate()))
        .map_err(|e| {
            StartupError(format!(
                "cannot keep the development key in {}: {e}",
                path.display()
            ))
        })?;
    if key.chars().count() < MIN_DEV_KEY_CHARS {
        return Err(StartupError(format!(
            "{} holds a development key shorter than {MIN_DEV_KEY_CHARS} characters: delete \
             the file to have a new one generated",
            path.display()
        )));
    }
    Ok(key)
}

/// An error and its causes on one line, each cause once.
pub fn one_line(e: &anyhow::Error) -> String {
    meatspace_domain::error_text::one_line(e.as_ref())
}

/// Creates the SQLite data directory and takes its lock (one process owns a
/// SQLite database and runs its embedded controller); nothing for
/// PostgreSQL.
pub fn claim_data_dir(config: &Config, database: &Database) -> anyhow::Result<Option<DataDirLock>> {
    if matches!(database, Database::Sqlite { .. }) {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("create the data directory {}", config.data_dir.display()))?;
    }
    Ok(match database {
        Database::Sqlite { dir: Some(dir) } => Some(DataDirLock::acquire(dir)?),
        _ => None,
    })
}

/// The development key the server accepts: configured, or for the embedded
/// default kept next to the data (so a restart keeps it) and printed.
pub fn dev_key(config: &Config) -> anyhow::Result<DevKey> {
    let key = match crate::config::given(&config.dev_key) {
        Some(key) => key.to_owned(),
        // Turned off: no key is accepted, so none is made or printed.
        None if !config.dev_key_enabled => DevKey::generate(),
        None => {
            // `check` refused PostgreSQL without a key: this is SQLite.
            let key = load_or_create_dev_key(&config.data_dir)?;
            // Printed on purpose: the embedded default has no other way to
            // hand the developer a key. Never done with PostgreSQL.
            println!(
                "meatspace dev key (kept in {}; set MEATSPACE_DEV_KEY to choose one): {key}",
                config.data_dir.join(DEV_KEY_FILE).display()
            );
            key
        }
    };
    Ok(DevKey::new(&key).with_enabled(config.dev_key_enabled))
}

/// The server key: configured, or for the embedded default generated once
/// and kept next to the database (0600), so replays and webhook secrets
/// survive a restart. Never generated for PostgreSQL: several replicas and
/// the controller must share one key (`check` refuses it without one).
pub fn server_key(config: &Config) -> anyhow::Result<ServerKey> {
    match crate::config::given(&config.secret_key) {
        Some(text) => ServerKey::from_text(text).context("MEATSPACE_SECRET_KEY"),
        None => ServerKey::load_or_create(&config.data_dir).context("the server secret key"),
    }
}

/// Opens (and migrates) the store, saying what to check when PostgreSQL
/// does not answer, and stores the operator key the configuration gives.
pub async fn open_store(config: &Config, database: &Database) -> anyhow::Result<Arc<dyn Store>> {
    let url = config.database_url();
    let options = ConnectOptions {
        max_connections: config.db_max_connections,
        acquire_timeout: std::time::Duration::from_secs(config.db_acquire_timeout_seconds),
    };
    let store = connect(&url, config.policy.clone().into(), &options)
        .await
        .map_err(|e| {
            let hint = match (database, e.is_unavailable()) {
                (Database::Postgres, true) => {
                    " (is PostgreSQL running and reachable, and does DATABASE_URL name it?)"
                }
                _ => "",
            };
            let cause = one_line(&anyhow::Error::new(e));
            anyhow::anyhow!("open the database {}: {cause}{hint}", redact_url(&url))
        })?;
    tracing::info!(database = %redact_url(&url), "store ready");
    if let Some(key) = crate::config::given(&config.bootstrap_operator_key)
        && crate::access::store_configured_key(store.as_ref(), key)
            .await
            .context("MEATSPACE_BOOTSTRAP_OPERATOR_KEY")?
    {
        tracing::info!("stored the operator key given by configuration");
    }
    Ok(store)
}

/// `bootstrap-operator`: opens the database (migrating it), stores a new
/// operator with one key, prints the key once.
pub async fn bootstrap_operator(
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
    let key = crate::access::bootstrap_operator(store.as_ref(), name).await?;
    // The one place the key is shown; it is stored only as a digest.
    println!("{key}");
    eprintln!(
        "operator key for {name:?} printed above; it is shown once. Use it as \
         Authorization: Bearer <key> (or MEATSPACE_API_KEY for the CLI)."
    );
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dev_key_survives_a_second_load() {
        let dir = tempdir();
        let first = load_or_create_dev_key(&dir).unwrap();
        assert!(first.starts_with("msd_"), "{first}");
        assert_eq!(load_or_create_dev_key(&dir).unwrap(), first);
        std::fs::write(dir.join(DEV_KEY_FILE), "short\n").unwrap();
        let e = load_or_create_dev_key(&dir).unwrap_err();
        assert!(e.0.contains("shorter than 16"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_second_lock_names_the_first_holder() {
        let dir = tempdir();
        let mut first = DataDirLock::acquire(&dir).unwrap();
        first
            .record_address("127.0.0.1:4242".parse().unwrap())
            .unwrap();
        let e = DataDirLock::acquire(&dir).unwrap_err();
        assert!(e.0.contains("listening on 127.0.0.1:4242"), "{e}");
        drop(first);
        DataDirLock::acquire(&dir).expect("free again once the holder is gone");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn repeated_causes_are_said_once() {
        let inner = std::io::Error::other("(code: 14) unable to open database file");
        let e = anyhow::Error::new(inner)
            .context("database unavailable: (code: 14) unable to open database file")
            .context("open the database sqlite://x.db");
        assert_eq!(
            one_line(&e),
            "open the database sqlite://x.db: database unavailable: (code: 14) unable to open \
             database file"
        );
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("meatspace-startup-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
