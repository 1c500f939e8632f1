//! Lingering close. When foldgate answers before it read the request body to its end (a
//! 413, a 404, an upstream that answered early), the client is often still sending, and
//! most clients read nothing before their upload is done. Closing then makes the kernel
//! reset the connection and the client reports a connection error, not the answer. So,
//! like nginx, such a connection is closed in two steps: the answer, then our FIN; then
//! what the client still sends is read and discarded, for a bounded time and size.
//!
//! The router marks such a response [`UnreadBody`]; the HTTP/1.1 server
//! (`super::wire::server`) then says `connection: close` in it and ends the connection
//! with [`close`]. HTTP/2 ends a stream on its own (`RST_STREAM`) and keeps the
//! connection.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a lingering close reads at most: long enough for a client on a fast link to
/// finish an upload a little over the limit, short enough that a client that sends
/// forever holds its connection only briefly. (nginx waits up to 5 s for each further
/// read, `lingering_timeout`, and 30 s in all; one bound is simpler and cheaper.)
pub const LINGER_TIME: Duration = Duration::from_secs(5);

/// How many bytes beyond `server.max_body_size` a lingering close reads at most: a body
/// of up to 4 MiB over the limit is drained whole, so its client reads the 413.
pub const LINGER_SLACK: u64 = 4 * 1024 * 1024;

/// Drained bytes are read into a buffer of this size (allocated only when draining).
const DRAIN_CHUNK: usize = 64 * 1024;

/// Response extension: the response goes out while the request body was not read to its
/// end, so the connection must close, lingering.
#[derive(Debug, Clone, Copy)]
pub struct UnreadBody;

/// Closes `io` lingering: sends FIN (the answer is written: there is nothing more to
/// read), then reads and discards until EOF, an error, [`LINGER_TIME`] or `max_drain`
/// bytes, whichever comes first.
pub async fn close<T: AsyncRead + AsyncWrite + Unpin>(mut io: T, max_drain: u64) {
    if io.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut buf = vec![0; DRAIN_CHUNK];
        let mut left = max_drain;
        while left > 0 {
            let room = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            match io.read(&mut buf[..room]).await {
                Ok(read) if read > 0 => left -= read as u64,
                // EOF: the client is done and has read what it wanted; or it is gone.
                Ok(_) | Err(_) => break,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

#[cfg(test)]
mod tests {
    use tokio::io::duplex;

    use super::*;

    #[tokio::test]
    async fn sends_fin_then_reads_until_eof() {
        let (ours, mut client) = duplex(1024);
        client.write_all(b"rest of the upload").await.unwrap();
        let closing = tokio::spawn(close(ours, 1024));
        assert_eq!(client.read(&mut [0; 8]).await.unwrap(), 0, "FIN before draining");
        client.shutdown().await.unwrap();
        closing.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_byte_bound() {
        let (ours, mut client) = duplex(1024);
        client.write_all(&[b'x'; 64]).await.unwrap();
        let started = tokio::time::Instant::now();
        close(ours, 16).await;
        assert!(started.elapsed() < LINGER_TIME, "ended by the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_deadline() {
        let (ours, _client) = duplex(1024);
        let started = tokio::time::Instant::now();
        close(ours, 1024).await;
        assert_eq!(started.elapsed(), LINGER_TIME);
    }
}
