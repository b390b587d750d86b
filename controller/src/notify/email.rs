//! Email over SMTP (lettre, with rustls): plain text and HTML, and the
//! unsubscribe link in the body and in `List-Unsubscribe` (one click,
//! RFC 8058).

use std::time::Duration;

use askama::Template;
use lettre::message::header::{self, Header, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use meatspace_domain::notify;

use super::Sent;

/// How the connection to the SMTP server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SmtpTls {
    /// None: a server on the same host or network only.
    None,
    /// STARTTLS on the submission port (587), required.
    #[default]
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
}

/// Where and how email is sent.
#[derive(Clone, PartialEq, Eq, derive_more::Debug)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    pub tls: SmtpTls,
    pub username: Option<String>,
    /// Never reaches a log.
    #[debug(skip)]
    pub password: Option<String>,
    /// The `From` of every message, e.g. `meatspace <notify@example.com>`.
    pub from: String,
}

/// The HTML part; askama escapes every value for HTML.
#[derive(Template)]
#[template(path = "notification.html")]
struct HtmlPart<'a> {
    title: &'a str,
    body: &'a str,
    link: &'a str,
    unsubscribe: &'a str,
}

/// `List-Unsubscribe: <url>`.
#[derive(Debug, Clone)]
struct ListUnsubscribe(String);

impl Header for ListUnsubscribe {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe")
    }

    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(ListUnsubscribe(
            s.trim_start_matches('<').trim_end_matches('>').to_owned(),
        ))
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), format!("<{}>", self.0))
    }
}

/// `List-Unsubscribe-Post: List-Unsubscribe=One-Click` (RFC 8058).
#[derive(Debug, Clone)]
struct OneClick;

impl Header for OneClick {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe-Post")
    }

    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(OneClick)
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "List-Unsubscribe=One-Click".to_owned())
    }
}

/// The SMTP sender.
pub(crate) struct Email {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    server: String,
}

impl Email {
    pub(crate) fn new(settings: &SmtpSettings, timeout: Duration) -> Result<Email, String> {
        let from: Mailbox = settings
            .from
            .parse()
            .map_err(|e| format!("MEATSPACE_SMTP_FROM {:?}: {e}", settings.from))?;
        let tls = |required: bool| {
            TlsParameters::new(settings.host.clone())
                .map(|p| {
                    if required {
                        Tls::Required(p)
                    } else {
                        Tls::Wrapper(p)
                    }
                })
                .map_err(|e| format!("TLS for {}: {e}", settings.host))
        };
        let tls = match settings.tls {
            SmtpTls::None => Tls::None,
            SmtpTls::Starttls => tls(true)?,
            SmtpTls::Tls => tls(false)?,
        };
        let mut builder =
            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(settings.host.clone())
                .port(settings.port)
                .tls(tls)
                .timeout(Some(timeout));
        if let (Some(user), Some(password)) = (&settings.username, &settings.password) {
            builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
        }
        Ok(Email {
            transport: builder.build(),
            from,
            server: format!("{}:{}", settings.host, settings.port),
        })
    }

    /// Logs a warning when the SMTP server does not answer: email would
    /// wait in the outbox (and be retried) until it does.
    pub(crate) async fn check_ready(&self) {
        match self.transport.test_connection().await {
            Ok(true) => tracing::info!(server = %self.server, "the SMTP server answers"),
            Ok(false) | Err(_) => tracing::warn!(
                server = %self.server,
                "the SMTP server refuses connections: email notifications wait and are retried \
                 until it answers"
            ),
        }
    }

    pub(crate) async fn send(
        &self,
        to: &str,
        message: &notify::Message,
        link: &str,
        unsubscribe: &str,
        id: i64,
    ) -> Sent {
        let to: Mailbox = match to.parse() {
            Ok(to) => to,
            Err(e) => {
                return Sent::Failed {
                    transient: false,
                    error: format!("the worker's address: {e}"),
                };
            }
        };
        let text = format!(
            "{}\n\n{}\n\nOpen it: {link}\n\n--\nYou get this because you asked to be told. \
             Stop these emails: {unsubscribe}\n",
            message.title, message.body
        );
        let html = HtmlPart {
            title: &message.title,
            body: &message.body,
            link,
            unsubscribe,
        };
        let html = match html.render() {
            Ok(html) => html,
            Err(e) => {
                return Sent::Failed {
                    transient: false,
                    error: format!("rendering the message: {e}"),
                };
            }
        };
        // The notification's id in the Message-ID: a message sent again
        // (a crash between sending and recording) is the same message to
        // mail systems that de-duplicate.
        let domain = self.from.email.domain().to_owned();
        let email = Message::builder()
            .message_id(Some(format!("<notification-{id}@{domain}>")))
            .from(self.from.clone())
            .to(to)
            .subject(message.title.clone())
            .header(header::MIME_VERSION_1_0)
            .header(ListUnsubscribe(unsubscribe.to_owned()))
            .header(OneClick)
            .multipart(MultiPart::alternative_plain_html(text, html));
        let email = match email {
            Ok(email) => email,
            Err(e) => {
                return Sent::Failed {
                    transient: false,
                    error: format!("building the message: {e}"),
                };
            }
        };
        match self.transport.send(email).await {
            Ok(_) => Sent::Delivered,
            Err(e) => Sent::Failed {
                // A 5xx answer is the server's final word on this message.
                transient: !e.is_permanent(),
                error: e.to_string(),
            },
        }
    }
}
