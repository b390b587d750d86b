//! Configuration: [`ControllerConfig`] is what [`run`](crate::run) needs,
//! [`ControllerArgs`] is its command-line and environment form (flattened by
//! both binaries, so the API server running the reconcilers in-process reads
//! the same variables), and [`Config`] is the whole `meatspace-controller`
//! command line.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::TimeDelta;
use meatspace_domain::policy::PolicyArgs;
use meatspace_store::redact_url;

#[cfg(feature = "kubernetes")]
use crate::leader::LeaseSettings;
#[cfg(feature = "kubernetes")]
use crate::mirror::MirrorSettings;
use crate::notify::{NotifySettings, SmtpSettings, SmtpTls};
#[cfg(feature = "kubernetes")]
use crate::requests::RequestSettings;
use crate::telemetry::LogFormat;
use crate::webhooks::{AllowList, WebhookSettings};

/// Tuning of the reconcilers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// How long a terminal task (with its events and photos) is kept.
    pub retention: TimeDelta,
    /// How long a purged task's tombstone (its id and token digest) is kept,
    /// so that its agent is told 404 (gone) rather than 401 (wrong token).
    /// Past it the token is just unknown; without a limit the tombstones
    /// would grow for ever.
    pub tombstone_retention: TimeDelta,
    /// How often retention looks for terminal tasks past the retention
    /// period. A second of precision does not matter here, so it polls; each
    /// poll is one index probe when nothing is old enough.
    pub retention_interval: Duration,
    /// Most tasks changed in one transaction. Larger batches cost fewer
    /// commits; smaller ones hold row locks for less time and spread the
    /// work across replicas more evenly.
    pub batch_size: u32,
    /// Longest sleep between two reads of the earliest deadline. Change
    /// notifications normally wake the controller; this is the safety net
    /// for one that was lost (a notification connection reconnecting, or a
    /// SQLite database written by another process).
    pub max_sleep: Duration,
    /// Mirror tasks into Kubernetes custom resources; `None` leaves it off.
    #[cfg(feature = "kubernetes")]
    pub mirror: Option<MirrorSettings>,
    /// Webhook delivery.
    pub webhooks: WebhookSettings,
    pub notify: NotifySettings,
    /// Where every reconciler reads the time: the system's, or in tests one
    /// the test moves past a deadline (the expiry reconciler wakes when it
    /// moves).
    pub clock: meatspace_domain::clock::Clock,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerArgs::default().into()
    }
}

/// Command-line and environment form of [`ControllerConfig`].
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Seconds a terminal task (with its events and photos) is kept before
    /// it is deleted; afterwards the API answers 404 for it. Default 30 days.
    #[arg(long, env = "MEATSPACE_RETENTION_SECONDS", default_value_t = 30 * 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_seconds: u64,
    /// Seconds a deleted task's tombstone is kept: until then its agent
    /// token gets 404 (the task is gone), afterwards 401 like any unknown
    /// token. Default 30 days.
    #[arg(long, env = "MEATSPACE_TOMBSTONE_RETENTION_SECONDS", default_value_t = 30 * 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub tombstone_retention_seconds: u64,
    /// Seconds between two retention sweeps.
    #[arg(long, env = "MEATSPACE_RETENTION_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_interval_seconds: u64,
    /// Most tasks the controller changes in one transaction.
    #[arg(long, env = "MEATSPACE_CONTROLLER_BATCH_SIZE", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,
    /// Longest time, in seconds, the controller sleeps without re-reading
    /// the earliest deadline (a safety net for lost change notifications).
    #[arg(long, env = "MEATSPACE_CONTROLLER_MAX_SLEEP_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sleep_seconds: u64,
    #[cfg(feature = "kubernetes")]
    #[command(flatten)]
    pub mirror: MirrorArgs,
    #[command(flatten)]
    pub webhooks: WebhookArgs,
    #[command(flatten)]
    pub notify: NotifyArgs,
}

