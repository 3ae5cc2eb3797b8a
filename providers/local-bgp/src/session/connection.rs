//! The connection with the router, as messages: the next one read (an UPDATE we cannot parse is
//! skipped), one written (within a time limit), and a NOTIFICATION sent.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tracing::warn;

use super::Counters;
use crate::Error;
use crate::wire::{self, Context, Message, Notification};

/// How long a write may block before the connection counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection: the stream, what was read of it and not yet decoded, and how to decode.
pub(super) struct Connection {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) buffer: Vec<u8>,
    pub(super) context: Context,
}

impl Connection {
    /// The next message. Cancel-safe: bytes read stay in the buffer until a whole message is taken.
    pub(super) async fn next(&mut self, counters: &mut Counters) -> Result<Message, Error> {
        loop {
            match wire::decode(&self.buffer, self.context) {
                Ok(Some((message, used))) => {
                    self.buffer.drain(..used);
                    return Ok(message);
                }
                Ok(None) => {}
                Err(malformed) => {
                    if let Some(length) = wire::update_length(&self.buffer) {
                        // We use no route of the router's: skip the UPDATE, keep the session.
                        warn!(peer = %self.peer, "skipped an UPDATE: {}", malformed.reason);
                        counters.updates_malformed += 1;
                        self.buffer.drain(..length);
                        continue;
                    }
                    let _ = self
                        .send(&Message::Notification(malformed.notification.clone()))
                        .await;
                    counters.notifications_sent += 1;
                    return Err(Error::Malformed {
                        peer: self.peer,
                        malformed,
                    });
                }
            }
            self.buffer.reserve(wire::MAX_LEN);
            match self.stream.read_buf(&mut self.buffer).await {
                Ok(0) => return Err(Error::Closed { peer: self.peer }),
                Ok(_) => {}
                Err(source) => {
                    return Err(Error::Io {
                        peer: self.peer,
                        source,
                    });
                }
            }
        }
    }

    pub(super) async fn send(&mut self, message: &Message) -> Result<(), Error> {
        let bytes = wire::encode(message, self.context);
        let io = |source| Error::Io {
            peer: self.peer,
            source,
        };
        timeout(WRITE_TIMEOUT, self.stream.write_all(&bytes))
            .await
            .map_err(|_| io(std::io::ErrorKind::TimedOut.into()))?
            .map_err(io)
    }

    /// Sends a NOTIFICATION (its failure does not matter: the session ends either way).
    pub(super) async fn notify(&mut self, notification: Notification, counters: &mut Counters) {
        counters.notifications_sent += 1;
        let _ = self.send(&Message::Notification(notification)).await;
    }
}
