//! An error as one line of text for a person to read.

/// An error and its causes on one line, each cause once: libraries often
/// repeat their source's text in their own message (reqwest and the client
/// both name the failed request, sqlx its database error), and a message
/// that says the same thing three times hides what it says.
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut cause = Some(error);
    while let Some(e) = cause {
        let text = e.to_string();
        if !text.is_empty() && !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        cause = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn causes_follow_once_each() {
        let inner = Layer("connection refused", None);
        let middle = Layer(
            "connect to 127.0.0.1:5432: connection refused",
            Some(Box::new(inner)),
        );
        let outer = Layer("open the database", Some(Box::new(middle)));
        assert_eq!(
            one_line(&outer),
            "open the database: connect to 127.0.0.1:5432: connection refused"
        );
        assert_eq!(
            one_line(&Layer("", Some(Box::new(Layer("only", None))))),
            "only"
        );
    }
}
