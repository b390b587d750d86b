//! Configuration of the API server: every setting is a flag with an
//! environment variable, documented in `--help`.

use std::net::SocketAddr;
use std::path::PathBuf;

use meatspace_domain::policy::PolicyArgs;
use meatspace_store::redact_url;
use secrecy::{ExposeSecret, SecretString};

/// The shortest development key the server accepts.
pub const MIN_DEV_KEY_CHARS: usize = 16;

/// A start-up step that failed, with what to do about it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartupError(pub String);

/// Whether the controller's reconcilers run inside the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EmbeddedController {
    /// With SQLite (one process owns the file), not with PostgreSQL.
    Auto,
    Always,
    Never,
}

/// One-off administration commands of the server binary.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Subcommand {
    /// Creates an operator principal with one operator key, prints the key
    /// once on stdout and exits: the first key of an install, made without
    /// any key (runs the migrations first).
    BootstrapOperator {
        /// The operator's display name.
        #[arg(long, default_value = "operator")]
        name: String,
    },
}

/// The text of a key given by configuration, unless it is unset or empty
/// (an empty environment variable counts as unset).
pub fn given(secret: &Option<SecretString>) -> Option<&str> {
    secret
        .as_ref()
        .map(ExposeSecret::expose_secret)
        .filter(|s| !s.is_empty())
}

/// meatspace API server: the agent contract and the worker API. Its Debug
/// form shows neither the secrets nor a database URL's password.
#[derive(Clone, clap::Parser, derive_more::Debug)]
#[command(name = "meatspace-api-server", version, about)]
pub struct Config {
    /// Database: postgres://… (production) or sqlite://… . Unset means a
    /// SQLite file in --data-dir.
    #[debug("{:?}", database_url.as_deref().map(redact_url))]
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,

    /// Directory of the embedded SQLite database (used when DATABASE_URL is unset).
    #[arg(long, env = "MEATSPACE_DATA_DIR", default_value = ".meatspace")]
    pub data_dir: PathBuf,

    /// Development key that creates tasks and registers workers (header
    /// x-meatspace-dev-key). Required with PostgreSQL; with SQLite a random
    /// one is generated and printed at start when unset.
    #[arg(long, env = "MEATSPACE_DEV_KEY", hide_env_values = true)]
    pub dev_key: Option<SecretString>,

    /// Accept the development key. When false it is refused with a problem
    /// that says how to get an API key, and each refusal (at most one a
    /// minute) is written to the audit trail. Turn it off anywhere but a
    /// developer's machine.
    #[arg(long, env = "MEATSPACE_DEV_KEY_ENABLED", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub dev_key_enabled: bool,

    /// An operator key given by configuration (`msk_<32 hex>_<secret>`, at
    /// least 32 characters of secret): at start its digest is stored as a
    /// key of the principal "bootstrap operator" unless a key with its id
    /// exists (revoked or not). The Helm chart generates one in a Secret.
    #[arg(long, env = "MEATSPACE_BOOTSTRAP_OPERATOR_KEY", hide_env_values = true)]
    pub bootstrap_operator_key: Option<SecretString>,