/// How workers are notified. Email needs an SMTP server
/// (`MEATSPACE_SMTP_HOST`); Web Push needs nothing more than the server
/// key.
#[derive(Clone, clap::Args, derive_more::Debug)]
pub struct NotifyArgs {
    /// SMTP server for email notifications; without one no email is sent.
    #[arg(long, env = "MEATSPACE_SMTP_HOST")]
    pub smtp_host: Option<String>,
    /// SMTP port (default: 587 with STARTTLS, 465 with TLS, 25 without).
    #[arg(long, env = "MEATSPACE_SMTP_PORT")]
    pub smtp_port: Option<u16>,
    /// How the SMTP connection is protected: `starttls`, `tls` or `none`.
    #[arg(long, env = "MEATSPACE_SMTP_TLS", value_enum, default_value_t = SmtpTls::Starttls)]
    pub smtp_tls: SmtpTls,
    #[arg(long, env = "MEATSPACE_SMTP_USERNAME")]
    pub smtp_username: Option<String>,
    #[arg(long, env = "MEATSPACE_SMTP_PASSWORD", hide_env_values = true)]
    #[debug(skip)]
    pub smtp_password: Option<String>,
    /// The From of every email.
    #[arg(
        long,
        env = "MEATSPACE_SMTP_FROM",
        default_value = "meatspace <notify@meatspace.invalid>"
    )]
    pub smtp_from: String,
    /// Most notifications one worker gets per hour on each channel.
    #[arg(long, env = "MEATSPACE_NOTIFY_HOURLY_CAP", default_value_t = meatspace_domain::notify::DEFAULT_HOURLY_CAP,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub notify_hourly_cap: u32,
    /// Seconds before an assignment lapses that its holder is warned.
    #[arg(long, env = "MEATSPACE_NOTIFY_LAPSE_NOTICE_SECONDS", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub notify_lapse_notice_seconds: u64,
    #[arg(long, env = "MEATSPACE_NOTIFY_RETRY_BASE_SECONDS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub notify_retry_base_seconds: u64,
    /// A notification still failing this long after it was made is dropped.
    #[arg(long, env = "MEATSPACE_NOTIFY_GIVE_UP_SECONDS", default_value_t = 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub notify_give_up_seconds: u64,
    /// Push endpoints outside the public internet that may be reached
    /// (comma-separated CIDRs, like MEATSPACE_WEBHOOK_ALLOW).
    #[arg(long, env = "MEATSPACE_PUSH_ALLOW", default_value = "")]
    pub push_allow: AllowList,
    /// The contact push services see in the VAPID signature.
    #[arg(
        long,
        env = "MEATSPACE_PUSH_CONTACT",
        default_value = "mailto:operator@meatspace.invalid"
    )]
    pub push_contact: String,
}

impl Default for NotifyArgs {
    fn default() -> Self {
        let d = NotifySettings::default();
        NotifyArgs {
            smtp_host: None,
            smtp_port: None,
            smtp_tls: SmtpTls::Starttls,
            smtp_username: None,
            smtp_password: None,
            smtp_from: "meatspace <notify@meatspace.invalid>".into(),
            notify_hourly_cap: d.hourly_cap,
            notify_lapse_notice_seconds: d.lapse_notice.as_secs(),
            notify_retry_base_seconds: d.retry_base.as_secs(),
            notify_give_up_seconds: d.give_up_after.as_secs(),
            push_allow: AllowList::default(),
            push_contact: d.push_contact,
        }
    }
}

impl From<NotifyArgs> for NotifySettings {
    fn from(a: NotifyArgs) -> Self {
        let port = a.smtp_port.unwrap_or(match a.smtp_tls {
            SmtpTls::Starttls => 587,
            SmtpTls::Tls => 465,
            SmtpTls::None => 25,
        });
        NotifySettings {
            smtp: a
                .smtp_host
                .filter(|h| !h.is_empty())
                .map(|host| SmtpSettings {
                    host,
                    port,
                    tls: a.smtp_tls,
                    username: a.smtp_username,
                    password: a.smtp_password,
                    from: a.smtp_from,
                }),
            hourly_cap: a.notify_hourly_cap,
            lapse_notice: Duration::from_secs(a.notify_lapse_notice_seconds),
            retry_base: Duration::from_secs(a.notify_retry_base_seconds),
            give_up_after: Duration::from_secs(a.notify_give_up_seconds),
            push_allow: a.push_allow,
            push_contact: a.push_contact,
            ..NotifySettings::default()
        }
    }
}

/// Command-line and environment form of [`WebhookSettings`] (the server
/// key comes separately: `MEATSPACE_SECRET_KEY`).
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Non-public networks webhooks may be delivered to, as comma-separated
    /// CIDRs (e.g. `127.0.0.1/32,10.20.0.0/16`). Loopback, private,
    /// link-local and metadata addresses are refused unless listed here.
    #[arg(long, env = "MEATSPACE_WEBHOOK_ALLOW", default_value = "")]
    pub webhook_allow: AllowList,
    /// Seconds before the first retry of a failed delivery; each further
    /// retry waits twice as long (with random jitter).
    #[arg(long, env = "MEATSPACE_WEBHOOK_RETRY_BASE_SECONDS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_retry_base_seconds: u64,
    /// Longest wait between two delivery attempts, in seconds.
    #[arg(long, env = "MEATSPACE_WEBHOOK_RETRY_MAX_SECONDS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_retry_max_seconds: u64,
    /// Seconds of failed attempts after which an endpoint is disabled
    /// (default 26 h; at least 24 h is the contract).
    #[arg(long, env = "MEATSPACE_WEBHOOK_GIVE_UP_SECONDS", default_value_t = 26 * 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_give_up_seconds: u64,
    /// Seconds one delivery attempt may take.
    #[arg(long, env = "MEATSPACE_WEBHOOK_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=60))]
    pub webhook_timeout_seconds: u64,
}

