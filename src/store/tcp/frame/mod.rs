//! torch TCPStore wire format: pure, incremental encode/decode of every request and reply.
//!
//! A request is one `u8` query type followed by type-specific fields; a reply has no tag, its
//! shape follows from the request. Integers are little-endian (torch `memcpy`s host values and
//! every platform with torch wheels is little-endian); keys and values are `u64 length || bytes`.
//! The byte-level description, with where the test vectors come from, is `docs/tcpstore-protocol.md`.
//!
//! Decoding is incremental: a decoder is fed the bytes received so far and answers "need more",
//! "complete frame of n bytes" or a protocol error. It remembers how far it has scanned, so a
//! large frame that trickles in is walked once, and every length and count is checked against
//! the frame limit before anything is allocated or waited for.
//!
//! # muster extensions
//!
//! Opcodes from 0xF0 up, far from torch's (0x00..=0x12); torch servers close the connection on
//! them, so a muster client learns at once that it is talking to a plain torch store.
//!
//! * `SET_SESSION` 0xF0 — `str key, bytes value`; no reply. A SET whose key is bound to the
//!   connection that wrote it: when that connection closes, the key is deleted (waking watchers).
//!   A later `SET_SESSION` from another connection takes the key over; `SET`/`MULTI_SET` (which
//!   replace the value wholesale) and `DELETE_KEY` unbind it; in-place updates (`ADD`, `APPEND`,
//!   `COMPARE_SET`, `BARRIER`) keep it bound, as a Redis TTL survives `INCR` but not `SET`.
//! * `WATCH` 0xF1 — `u8 mode (0 = exact key, 1 = key prefix), str pattern`; agents' (tagged)
//!   connections only. Answered by a tagged event `u8 kind, str key` of kind 0 = `WATCHING`
//!   (key = its pattern); from then on the connection also gets tagged events of kind
//!   1 = `WRITTEN` (the value was set or changed by any request) and 2 = `DELETED` (`DELETE_KEY`,
//!   owner of a session key gone, store cleared) for every key it matches, between its replies.
//!   Watch first, then read the current state, to miss nothing.
//! * `HELLO` 0xF2 — `u32 version, bytes token`; muster's agents send it as their first request
//!   instead of `VALIDATE`. The reply is one tagged `u8`: [`HELLO_OK`], or [`HELLO_REFUSED`] (the
//!   server holds a job token and this is not it) after which the server closes. From then on the
//!   connection is **tagged**: every server-to-client message starts with [`TAG_REPLY`] (the
//!   reply to the oldest request awaiting one, in the shape its request implies) or [`TAG_EVENT`]
//!   (a watch event `u8 kind, str key`), so replies and events share one connection and an agent
//!   needs one connection in all. `WAIT`/`BARRIER`, whose replies come late, are refused there (a
//!   tagged client waits by watching). Only tagged connections may touch keys under the
//!   protected prefix (muster's own, `/muster/`): see `state`.
//! * `UNWATCH` 0xF3 — `u8 mode, str pattern`; no reply. Ends one `WATCH` of this connection.

mod reply;
mod request;
mod scan;

pub use reply::{Reply, ReplyDecoder, ReplyShape};
pub use request::{Request, RequestDecoder};

use thiserror::Error;

use scan::Field;

/// The magic number of `VALIDATE`, the first request of every torch client.
pub const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;
/// Reply byte of `CHECK` when every key exists.
pub const CHECK_READY: u8 = 0;
/// Reply byte of `CHECK` when a key is missing.
pub const CHECK_NOT_READY: u8 = 1;
/// Reply byte of `WAIT`/`BARRIER` once satisfied.
pub const STOP_WAITING: u8 = 0;
/// Reply byte of `CANCEL_WAIT`.
pub const WAIT_CANCELED: u8 = 1;
/// The tagged protocol's version, sent in `HELLO`.
pub const HELLO_VERSION: u32 = 1;
/// Reply byte of `HELLO`: this connection is an agent's and tagged from now on.
pub const HELLO_OK: u8 = 0;
/// Reply byte of `HELLO`: wrong (or missing) job token; the server closes the connection.
pub const HELLO_REFUSED: u8 = 1;
/// First byte of a tagged reply.
pub const TAG_REPLY: u8 = 0;
/// First byte of a tagged watch event.
pub const TAG_EVENT: u8 = 1;

/// Why a byte stream is not a valid frame. Every variant means the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("unknown query type 0x{0:02x}")]
    UnknownQuery(u8),
    #[error("frame needs more than the {limit}-byte limit (max_frame_bytes)")]
    TooLarge { limit: usize },
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

/// Query types: torch 2.15's `QueryType` (values are wire bytes) plus muster's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Query {
    Validate = 0x00,
    Set = 0x01,
    CompareSet = 0x02,
    Get = 0x03,
    Add = 0x04,
    Check = 0x05,
    Wait = 0x06,
    GetNumKeys = 0x07,
    DeleteKey = 0x08,
    Append = 0x09,
    MultiGet = 0x0a,
    MultiSet = 0x0b,
    CancelWait = 0x0c,
    Ping = 0x0d,
    QueuePush = 0x0e,
    QueuePop = 0x0f,
    QueueLen = 0x10,
    ListKeys = 0x11,
    Barrier = 0x12,
    SetSession = 0xf0,
    Watch = 0xf1,
    Hello = 0xf2,
    Unwatch = 0xf3,
}

impl Query {
    pub fn from_byte(byte: u8) -> Option<Query> {
        use Query::*;
        Some(match byte {
            0x00 => Validate,
            0x01 => Set,
            0x02 => CompareSet,
            0x03 => Get,
            0x04 => Add,
            0x05 => Check,
            0x06 => Wait,
            0x07 => GetNumKeys,
            0x08 => DeleteKey,
            0x09 => Append,
            0x0a => MultiGet,
            0x0b => MultiSet,
            0x0c => CancelWait,
            0x0d => Ping,
            0x0e => QueuePush,
            0x0f => QueuePop,
            0x10 => QueueLen,
            0x11 => ListKeys,
            0x12 => Barrier,
            0xf0 => SetSession,
            0xf1 => Watch,
            0xf2 => Hello,
            0xf3 => Unwatch,
            _ => return None,
        })
    }

    /// The fields after the type byte, in wire order.
    fn fields(self) -> &'static [Field] {
        use Field::*;
        use Query::*;
        match self {
            Validate | Ping => &[U32],
            Set | Append | QueuePush | SetSession => &[Bytes, Bytes],
            CompareSet => &[Bytes, Bytes, Bytes],
            Get | DeleteKey | QueuePop | QueueLen => &[Bytes],
            Add | Barrier => &[Bytes, I64],
            Check | Wait | MultiGet => &[BytesList],
            MultiSet => &[PairList],
            GetNumKeys | CancelWait | ListKeys => &[],
            Watch | Unwatch => &[U8, Bytes],
            Hello => &[U32, Bytes],
        }
    }
}

/// What a `WATCH` matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WatchMode {
    Key = 0,
    Prefix = 1,
}

/// The kind of a watch-mode event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    Watching = 0,
    Written = 1,
    Deleted = 2,
}

/// Appends `u64 len || bytes`.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

pub fn put_i64(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

/// Appends a watch-mode event.
pub fn put_event(out: &mut Vec<u8>, kind: EventKind, key: &[u8]) {
    out.push(kind as u8);
    put_bytes(out, key);
}

#[cfg(test)]
pub(crate) mod tests;