    /// Days an audit entry is kept.
    #[arg(long, env = "MEATSPACE_AUDIT_RETENTION_DAYS", default_value_t = 365,
          value_parser = clap::value_parser!(u32).range(1..=36_500))]
    pub audit_retention_days: u32,

    #[command(subcommand)]
    pub command: Option<Subcommand>,

    /// Address to listen on.
    #[arg(long, env = "MEATSPACE_LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen_addr: SocketAddr,

    /// Address of the Prometheus `/metrics` endpoint, a listener of its own
    /// so that the public address (and an Ingress in front of it) never
    /// serves it. Port 0 picks a free port (logged at start).
    #[arg(
        long,
        env = "MEATSPACE_METRICS_LISTEN_ADDR",
        default_value = "127.0.0.1:9092"
    )]
    pub metrics_listen_addr: SocketAddr,

    /// Run the controller (expiry, retention) inside this process.
    #[arg(
        long,
        env = "MEATSPACE_EMBEDDED_CONTROLLER",
        value_enum,
        default_value = "auto"
    )]
    pub embedded_controller: EmbeddedController,

    /// Largest photo upload, in bytes.
    #[arg(long, env = "MEATSPACE_MAX_PHOTO_BYTES", default_value_t = 10 * 1024 * 1024)]
    pub max_photo_bytes: usize,

    /// Largest photo width or height, in pixels.
    #[arg(long, env = "MEATSPACE_MAX_PHOTO_DIMENSION", default_value_t = 8192)]
    pub max_photo_dimension: u32,

    /// Largest photo in pixels in all (width × height), read from the
    /// image header before anything is decoded.
    #[arg(long, env = "MEATSPACE_MAX_PHOTO_PIXELS", default_value_t = crate::photo::DEFAULT_MAX_PIXELS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_photo_pixels: u64,

    /// Most photo bytes (as stored, after re-encoding) one task may hold;
    /// further uploads are refused with 413 photo-quota-exceeded.
    #[arg(long, env = "MEATSPACE_MAX_PHOTO_BYTES_PER_TASK", default_value_t = crate::photo::DEFAULT_MAX_TASK_BYTES)]
    pub max_photo_bytes_per_task: u64,

    /// Memory all photo decodes in flight may use together, in bytes
    /// (whole MiB): each reserves what its header says it needs and waits
    /// for room; a photo needing more than all of it is refused (413).
    #[arg(long, env = "MEATSPACE_PHOTO_DECODE_MEMORY_BYTES", default_value_t = crate::photo::DEFAULT_DECODE_MEMORY_BYTES,
          value_parser = clap::value_parser!(u64).range(1024 * 1024..))]
    pub photo_decode_memory_bytes: u64,

    /// Largest number of database connections.
    #[arg(long, env = "MEATSPACE_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// Seconds a request waits for a database connection before answering 503.
    #[arg(
        long,
        env = "MEATSPACE_DB_ACQUIRE_TIMEOUT_SECONDS",
        default_value_t = 1
    )]
    pub db_acquire_timeout_seconds: u64,

    /// Seconds a client has to send a request's headers, from the
    /// connection's start or the end of the previous response: slow
    /// (slowloris) and idle keep-alive connections are closed after it, as
    /// is an HTTP/2 connection that carried no request for as long.
    #[arg(long, env = "MEATSPACE_HEADER_READ_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout_seconds: u64,

    /// Most client connections open at once. Past it new clients wait to be
    /// accepted. Each costs a file descriptor: the server raises its soft
    /// `ulimit -n` to the hard limit at start-up and lowers this cap (with
    /// a warning) when the limit cannot hold it and a reserve of 256 plus
    /// the database connections.
    #[arg(long, env = "MEATSPACE_MAX_CONNECTIONS", default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,

    /// Requests one HTTP/2 connection may have in flight at once (HTTP/2
    /// with prior knowledge is served on the same port as HTTP/1.1; each
    /// long poll or event stream is one request).
    #[arg(long, env = "MEATSPACE_HTTP2_MAX_STREAMS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub http2_max_streams: u32,

    /// Requests per second one credential (dev key, agent or worker token,
    /// once verified; the client's IP address before that, and without
    /// one) may keep up on every route; beyond it the answer is 429 with
    /// Retry-After. 0 turns limiting off.
    #[arg(long, env = "MEATSPACE_RATE_LIMIT_PER_SECOND", default_value_t = 100)]
    pub rate_limit_per_second: u32,

    /// Requests one credential may send in a burst after being idle.
    #[arg(long, env = "MEATSPACE_RATE_LIMIT_BURST", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_limit_burst: u32,

    /// Failed authentications (401, or an invite code that is not valid)
    /// per minute one client address may keep up; past it the address
    /// gets 429 for requests that carry no verified credential. 0 turns
    /// this limit off.
    #[arg(long, env = "MEATSPACE_AUTH_FAILURES_PER_MINUTE", default_value_t = 60)]
    pub auth_failures_per_minute: u32,

    /// Failed authentications one address may make at once.
    #[arg(long, env = "MEATSPACE_AUTH_FAILURES_BURST", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub auth_failures_burst: u32,

    /// Event streams and long polls one credential may hold open at once;
    /// beyond it 429 too-many-streams. 0: no cap.
    #[arg(
        long,
        env = "MEATSPACE_MAX_STREAMS_PER_CREDENTIAL",
        default_value_t = 32
    )]
    pub max_streams_per_credential: u32,

    /// Event streams and long polls one client address may hold open at
    /// once (all its credentials together). 0: no cap.
    #[arg(
        long,
        env = "MEATSPACE_MAX_STREAMS_PER_ADDRESS",
        default_value_t = 1024
    )]
    pub max_streams_per_address: u32,

    /// Host names (or host:port) the MCP endpoint /mcp accepts in the Host
    /// header, comma-separated; `*` accepts any. Empty (the default): only
    /// localhost, 127.0.0.1 and ::1, which guards a local server against
    /// DNS rebinding. Behind an Ingress, list its public host names.
    #[arg(long, env = "MEATSPACE_MCP_ALLOWED_HOSTS", default_value = "")]
    pub mcp_allowed_hosts: String,

    /// The URL people and agents open, as an origin
    /// (`https://meatspace.example.com`): every absolute link (invite links)
    /// is made from it, and cookies are `Secure` exactly when it is https.
    /// Required unless the server listens on a loopback address; there,
    /// unset, links follow the request's Host and X-Forwarded-Proto.
    #[arg(long, env = "MEATSPACE_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Log format: text or json. Log level comes from RUST_LOG (default info).
    #[arg(long, env = "MEATSPACE_LOG_FORMAT", default_value = "text")]
    pub log_format: crate::http::telemetry::LogFormat,

    /// Server secret key (at least 32 characters, e.g. `openssl rand
    /// -base64 32`): seals the answers replayed for Idempotency-Key and
    /// derives webhook signing secrets. Give the controller the same key.
    /// Required with PostgreSQL; with SQLite one is generated once and kept
    /// in --data-dir/secret.key (mode 0600) when unset.
    #[arg(long, env = "MEATSPACE_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<SecretString>,

    /// Seconds between the `: keep-alive` comments of event streams.
    #[arg(long, env = "MEATSPACE_SSE_HEARTBEAT_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub sse_heartbeat_seconds: u64,

    /// Seconds an Idempotency-Key answer is replayed (default 24 h).
    #[arg(long, env = "MEATSPACE_IDEMPOTENCY_TTL_SECONDS", default_value_t = 24 * 3600,
          value_parser = clap::value_parser!(u64).range(60..=30 * 24 * 3600))]
    pub idempotency_ttl_seconds: u64,

    #[command(flatten)]
    pub policy: PolicyArgs,

    /// Settings of the embedded controller (used when it runs here).
    #[command(flatten)]
    pub controller: meatspace_controller::ControllerArgs,
}