impl Default for WebhookArgs {
    fn default() -> Self {
        WebhookArgs {
            webhook_allow: AllowList::default(),
            webhook_retry_base_seconds: 5,
            webhook_retry_max_seconds: 3600,
            webhook_give_up_seconds: 26 * 3600,
            webhook_timeout_seconds: 10,
        }
    }
}

impl From<WebhookArgs> for WebhookSettings {
    fn from(a: WebhookArgs) -> Self {
        WebhookSettings {
            allow: a.webhook_allow,
            retry_base: Duration::from_secs(a.webhook_retry_base_seconds),
            retry_max: Duration::from_secs(a.webhook_retry_max_seconds),
            give_up_after: Duration::from_secs(a.webhook_give_up_seconds),
            timeout: Duration::from_secs(a.webhook_timeout_seconds),
            server_key: None,
        }
    }
}

/// Command-line and environment form of [`MirrorSettings`].
#[cfg(feature = "kubernetes")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MirrorArgs {
    /// Mirror every task as a MeatspaceTask custom resource (needs a
    /// kubeconfig or in-cluster service account, and the CRD installed).
    #[arg(long, env = "MEATSPACE_MIRROR_ENABLED", default_value_t = false, action = clap::ArgAction::Set)]
    pub mirror_enabled: bool,
    /// Namespace of the MeatspaceTask resources (default: POD_NAMESPACE, else "default").
    #[arg(long, env = "MEATSPACE_MIRROR_NAMESPACE")]
    pub mirror_namespace: Option<String>,
    /// Kubeconfig file (default: the in-cluster service account).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Seconds between two full resyncs of the mirror (a safety net; changes
    /// are mirrored as they happen).
    #[arg(long, env = "MEATSPACE_MIRROR_RESYNC_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub mirror_resync_seconds: u64,
    /// Mirror only while holding a coordination.k8s.io Lease, so that one
    /// of several replicas does it.
    #[arg(long, env = "MEATSPACE_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the Lease.
    #[arg(
        long,
        env = "MEATSPACE_LEASE_NAME",
        default_value = "meatspace-controller"
    )]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Namespace of this pod: holds the Lease, and the default mirror namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Turn MeatspaceTask resources that agents apply in the mirror
    /// namespace (spec.origin: Requested) into tasks, keeping each agent
    /// token in a Secret owned by its resource (needs the mirror, and
    /// create/get/patch/delete on Secrets there).
    #[arg(long, env = "MEATSPACE_REQUESTS_ENABLED", default_value_t = false, action = clap::ArgAction::Set)]
    pub requests_enabled: bool,
    /// Record Kubernetes Events on requested resources (worker issues, the
    /// end of the task); needs create/patch on Events in the mirror namespace.
    #[arg(long, env = "MEATSPACE_KUBERNETES_EVENTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub kubernetes_events: bool,
}

#[cfg(feature = "kubernetes")]
impl MirrorArgs {
    fn settings(&self) -> Option<MirrorSettings> {
        if !self.mirror_enabled {
            return None;
        }
        let home = self
            .pod_namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let identity = self
            .pod_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("meatspace-controller-{}", uuid::Uuid::new_v4().simple()));
        Some(MirrorSettings {
            namespace: self
                .mirror_namespace
                .clone()
                .unwrap_or_else(|| home.clone()),
            kubeconfig: self.kubeconfig.clone(),
            resync_interval: Duration::from_secs(self.mirror_resync_seconds),
            lease: self.leader_election.then(|| LeaseSettings {
                name: self.lease_name.clone(),
                namespace: home,
                identity,
                duration: Duration::from_secs(15),
            }),
            // The binary puts its lifetime policy in (`with_policy`).
            requests: self.requests_enabled.then(|| RequestSettings {
                policy: meatspace_domain::Policy::default(),
                events: self.kubernetes_events,
                resync_interval: Duration::from_secs(self.mirror_resync_seconds),
            }),
        })
    }
}

impl Default for ControllerArgs {
    fn default() -> Self {
        Self {
            retention_seconds: 30 * 24 * 3600,
            tombstone_retention_seconds: 30 * 24 * 3600,
            retention_interval_seconds: 60,
            batch_size: 500,
            max_sleep_seconds: 10,
            #[cfg(feature = "kubernetes")]
            mirror: MirrorArgs {
                mirror_resync_seconds: 300,
                lease_name: "meatspace-controller".to_owned(),
                ..MirrorArgs::default()
            },
            webhooks: WebhookArgs::default(),
            notify: NotifyArgs::default(),
        }
    }
}

