//! The client's one error type. A problem document from the server keeps
//! its status, `type`, `title` and `detail`, so callers can branch on them
//! (`err.problem_slug() == Some("wrong-state")`) instead of parsing text.

pub use meatspace_api_types::Problem;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request with a problem document.
    #[error("{}", problem_text(.0))]
    Problem(Problem),
    /// The server answered an error that is not a problem document (a
    /// proxy in between, for example).
    #[error("HTTP {status}: {body}")]
    Http { status: u16, body: String },
    /// The server could not be reached, or the connection broke, after
    /// every retry.
    #[error("cannot reach the server: {0}")]
    Transport(#[source] reqwest::Error),
    /// A success answer the client cannot read.
    #[error("unexpected answer from the server: {0}")]
    Decode(String),
    /// The caller's input cannot be sent (an invalid base URL, say), or
    /// names a task the local state directory has no record of.
    #[error("{0}")]
    Invalid(String),
    /// The local state directory ([`crate::state`]) could not be read or
    /// written; the text names the file and the cause.
    #[error("{0}")]
    State(String),
}

/// The problem as one message: title, status and detail, then each error
/// at its JSON pointer (a result or result schema refused), one per line.
fn problem_text(p: &Problem) -> String {
    let mut text = format!("{} ({}): {}", p.title, p.status, p.detail);
    for e in &p.errors {
        let at = if e.pointer.is_empty() {
            "(the whole value)"
        } else {
            &e.pointer
        };
        text.push_str(&format!("\n  at {at}: {}", e.message));
    }
    text
}

impl Error {
    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Problem(p) => Some(p.status),
            Error::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The problem document, when the server sent one.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Problem(p) => Some(p),
            _ => None,
        }
    }

    /// The problem's slug (`wrong-state`, `not-found`, …).
    pub fn problem_slug(&self) -> Option<&str> {
        self.problem().map(Problem::slug)
    }
}