impl Config {
    /// What the server is configured with, given the keys resolved at
    /// start-up ([`crate::startup`]).
    pub fn settings(
        &self,
        dev_key: crate::auth::DevKey,
        server_key: meatspace_store::secret::ServerKey,
        public_origin: crate::public_url::PublicOrigin,
    ) -> crate::Settings {
        use crate::photo::{DecodeMemory, PhotoLimits};
        let webhooks = &self.controller.webhooks;
        crate::Settings {
            clock: meatspace_domain::clock::Clock::system(),
            dev_key,
            policy: self.policy.clone().into(),
            photo_limits: PhotoLimits {
                max_pixels: self.max_photo_pixels,
                max_task_bytes: self.max_photo_bytes_per_task,
                decode_memory: DecodeMemory::new(self.photo_decode_memory_bytes),
                ..PhotoLimits::new(self.max_photo_bytes, self.max_photo_dimension)
            },
            rate_limit: self.rate_limit(),
            integrations: crate::agent_integrations::Integrations {
                sse_heartbeat: std::time::Duration::from_secs(self.sse_heartbeat_seconds),
                idempotency_ttl: chrono::TimeDelta::seconds(
                    i64::try_from(self.idempotency_ttl_seconds).unwrap_or(86_400),
                ),
                webhook_allow: webhooks.webhook_allow.clone(),
                webhook_give_up: std::time::Duration::from_secs(webhooks.webhook_give_up_seconds),
                ..crate::agent_integrations::Integrations::new(server_key)
            },
            mcp_allowed_hosts: meatspace_mcp::AllowedHosts::parse(&self.mcp_allowed_hosts),
            public_origin,
        }
    }