impl ControllerConfig {
    /// Sets the task lifetime policy that requested tasks are created with
    /// (the binaries' `--default-lifetime-seconds` and bounds, the same as
    /// the API server's).
    #[cfg_attr(not(feature = "kubernetes"), allow(unused_mut, unused_variables))]
    pub fn with_policy(mut self, policy: meatspace_domain::Policy) -> Self {
        #[cfg(feature = "kubernetes")]
        if let Some(requests) = self.mirror.as_mut().and_then(|m| m.requests.as_mut()) {
            requests.policy = policy;
        }
        self
    }
}

impl From<ControllerArgs> for ControllerConfig {
    fn from(a: ControllerArgs) -> Self {
        let seconds = |n: u64| {
            TimeDelta::seconds(i64::try_from(n).unwrap_or(i64::MAX))
                .min(TimeDelta::days(365 * 1000))
        };
        ControllerConfig {
            retention: seconds(a.retention_seconds),
            tombstone_retention: seconds(a.tombstone_retention_seconds),
            retention_interval: Duration::from_secs(a.retention_interval_seconds),
            batch_size: a.batch_size,
            max_sleep: Duration::from_secs(a.max_sleep_seconds),
            #[cfg(feature = "kubernetes")]
            mirror: a.mirror.settings(),
            webhooks: a.webhooks.into(),
            notify: a.notify.into(),
            clock: meatspace_domain::clock::Clock::system(),
        }
    }
}

/// The `meatspace-controller` command line. Every flag has an environment
/// variable, listed by `--help`.
#[derive(Clone, clap::Parser, derive_more::Debug)]
#[command(
    name = "meatspace-controller",
    version,
    about = "meatspace controller: expires tasks at their deadlines, reopens abandoned \
             assignments and deletes terminal tasks after the retention period. Run one or \
             more replicas against the same PostgreSQL database."
)]
pub struct Config {
    /// Database URL: postgres://user:password@host:port/db (production) or
    /// sqlite://path (the embedded default, which the API server normally
    /// reconciles itself).
    #[arg(long, env = "DATABASE_URL")]
    #[debug("{:?}", redact_url(database_url))]
    pub database_url: String,
    /// Address of the /livez, /readyz and /metrics endpoints.
    #[arg(
        long,
        env = "MEATSPACE_CONTROLLER_LISTEN_ADDR",
        default_value = "127.0.0.1:9091"
    )]
    pub listen_addr: SocketAddr,
    /// Largest number of database connections this replica opens.
    #[arg(long, env = "MEATSPACE_CONTROLLER_DB_MAX_CONNECTIONS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub db_max_connections: u32,
    /// Log filter, in tracing's EnvFilter syntax (e.g. `info,meatspace_controller=debug`).
    #[arg(long = "log", env = "RUST_LOG", default_value = "info")]
    pub log: String,
    /// Log format: `text` for people, `json` for log collectors.
    #[arg(long, env = "MEATSPACE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Server secret key, the same as the API server's: derives the
    /// webhook signing secrets. Required: without it the controller
    /// refuses to start, since it could not sign any webhook.
    #[arg(long, env = "MEATSPACE_SECRET_KEY", hide_env_values = true)]
    #[debug(skip)]
    pub secret_key: Option<String>,
    /// Where people open meatspace (scheme://host[:port]): the origin of
    /// the links in notifications.
    #[arg(
        long,
        env = "MEATSPACE_PUBLIC_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub public_url: String,
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_command_line_is_consistent() {
        Config::command().debug_assert();
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let c = Config::try_parse_from(["meatspace-controller", "--database-url", "sqlite://x.db"])
            .unwrap();
        let cfg = ControllerConfig::from(c.controller);
        assert_eq!(cfg, ControllerConfig::default());
        assert_eq!(cfg.retention, TimeDelta::days(30));
        assert_eq!(c.listen_addr, "127.0.0.1:9091".parse().unwrap());
    }

    #[test]
    fn the_database_password_never_reaches_the_log() {
        let c = Config::try_parse_from([
            "meatspace-controller",
            "--database-url",
            "postgres://u:hunter2@db:5432/meatspace",
        ])
        .unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("postgres://u:***@db:5432/meatspace"),
            "{shown}"
        );
    }

    #[test]
    fn a_zero_batch_size_is_rejected() {
        let r = Config::try_parse_from([
            "meatspace-controller",
            "--database-url",
            "sqlite://x.db",
            "--batch-size",
            "0",
        ]);
        assert!(r.is_err());
    }
}
