//! What the rewriter replaces an `:authority` with, its limits, and why it
//! refuses a connection: shared by the frame reader and the HPACK pass.

/// What replaces an `:authority` that is not a URI authority (a unix socket
/// path, percent-encoded or not, or an abstract socket name): the name that
/// grpc-go and Kubernetes use for unix sockets.
pub const LOCALHOST: &[u8] = b"localhost";

/// The dynamic table size the client's encoder may use: the server's
/// SETTINGS_HEADER_TABLE_SIZE. fnrun's server never sends one (tonic has no
/// such option), so it is the protocol's default.
pub const SERVER_HEADER_TABLE_SIZE: usize = 4096;

/// The most bytes of one encoded header block (HEADERS and its CONTINUATION
/// frames) the rewriter holds. h2 itself takes at most six frames of 16 KiB
/// for a block (hyper's 16 KiB header list limit); a larger one ends the
/// connection.
pub const MAX_BLOCK: usize = 128 << 10;

/// The most a decoded header list may weigh (the RFC's size: name, value and
/// 32 bytes a field), four times hyper's limit: h2 still answers a list over
/// its own limit as it does without the rewriter; a larger one ends the
/// connection.
pub const MAX_HEADER_LIST: usize = 64 << 10;

/// Why the rewriter stopped passing the connection on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the header block is not valid HPACK")]
    Hpack,
    #[error("the header block is larger than {MAX_BLOCK} bytes")]
    BlockTooLarge,
    #[error("the header list weighs more than {MAX_HEADER_LIST} bytes")]
    ListTooLarge,
    #[error("a HEADERS frame's padding or priority does not fit in it")]
    BadPadding,
    #[error("a header block is interrupted or continued out of turn")]
    Continuation,
    #[error("a client sent PUSH_PROMISE")]
    PushPromise,
}