    /// The HTTP server's connection limits.
    pub fn serve_options(&self) -> crate::ServeOptions {
        crate::ServeOptions {
            header_read_timeout: std::time::Duration::from_secs(self.header_read_timeout_seconds),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            http2_max_streams: self.http2_max_streams,
        }
    }

    /// The per-credential request limits.
    pub fn rate_limit(&self) -> crate::http::rate_limit::RateLimitSettings {
        crate::http::rate_limit::RateLimitSettings {
            per_second: std::num::NonZeroU32::new(self.rate_limit_per_second),
            burst: std::num::NonZeroU32::new(self.rate_limit_burst)
                .unwrap_or(std::num::NonZeroU32::MIN),
            auth_failures_per_minute: std::num::NonZeroU32::new(self.auth_failures_per_minute),
            auth_failures_burst: std::num::NonZeroU32::new(self.auth_failures_burst)
                .unwrap_or(std::num::NonZeroU32::MIN),
            max_streams_per_credential: std::num::NonZeroU32::new(self.max_streams_per_credential),
            max_streams_per_address: std::num::NonZeroU32::new(self.max_streams_per_address),
        }
    }

    /// The public origin in effect (see [`crate::public_url`]), or why the
    /// configuration cannot run.
    pub fn public_origin(
        &self,
    ) -> Result<crate::public_url::PublicOrigin, crate::public_url::PublicUrlError> {
        crate::public_url::PublicOrigin::for_listener(self.public_url.as_deref(), self.listen_addr)
    }

    /// The database URL in effect.
    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("meatspace.db").display()),
        }
    }

    pub fn is_sqlite(&self) -> bool {
        self.database_url().starts_with("sqlite:")
    }

    pub fn run_controller_here(&self) -> bool {
        match self.embedded_controller {
            EmbeddedController::Auto => self.is_sqlite(),
            EmbeddedController::Always => true,
            EmbeddedController::Never => false,
        }
    }
}

/// Where the data lives, as [`Config::check`] read `DATABASE_URL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    Postgres,
    /// A SQLite file in `dir` (locked by the server), or an in-memory
    /// database (`None`: nothing on disk to lock).
    Sqlite {
        dir: Option<PathBuf>,
    },
}

// ---- start-up validation ----------------------------------------------------
// Everything that can be wrong with the configuration is found here, before
// the server creates a directory, generates or prints a key, binds a port or
// opens a database; each message says what to set.
impl Config {
    /// Checks the configuration as a whole; the first problem is the error.
    pub fn check(&self) -> Result<Database, StartupError> {
        let fail = |s: String| Err(StartupError(s));
        let database = match self.database_url.as_deref().map(str::trim) {
            None => Database::Sqlite {
                dir: Some(self.data_dir.clone()),
            },
            Some("") => {
                return fail(
                    "DATABASE_URL is empty: unset it to keep the data in --data-dir \
                     (SQLite), or set postgres://USER:PASSWORD@HOST/DB or sqlite://PATH"
                        .into(),
                );
            }
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Database::Postgres
            }
            Some(url) if url.starts_with("sqlite:") => sqlite_dir(url)?,
            Some(url) => {
                let shown = redact_url(url);
                return fail(match url.split_once("://") {
                    Some((scheme, _)) => format!(
                        "DATABASE_URL {shown} uses {scheme}://, which meatspace does not \
                         support: use postgres://USER:PASSWORD@HOST/DB (PostgreSQL) or \
                         sqlite://PATH (a SQLite file), or unset it for the embedded default"
                    ),
                    None => format!(
                        "DATABASE_URL {shown} is not a URL: for a SQLite file write \
                         sqlite://{url}; for PostgreSQL postgres://USER:PASSWORD@HOST/DB"
                    ),
                });
            }
        };
        let postgres = database == Database::Postgres;
        match given(&self.dev_key) {
            Some(key) if key.chars().count() < MIN_DEV_KEY_CHARS => {
                return fail(format!(
                    "MEATSPACE_DEV_KEY is {} characters long; use at least {MIN_DEV_KEY_CHARS} \
                     (e.g. the output of `openssl rand -base64 24`)",
                    key.chars().count()
                ));
            }
            None if postgres && self.dev_key_enabled && self.command.is_none() => {
                return fail(
                    "MEATSPACE_DEV_KEY must be set when the database is PostgreSQL (at least \
                     16 characters, e.g. `openssl rand -base64 24`), or turned off with \
                     MEATSPACE_DEV_KEY_ENABLED=false; only the embedded SQLite default \
                     generates one"
                        .into(),
                );
            }
            _ => {}
        }
        if let Some(key) = given(&self.bootstrap_operator_key)
            && let Err(e) = crate::access::configured_key_id(key)
        {
            return fail(e.to_string());
        }
        match given(&self.secret_key) {
            Some(text) => {
                if let Err(e) = meatspace_store::secret::ServerKey::from_text(text) {
                    return fail(format!(
                        "MEATSPACE_SECRET_KEY: {e} (e.g. the output of `openssl rand -base64 32`)"
                    ));
                }
            }
            None if postgres => {
                return fail(
                    "MEATSPACE_SECRET_KEY must be set when the database is PostgreSQL (at \
                     least 32 characters, e.g. `openssl rand -base64 32`; give the controller \
                     the same one)"
                        .into(),
                );
            }
            None => {}
        }
        let policy: meatspace_domain::Policy = self.policy.clone().into();
        if let Err(e) = policy.check() {
            return fail(format!("invalid task policy: {e}"));
        }
        Ok(database)
    }
}

