//! `:authority` on unix sockets.
//!
//! grpc-core (Python, C++, Ruby, PHP), grpc-java and some grpcurl versions
//! send a unix socket's path (Python since 1.57 percent-encodes it), or the
//! abstract socket's name, as the HTTP/2 `:authority` of every request. h2, the
//! HTTP/2 server under tonic, takes only a URI authority there and resets such
//! a stream with PROTOCOL_ERROR, and neither h2, hyper nor tonic has an option
//! to accept it. On a unix connection the authority names nothing the server
//! uses, so [`NormalizeAuthority`] sits between the socket and the server and
//! replaces an `:authority` that is not a URI authority with `localhost`, as
//! grpc-go and Kubernetes name a unix socket peer. TCP connections are not
//! touched. See `rewrite` for how, and `docs/design.md` for why here.

mod rewrite;
#[cfg(test)]
mod tests;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
pub use rewrite::{Rewriter, rewrite_chunked};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// How much is read from the socket at a time. A `poll_read` reads until it
/// has something to hand over: at most one header block
/// ([`rewrite::MAX_BLOCK`]) and the frame headers around it, then rewrites
/// that block in time linear in its size; reads past that are DATA and other
/// frames, which go through as they come.
const READ_CHUNK: usize = 16 << 10;

/// A unix connection whose readers see every request's `:authority` made
/// valid; writes go through untouched.
pub struct NormalizeAuthority<IO> {
    inner: IO,
    rewriter: Rewriter,
    /// Read from the socket, not yet rewritten (an incomplete frame).
    input: BytesMut,
    /// Rewritten, not yet read.
    output: BytesMut,
    eof: bool,
}

impl<IO> NormalizeAuthority<IO> {
    pub fn new(inner: IO) -> Self {
        NormalizeAuthority {
            inner,
            rewriter: Rewriter::new(),
            input: BytesMut::new(),
            output: BytesMut::new(),
            eof: false,
        }
    }

    /// Logs what the rewriter did since the last call.
    fn log(&mut self) {
        for value in self.rewriter.take_replaced() {
            let value = String::from_utf8_lossy(&value);
            tracing::debug!(
                authority = %fnrun_api::Quoted::new(&value),
                "unix connection: :authority is not a URI authority; replaced with localhost"
            );
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for NormalizeAuthority<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof || this.rewriter.refusal().is_some() {
                // An incomplete frame left at the end is dropped: the server
                // sees the connection end between frames. After a refusal,
                // handed over above, the server has its error: it sees the
                // end, and nothing more is read from the client.
                return Poll::Ready(Ok(()));
            }
            this.input.reserve(READ_CHUNK);
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.inner),
                cx,
                &mut this.input
            ))?;
            if n == 0 {
                this.eof = true;
                continue;
            }
            this.rewriter.feed(&mut this.input, &mut this.output);
            this.log();
            if let Some(why) = this.rewriter.refusal() {
                tracing::info!("unix connection refused: {why}; the server ends it");
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for NormalizeAuthority<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for NormalizeAuthority<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
