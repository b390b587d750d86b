//! A parser for `text/event-stream` (the WHATWG Server-Sent Events format),
//! fed with the body's chunks as they arrive. It is small enough to own:
//! lines end with LF, CRLF or CR; `:` starts a comment (the heartbeat);
//! `data` lines join with LF; a blank line dispatches the message.

/// One dispatched message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    /// `id:` of the message (the event id), if it had one.
    pub id: Option<String>,
    /// `event:` of the message; "message" when absent.
    pub event: String,
    pub data: String,
}

#[derive(Debug, Default)]
pub(crate) struct Parser {
    /// Bytes of a line not yet terminated.
    line: Vec<u8>,
    /// A CR ended the last line: a following LF belongs to it.
    after_cr: bool,
    id: Option<String>,
    event: Option<String>,
    data: Option<String>,
}

impl Parser {
    /// Feeds a chunk; returns the messages it completed.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Vec<Message> {
        let mut out = Vec::new();
        for &b in chunk {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(m) = self.line_done(&line) {
                        out.push(m);
                    }
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    fn line_done(&mut self, line: &[u8]) -> Option<Message> {
        if line.is_empty() {
            let data = self.data.take();
            let event = self.event.take();
            let id = self.id.take();
            // A message without data is not dispatched (per the spec).
            return data.map(|data| Message {
                id,
                event: event.unwrap_or_else(|| "message".into()),
                data,
            });
        }
        if line[0] == b':' {
            return None; // comment: a heartbeat
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "event" => self.event = Some(value.to_owned()),
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {} // retry and unknown fields: not used
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_messages_split_anywhere() {
        let stream = b": keep-alive\n\nid: 7\nevent: worker.message\ndata: {\"a\":1}\n\n\
                       id: 8\r\nevent: task.completed\r\ndata: x\r\ndata: y\r\n\r\n";
        // Every way of cutting the stream into two chunks gives the same messages.
        for cut in 0..stream.len() {
            let mut p = Parser::default();
            let mut got = p.feed(&stream[..cut]);
            got.extend(p.feed(&stream[cut..]));
            assert_eq!(
                got,
                vec![
                    Message {
                        id: Some("7".into()),
                        event: "worker.message".into(),
                        data: "{\"a\":1}".into()
                    },
                    Message {
                        id: Some("8".into()),
                        event: "task.completed".into(),
                        data: "x\ny".into()
                    },
                ],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn comments_and_incomplete_messages_dispatch_nothing() {
        let mut p = Parser::default();
        assert!(p.feed(b": keep-alive\n\n: keep-alive\n\n").is_empty());
        assert!(p.feed(b"id: 3\nevent: x\ndata: partial").is_empty());
        assert_eq!(p.feed(b"\n\n").len(), 1);
    }

    #[test]
    fn a_lone_cr_ends_a_line() {
        let mut p = Parser::default();
        let got = p.feed(b"data: a\rdata: b\r\r");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data, "a\nb");
    }
}
