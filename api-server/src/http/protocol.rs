//! Which HTTP a new connection speaks. Clients may open with HTTP/1.1 or
//! with HTTP/2 "prior knowledge" (h2c, RFC 9113 §3.3: the connection starts
//! with the 24-byte client preface). HTTP/2 lets one client multiplex many
//! requests (thousands of long polls or event streams) over one connection,
//! which costs the server far less than a connection each.
//!
//! The first bytes are read here, under the header-read timeout, and then
//! given back to the chosen protocol through [`Replayed`]: a client that
//! connects and sends nothing, or trickles its first bytes, is dropped as
//! hyper's own header-read timeout drops it later in the connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// Reads the start of `stream` until it either is the HTTP/2 preface or
/// cannot be (any HTTP/1.1 request differs from it in its first bytes), and
/// returns the protocol and the stream with those bytes put back. Errors
/// when the peer closes first or `timeout` passes.
pub async fn detect(
    mut stream: TcpStream,
    timeout: Duration,
) -> io::Result<(Protocol, Replayed<TcpStream>)> {
    let mut seen = Vec::with_capacity(PREFACE.len());
    let reading = async {
        let mut chunk = [0u8; PREFACE.len()];
        loop {
            if !PREFACE.starts_with(&seen) {
                return Ok(Protocol::Http1);
            }
            if seen.len() == PREFACE.len() {
                return Ok(Protocol::Http2);
            }
            let n = stream
                .read(&mut chunk[..PREFACE.len() - seen.len()])
                .await?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            seen.extend_from_slice(&chunk[..n]);
        }
    };
    let protocol = tokio::time::timeout(timeout, reading)
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    Ok((
        protocol,
        Replayed {
            prefix: seen,
            read: 0,
            inner: stream,
        },
    ))
}

/// A stream whose first bytes were already read: reads give those back
/// first, then read the stream; writes go straight to it.
#[derive(Debug)]
pub struct Replayed<S> {
    prefix: Vec<u8>,
    read: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Replayed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.read < this.prefix.len() {
            let rest = &this.prefix[this.read..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.read += n;
            if this.read == this.prefix.len() {
                // Given back in full: free it for the connection's lifetime.
                this.prefix = Vec::new();
                this.read = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replayed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    async fn detect_after_writing(parts: &[&[u8]]) -> io::Result<(Protocol, Vec<u8>)> {
        let (mut client, server) = pair().await;
        let parts: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
        let writer = tokio::spawn(async move {
            for part in parts {
                client.write_all(&part).await.unwrap();
                client.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            client.shutdown().await.unwrap();
            client
        });
        let detected = detect(server, Duration::from_secs(30)).await;
        let _client = writer.await.unwrap();
        let (protocol, mut stream) = detected?;
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await?;
        Ok((protocol, all))
    }

    /// Writes `whole` in `pieces`: it must be detected as `protocol` and
    /// replayed byte for byte.
    async fn assert_replayed(pieces: &[&[u8]], protocol: Protocol, whole: &[u8]) {
        let (detected, bytes) = detect_after_writing(pieces).await.unwrap();
        assert_eq!(detected, protocol);
        assert_eq!(bytes, whole);
    }

    #[tokio::test]
    async fn an_http1_request_is_replayed_whole() {
        let request = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_replayed(&[&request[..3], &request[3..]], Protocol::Http1, request).await;
    }

    #[tokio::test]
    async fn the_preface_in_pieces_is_http2_and_replayed() {
        let mut opening = PREFACE.to_vec();
        opening.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0"); // an empty SETTINGS frame
        let pieces: [&[u8]; 3] = [&opening[..5], &opening[5..20], &opening[20..]];
        assert_replayed(&pieces, Protocol::Http2, &opening).await;
    }

    #[tokio::test]
    async fn a_silent_client_times_out_and_a_closed_one_errors() {
        let (_client, server) = pair().await;
        let silent = detect(server, Duration::from_millis(50)).await;
        assert_eq!(silent.unwrap_err().kind(), io::ErrorKind::TimedOut);

        let closed = detect_after_writing(&[b"PRI * HT"]).await;
        assert_eq!(closed.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
