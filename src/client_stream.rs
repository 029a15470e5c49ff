//! The byte streams a client session runs over ([`ClientStream`]): plain TCP, and TLS
//! (rustls) over TCP. The session ([`crate::connection`]) is generic over them, so the plain
//! path is the TCP socket itself: no boxing, no extra copy, no lock per request.
//!
//! Invariants:
//! - [`ReplyWriter::try_write`] never waits: it hands the stream what it takes now, or says
//!   `WouldBlock`. Bytes it accepted count as handed to the socket (for TLS: encrypted into
//!   rustls' send buffer, the equivalent of the kernel's).
//! - A TLS writer may hold encrypted bytes the socket did not take yet
//!   ([`ReplyWriter::has_buffered`]); the session keeps waiting for [`ReplyWriter::ready`]
//!   (which flushes them) until it holds none, so no reply is stranded in rustls' buffer.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// A client's connection, before it is split into its reading and writing halves.
pub trait ClientStream: Send + 'static {
    type Reader: AsyncRead + Send + Unpin + 'static;
    type Writer: ReplyWriter + 'static;
    /// The TCP socket underneath (addresses).
    fn tcp(&self) -> &TcpStream;
    fn split(self) -> (Self::Reader, Self::Writer);
}

/// The writing half of a client's connection.
pub trait ReplyWriter: Send {
    /// Resolves once a write may make progress.
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Writes what the stream takes now, without waiting (`WouldBlock` when nothing).
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize>;
    /// Bytes accepted by [`ReplyWriter::try_write`] that are not on the socket yet.
    fn has_buffered(&self) -> bool;
}

impl ClientStream for TcpStream {
    type Reader = OwnedReadHalf;
    type Writer = OwnedWriteHalf;

    fn tcp(&self) -> &TcpStream {
        self
    }

    fn split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        self.into_split()
    }
}

impl ReplyWriter for OwnedWriteHalf {
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        self.writable()
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        OwnedWriteHalf::try_write(self, buf)
    }

    fn has_buffered(&self) -> bool {
        false
    }
}

/// A client over TLS, its handshake done.
pub type TlsClient = TlsStream<TcpStream>;

impl ClientStream for TlsClient {
    type Reader = tokio::io::ReadHalf<TlsClient>;
    type Writer = TlsWriter;

    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }

    fn split(self) -> (Self::Reader, TlsWriter) {
        let (rd, wr) = tokio::io::split(self);
        (
            rd,
            TlsWriter {
                inner: wr,
                buffered: false,
            },
        )
    }
}

/// The writing half of a TLS client.
pub struct TlsWriter {
    inner: tokio::io::WriteHalf<TlsClient>,
    /// The last write or flush left encrypted bytes the socket did not take.
    buffered: bool,
}

impl ReplyWriter for TlsWriter {
    async fn ready(&mut self) -> io::Result<()> {
        // Flushing waits until the socket took every encrypted byte: then more can be written.
        self.inner.flush().await?;
        self.buffered = false;
        Ok(())
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Polled once without a waker: `ready` is what waits.
        let mut cx = Context::from_waker(Waker::noop());
        let written = match Pin::new(&mut self.inner).poll_write(&mut cx, buf) {
            Poll::Ready(result) => result?,
            Poll::Pending => return Err(io::ErrorKind::WouldBlock.into()),
        };
        self.buffered = match Pin::new(&mut self.inner).poll_flush(&mut cx) {
            Poll::Ready(result) => {
                result?;
                false
            }
            Poll::Pending => true,
        };
        Ok(written)
    }

    fn has_buffered(&self) -> bool {
        self.buffered
    }
}

/// The peer's and our address of a client's socket.
pub fn addresses(stream: &impl ClientStream) -> io::Result<(SocketAddr, SocketAddr)> {
    let tcp = stream.tcp();
    Ok((tcp.peer_addr()?, tcp.local_addr()?))
}
