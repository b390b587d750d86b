//! What the server process claims on the machine before it serves, once its
//! configuration has been checked ([`crate::config::Config::check`]): the
//! exclusive lock on the SQLite data directory, the listening socket, and
//! the development key kept next to the database.
//!
//! Each failure is a sentence that says what to do, because these are the
//! first messages a new user reads.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::auth::DevKey;

/// The file in the data directory that holds the generated development key.
pub const DEV_KEY_FILE: &str = "dev.key";
/// The file in the data directory that the running server keeps locked.
pub const LOCK_FILE: &str = "server.lock";
/// The shortest development key the server accepts.
pub const MIN_DEV_KEY_CHARS: usize = 16;

/// A start-up step that failed, with what to do about it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartupError(pub String);

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
    let fail = |e: std::io::Error| {
        StartupError(format!(
            "cannot keep the development key in {}: {e}",
            path.display()
        ))
    };
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) if !text.trim().is_empty() => {
                let key = text.trim().to_owned();
                if key.chars().count() < MIN_DEV_KEY_CHARS {
                    return Err(StartupError(format!(
                        "{} holds a development key shorter than {MIN_DEV_KEY_CHARS} \
                         characters: delete the file to have a new one generated",
                        path.display()
                    )));
                }
                return Ok(key);
            }
            // Another process created it and is still writing.
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let key = DevKey::generate();
                let mut options = OpenOptions::new();
                options.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                match options.open(&path) {
                    Ok(mut file) => {
                        file.write_all(format!("{key}\n").as_bytes())
                            .map_err(fail)?;
                        file.sync_all().map_err(fail)?;
                        return Ok(key);
                    }
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(fail(e)),
                }
            }
            Err(e) => return Err(fail(e)),
        }
    }
}

/// An error and its causes on one line, each cause once: libraries often
/// repeat their source's text in their own message, and a start-up error
/// that says the same thing three times hides what it says.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dev_key_survives_a_second_load_and_is_private() {
        let dir = tempdir();
        let first = load_or_create_dev_key(&dir).unwrap();
        assert!(first.starts_with("msd_"), "{first}");
        assert_eq!(load_or_create_dev_key(&dir).unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(DEV_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
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