/// The directory of a `sqlite:` URL's file, which must exist: SQLite
/// creates the file but not its directory, and then only says "unable to
/// open database file".
fn sqlite_dir(url: &str) -> Result<Database, StartupError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or_default();
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path == ":memory:" || rest.contains("mode=memory") {
        return Ok(Database::Sqlite { dir: None });
    }
    let file = std::path::Path::new(path);
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(StartupError(format!(
            "the directory {} of the SQLite database in DATABASE_URL does not exist: create it \
             (mkdir -p {}), or unset DATABASE_URL to keep the data in --data-dir",
            dir.display(),
            dir.display()
        )));
    }
    Ok(Database::Sqlite { dir: Some(dir) })
}

#[cfg(test)]
mod check_tests {
    use clap::Parser;

    use super::*;

    fn check(env: &[&str]) -> Result<Database, String> {
        let mut args = vec!["meatspace-api-server"];
        args.extend_from_slice(env);
        Config::try_parse_from(args)
            .expect("parses")
            .check()
            .map_err(|e| e.0)
    }

    #[test]
    fn each_mistake_gets_its_own_message() {
        // Each wrong setting, and what its message must say.
        let cases: [(&[&str], &[&str]); 6] = [
            (&["--database-url", "mysql://u:pw@h/db"], &["uses mysql://"]),
            (&["--database-url", "data.db"], &["write sqlite://data.db"]),
            (
                &["--database-url", "sqlite:///no/such/dir/x.db"],
                &["/no/such/dir", "does not exist"],
            ),
            (
                &["--database-url", "postgres://h/db"],
                &["MEATSPACE_DEV_KEY must be set"],
            ),
            (&["--dev-key", "short"], &["at least 16"]),
            (&["--secret-key", "short"], &["MEATSPACE_SECRET_KEY", "32"]),
        ];
        for (args, says) in cases {
            let e = check(args).unwrap_err();
            assert!(says.iter().all(|s| e.contains(s)), "{args:?}: {e}");
        }
        // A database URL's password is never repeated.
        let e = check(&["--database-url", "mysql://u:pw@h/db"]).unwrap_err();
        assert!(!e.contains("pw"), "{e}");
        assert_eq!(
            check(&["--data-dir", "/tmp/x"]).unwrap(),
            Database::Sqlite {
                dir: Some("/tmp/x".into())
            }
        );
    }
    #[test]
    fn debug_shows_no_key_and_no_password() {
        let config = Config::try_parse_from([
            "meatspace-api-server",
            "--database-url",
            "postgres://u:hunter2-password@h/db",
            "--dev-key",
            "dev-key-0123456789",
            "--secret-key",
            "server-key-0123456789abcdef0123456789",
            "--bootstrap-operator-key",
            "msk_00000000000000000000000000000000_opsecret",
        ])
        .expect("parses");
        assert_eq!(given(&config.dev_key), Some("dev-key-0123456789"));
        let shown = format!("{config:?}");
        for secret in ["hunter2", "dev-key-", "server-key-", "opsecret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
}
