//! A real SMTP server for the notification suites: aiosmtpd (PyPI, through
//! `scripts/smtp-server.sh`), listening on 127.0.0.1 and keeping every
//! message it receives in a Maildir that the test reads.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::free_port;

/// One message as received, parsed.
#[derive(Debug, Clone)]
pub struct Received {
    pub to: String,
    pub subject: String,
    /// Every header, as (name, value).
    pub headers: Vec<(String, String)>,
    pub text: String,
    pub html: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The running server; stopped on drop.
#[derive(Debug)]
pub struct SmtpServer {
    pub port: u16,
    child: Child,
    maildir: tempfile::TempDir,
}

impl SmtpServer {
    /// Installs aiosmtpd if it is missing (a prerequisite: failing to is a
    /// failed test, never a skip), starts it and waits until it accepts
    /// connections.
    pub async fn start() -> SmtpServer {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/smtp-server.sh");
        let out = crate::run_ok(
            tokio::process::Command::new(&script).arg("python"),
            "scripts/smtp-server.sh python",
        )
        .await;
        let python = String::from_utf8(out.stdout)
            .expect("a path")
            .trim()
            .to_owned();
        let maildir = tempfile::tempdir().expect("a Maildir");
        let port = free_port();
        let child = Command::new(python)
            .args(["-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            // A path that does not exist yet: Python's Maildir creates its
            // tmp/, new/ and cur/ only then.
            .arg(maildir.path().join("mail"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start aiosmtpd");
        let server = SmtpServer {
            port,
            child,
            maildir,
        };
        crate::eventually(
            Duration::from_secs(30),
            "aiosmtpd to accept connections",
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()
                    .map(drop)
            },
        )
        .await;
        server
    }

    /// Every message received so far, oldest first.
    pub fn messages(&self) -> Vec<Received> {
        let mut files: Vec<_> = ["new", "cur"]
            .iter()
            .filter_map(|d| std::fs::read_dir(self.maildir.path().join("mail").join(d)).ok())
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        files.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
        files
            .iter()
            .map(|p| parse(&std::fs::read(p).expect("read a received message")))
            .collect()
    }
}

fn parse(raw: &[u8]) -> Received {
    let mail = mailparse::parse_mail(raw).expect("a well-formed message");
    let headers: Vec<(String, String)> = mail
        .headers
        .iter()
        .map(|h| (h.get_key(), h.get_value()))
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let part = |mime: &str| {
        mail.subparts
            .iter()
            .chain(std::iter::once(&mail))
            .find(|p| p.ctype.mimetype == mime)
            .and_then(|p| p.get_body().ok())
            .unwrap_or_default()
    };
    Received {
        to: find("To"),
        subject: find("Subject"),
        text: part("text/plain"),
        html: part("text/html"),
        headers,
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
