//! torch TCPStore wire format: pure, incremental encode/decode of every request and reply.
//!
//! A request is one `u8` query type followed by type-specific fields; a reply has no tag, its
//! shape follows from the request. Integers are little-endian (torch `memcpy`s host values and
//! every platform with torch wheels is little-endian); keys and values are `u64 length || bytes`.
//! The byte-level reference, with the test vectors used below, is `shared/reference/tcpstore.md`.
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
//! * `WATCH` 0xF1 — `u8 mode (0 = exact key, 1 = key prefix), str pattern`. Switches the
//!   connection to watch mode: from then on every server-to-client message is an event
//!   `u8 kind, str key`, kind 0 = `WATCHING` (the reply to a `WATCH`, key = its pattern),
//!   1 = `WRITTEN` (the value was set or changed by any request), 2 = `DELETED` (`DELETE_KEY`,
//!   owner of a session key gone, store cleared). A watch connection may still send requests
//!   that have no reply (`SET`, `SET_SESSION`, `APPEND`, `MULTI_SET`, `QUEUE_PUSH`) and more
//!   `WATCH`es; any other request closes it, since its reply could not be told from an event.
//!   Watch first, then read the current state on another connection, to miss nothing.

use thiserror::Error;

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
            Watch => &[U8, Bytes],
        }
    }
}

/// What a `WATCH` matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// A decoded request; keys and values borrow the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Validate {
        magic: u32,
    },
    Set {
        key: &'a [u8],
        value: &'a [u8],
    },
    CompareSet {
        key: &'a [u8],
        expected: &'a [u8],
        desired: &'a [u8],
    },
    Get {
        key: &'a [u8],
    },
    Add {
        key: &'a [u8],
        delta: i64,
    },
    Check {
        keys: Vec<&'a [u8]>,
    },
    Wait {
        keys: Vec<&'a [u8]>,
    },
    GetNumKeys,
    DeleteKey {
        key: &'a [u8],
    },
    Append {
        key: &'a [u8],
        value: &'a [u8],
    },
    MultiGet {
        keys: Vec<&'a [u8]>,
    },
    /// torch's client writes the count as `int64_t`; same 8 bytes as `u64` for valid counts.
    MultiSet {
        pairs: Vec<(&'a [u8], &'a [u8])>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
    QueuePush {
        key: &'a [u8],
        value: &'a [u8],
    },
    QueuePop {
        key: &'a [u8],
    },
    QueueLen {
        key: &'a [u8],
    },
    ListKeys,
    Barrier {
        key: &'a [u8],
        world_size: i64,
    },
    SetSession {
        key: &'a [u8],
        value: &'a [u8],
    },
    Watch {
        mode: WatchMode,
        pattern: &'a [u8],
    },
}

impl<'a> Request<'a> {
    pub fn query(&self) -> Query {
        match self {
            Request::Validate { .. } => Query::Validate,
            Request::Set { .. } => Query::Set,
            Request::CompareSet { .. } => Query::CompareSet,
            Request::Get { .. } => Query::Get,
            Request::Add { .. } => Query::Add,
            Request::Check { .. } => Query::Check,
            Request::Wait { .. } => Query::Wait,
            Request::GetNumKeys => Query::GetNumKeys,
            Request::DeleteKey { .. } => Query::DeleteKey,
            Request::Append { .. } => Query::Append,
            Request::MultiGet { .. } => Query::MultiGet,
            Request::MultiSet { .. } => Query::MultiSet,
            Request::CancelWait => Query::CancelWait,
            Request::Ping { .. } => Query::Ping,
            Request::QueuePush { .. } => Query::QueuePush,
            Request::QueuePop { .. } => Query::QueuePop,
            Request::QueueLen { .. } => Query::QueueLen,
            Request::ListKeys => Query::ListKeys,
            Request::Barrier { .. } => Query::Barrier,
            Request::SetSession { .. } => Query::SetSession,
            Request::Watch { .. } => Query::Watch,
        }
    }

    /// The shape of the server's reply, `None` when the server sends nothing back.
    /// `WAIT` and `BARRIER` replies may come much later; `WATCH` is answered by an event.
    pub fn reply_shape(&self) -> Option<ReplyShape> {
        Some(match self {
            Request::Validate { .. }
            | Request::Set { .. }
            | Request::Append { .. }
            | Request::MultiSet { .. }
            | Request::QueuePush { .. }
            | Request::SetSession { .. } => return None,
            Request::CompareSet { .. } | Request::Get { .. } => ReplyShape::Value,
            Request::Add { .. }
            | Request::GetNumKeys
            | Request::DeleteKey { .. }
            | Request::QueueLen { .. } => ReplyShape::Int,
            Request::Check { .. }
            | Request::Wait { .. }
            | Request::CancelWait
            | Request::Barrier { .. } => ReplyShape::Byte,
            Request::MultiGet { keys } => ReplyShape::Values(keys.len() as u64),
            Request::Ping { .. } => ReplyShape::Nonce,
            Request::QueuePop { .. } => ReplyShape::QueueItem,
            Request::ListKeys => ReplyShape::Keys,
            Request::Watch { .. } => ReplyShape::Event,
        })
    }

    /// Appends the wire form of this request to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.query() as u8);
        match self {
            Request::Validate { magic: n } | Request::Ping { nonce: n } => {
                out.extend_from_slice(&n.to_le_bytes())
            }
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value }
            | Request::SetSession { key, value } => {
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_bytes(out, key);
                put_bytes(out, expected);
                put_bytes(out, desired);
            }
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key } => put_bytes(out, key),
            Request::Add { key, delta: n } | Request::Barrier { key, world_size: n } => {
                put_bytes(out, key);
                put_i64(out, *n);
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_u64(out, keys.len() as u64);
                for key in keys {
                    put_bytes(out, key);
                }
            }
            Request::MultiSet { pairs } => {
                put_u64(out, pairs.len() as u64);
                for (key, value) in pairs {
                    put_bytes(out, key);
                    put_bytes(out, value);
                }
            }
            Request::GetNumKeys | Request::CancelWait | Request::ListKeys => {}
            Request::Watch { mode, pattern } => {
                out.push(*mode as u8);
                put_bytes(out, pattern);
            }
        }
    }

    /// Parses the fields of a complete frame (without its type byte).
    fn parse(query: Query, body: &'a [u8]) -> Result<Request<'a>, FrameError> {
        let mut c = Cursor { rest: body };
        let request = match query {
            Query::Validate => Request::Validate { magic: c.u32()? },
            Query::Set => Request::Set {
                key: c.bytes()?,
                value: c.bytes()?,
            },
            Query::CompareSet => Request::CompareSet {
                key: c.bytes()?,
                expected: c.bytes()?,
                desired: c.bytes()?,
            },
            Query::Get => Request::Get { key: c.bytes()? },
            Query::Add => Request::Add {
                key: c.bytes()?,
                delta: c.i64()?,
            },
            Query::Check => Request::Check {
                keys: c.bytes_list()?,
            },
            Query::Wait => Request::Wait {
                keys: c.bytes_list()?,
            },
            Query::GetNumKeys => Request::GetNumKeys,
            Query::DeleteKey => Request::DeleteKey { key: c.bytes()? },
            Query::Append => Request::Append {
                key: c.bytes()?,
                value: c.bytes()?,
            },
            Query::MultiGet => Request::MultiGet {
                keys: c.bytes_list()?,
            },
            Query::MultiSet => {
                let n = c.count()?;
                let mut pairs = Vec::with_capacity(n.min(c.rest.len() / 16));
                for _ in 0..n {
                    pairs.push((c.bytes()?, c.bytes()?));
                }
                Request::MultiSet { pairs }
            }
            Query::CancelWait => Request::CancelWait,
            Query::Ping => Request::Ping { nonce: c.u32()? },
            Query::QueuePush => Request::QueuePush {
                key: c.bytes()?,
                value: c.bytes()?,
            },
            Query::QueuePop => Request::QueuePop { key: c.bytes()? },
            Query::QueueLen => Request::QueueLen { key: c.bytes()? },
            Query::ListKeys => Request::ListKeys,
            Query::Barrier => Request::Barrier {
                key: c.bytes()?,
                world_size: c.i64()?,
            },
            Query::SetSession => Request::SetSession {
                key: c.bytes()?,
                value: c.bytes()?,
            },
            Query::Watch => {
                let mode = match c.u8()? {
                    0 => WatchMode::Key,
                    1 => WatchMode::Prefix,
                    _ => return Err(FrameError::Malformed("unknown WATCH mode")),
                };
                Request::Watch {
                    mode,
                    pattern: c.bytes()?,
                }
            }
        };
        c.finish(request)
    }
}

/// The shape of a reply, known to the client from its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyShape {
    /// `u8`: CHECK, WAIT, CANCEL_WAIT, BARRIER.
    Byte,
    /// `u32`: PING.
    Nonce,
    /// `i64`: ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN.
    Int,
    /// `bytes`: GET, COMPARE_SET.
    Value,
    /// `n × bytes`: MULTI_GET of n keys.
    Values(u64),
    /// `i64 length_before_pop`, then `bytes` iff it was > 0: QUEUE_POP.
    QueueItem,
    /// `i64 n, n × str`: LIST_KEYS.
    Keys,
    /// `u8 kind, str key`: any message on a watch connection.
    Event,
}

impl ReplyShape {
    fn fields(self) -> &'static [Field] {
        match self {
            ReplyShape::Byte => &[Field::U8],
            ReplyShape::Nonce => &[Field::U32],
            ReplyShape::Int => &[Field::I64],
            ReplyShape::Value => &[Field::Bytes],
            // The count comes from the request, not the wire: `ReplyDecoder::new` presets it.
            ReplyShape::Values(_) | ReplyShape::Keys => &[Field::BytesList],
            ReplyShape::QueueItem => &[Field::QueueItem],
            ReplyShape::Event => &[Field::U8, Field::Bytes],
        }
    }
}

/// A decoded reply; values borrow the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    Byte(u8),
    Nonce(u32),
    Int(i64),
    Value(&'a [u8]),
    Values(Vec<&'a [u8]>),
    QueueItem {
        len_before: i64,
        value: Option<&'a [u8]>,
    },
    Keys(Vec<&'a [u8]>),
    Event {
        kind: EventKind,
        key: &'a [u8],
    },
}

impl<'a> Reply<'a> {
    /// Appends the wire form of this reply to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Byte(b) => out.push(*b),
            Reply::Nonce(n) => out.extend_from_slice(&n.to_le_bytes()),
            Reply::Int(n) => put_i64(out, *n),
            Reply::Value(v) => put_bytes(out, v),
            Reply::Values(values) => values.iter().for_each(|v| put_bytes(out, v)),
            Reply::QueueItem { len_before, value } => {
                put_i64(out, *len_before);
                if let Some(v) = value {
                    put_bytes(out, v);
                }
            }
            Reply::Keys(keys) => {
                put_u64(out, keys.len() as u64);
                keys.iter().for_each(|k| put_bytes(out, k));
            }
            Reply::Event { kind, key } => put_event(out, *kind, key),
        }
    }

    fn parse(shape: ReplyShape, body: &'a [u8]) -> Result<Reply<'a>, FrameError> {
        let mut c = Cursor { rest: body };
        let reply = match shape {
            ReplyShape::Byte => Reply::Byte(c.u8()?),
            ReplyShape::Nonce => Reply::Nonce(c.u32()?),
            ReplyShape::Int => Reply::Int(c.i64()?),
            ReplyShape::Value => Reply::Value(c.bytes()?),
            ReplyShape::Values(n) => {
                let mut values = Vec::with_capacity(bounded_capacity(n, c.rest.len()));
                for _ in 0..n {
                    values.push(c.bytes()?);
                }
                Reply::Values(values)
            }
            ReplyShape::QueueItem => {
                let len_before = c.i64()?;
                let value = if len_before > 0 {
                    Some(c.bytes()?)
                } else {
                    None
                };
                Reply::QueueItem { len_before, value }
            }
            ReplyShape::Keys => Reply::Keys(c.bytes_list()?),
            ReplyShape::Event => {
                let kind = match c.u8()? {
                    0 => EventKind::Watching,
                    1 => EventKind::Written,
                    2 => EventKind::Deleted,
                    _ => return Err(FrameError::Malformed("unknown watch event kind")),
                };
                Reply::Event {
                    kind,
                    key: c.bytes()?,
                }
            }
        };
        c.finish(reply)
    }
}

/// Incremental request decoder for one connection.
#[derive(Debug)]
pub struct RequestDecoder {
    max_frame: usize,
    /// The query of the frame being scanned and how far it got.
    pending: Option<(Query, Scan)>,
}

impl RequestDecoder {
    pub fn new(max_frame_bytes: usize) -> RequestDecoder {
        RequestDecoder {
            max_frame: max_frame_bytes,
            pending: None,
        }
    }

    /// Decodes the request at the start of `buf`: `Ok(None)` when more bytes are needed,
    /// `Ok(Some((request, n)))` when the first `n` bytes form one. Between calls the caller
    /// may only append to `buf`, or drop the `n` bytes of a returned frame from its front.
    pub fn decode<'b>(
        &mut self,
        buf: &'b [u8],
    ) -> Result<Option<(Request<'b>, usize)>, FrameError> {
        let (query, scan) = match &mut self.pending {
            Some(pending) => pending,
            None => {
                let Some(&byte) = buf.first() else {
                    return Ok(None);
                };
                let query = Query::from_byte(byte).ok_or(FrameError::UnknownQuery(byte))?;
                self.pending.insert((query, Scan::starting_at(1)))
            }
        };
        let Some(len) = scan.run(query.fields(), buf, self.max_frame)? else {
            return Ok(None);
        };
        let query = *query;
        self.pending = None;
        let request = Request::parse(query, buf.get(1..len).unwrap_or_default())?;
        Ok(Some((request, len)))
    }
}

/// Incremental decoder for one reply of a known shape.
#[derive(Debug)]
pub struct ReplyDecoder {
    shape: ReplyShape,
    max_frame: usize,
    scan: Scan,
}

impl ReplyDecoder {
    pub fn new(shape: ReplyShape, max_frame_bytes: usize) -> ReplyDecoder {
        let mut scan = Scan::starting_at(0);
        if let ReplyShape::Values(n) = shape {
            scan.strings_left = Some(n);
        }
        ReplyDecoder {
            shape,
            max_frame: max_frame_bytes,
            scan,
        }
    }

    /// As [`RequestDecoder::decode`], for the reply at the start of `buf`.
    pub fn decode<'b>(&mut self, buf: &'b [u8]) -> Result<Option<(Reply<'b>, usize)>, FrameError> {
        if let ReplyShape::Values(n) = self.shape {
            check_count(n, 1, 0, self.max_frame)?;
        }
        let Some(len) = self.scan.run(self.shape.fields(), buf, self.max_frame)? else {
            return Ok(None);
        };
        let reply = Reply::parse(self.shape, buf.get(..len).unwrap_or_default())?;
        Ok(Some((reply, len)))
    }
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

/// The grammar every frame is made of.
#[derive(Debug, Clone, Copy)]
enum Field {
    U8,
    U32,
    I64,
    /// `u64 len || len bytes`.
    Bytes,
    /// `u64 n, n × Bytes` (or n preset by the decoder).
    BytesList,
    /// `u64 n, n × (Bytes, Bytes)`.
    PairList,
    /// `i64 n`, then one `Bytes` iff n > 0.
    QueueItem,
}

/// Resumable progress through a frame's fields.
#[derive(Debug)]
struct Scan {
    /// Bytes of the frame known to be complete.
    pos: usize,
    /// Index of the field being scanned.
    field: usize,
    /// `Bytes` items left in the current list-like field, once its header is read.
    strings_left: Option<u64>,
}

impl Scan {
    fn starting_at(pos: usize) -> Scan {
        Scan {
            pos,
            field: 0,
            strings_left: None,
        }
    }

    /// Continues over `buf`; `Ok(Some(len))` once the whole frame of `len` bytes is there.
    fn run(
        &mut self,
        fields: &[Field],
        buf: &[u8],
        max: usize,
    ) -> Result<Option<usize>, FrameError> {
        while let Some(&field) = fields.get(self.field) {
            let done = match field {
                Field::U8 => self.skip_fixed(buf, 1, max)?,
                Field::U32 => self.skip_fixed(buf, 4, max)?,
                Field::I64 => self.skip_fixed(buf, 8, max)?,
                Field::Bytes => self.skip_bytes(buf, max)?,
                Field::BytesList | Field::PairList | Field::QueueItem => {
                    self.skip_list(field, buf, max)?
                }
            };
            if !done {
                return Ok(None);
            }
            self.field += 1;
            self.strings_left = None;
        }
        Ok(Some(self.pos))
    }

    fn skip_fixed(&mut self, buf: &[u8], n: usize, max: usize) -> Result<bool, FrameError> {
        let end = self.pos + n;
        if end > max {
            return Err(FrameError::TooLarge { limit: max });
        }
        if buf.len() < end {
            return Ok(false);
        }
        self.pos = end;
        Ok(true)
    }

    /// Reads the u64 at `pos` without consuming it.
    fn peek_u64(&self, buf: &[u8], max: usize) -> Result<Option<u64>, FrameError> {
        if self.pos + 8 > max {
            return Err(FrameError::TooLarge { limit: max });
        }
        Ok(buf.get(self.pos..self.pos + 8).map(le_u64))
    }

    fn skip_bytes(&mut self, buf: &[u8], max: usize) -> Result<bool, FrameError> {
        let Some(len) = self.peek_u64(buf, max)? else {
            return Ok(false);
        };
        let body = self.pos + 8;
        if len > (max - body) as u64 {
            return Err(FrameError::TooLarge { limit: max });
        }
        let end = body + len as usize;
        if buf.len() < end {
            return Ok(false);
        }
        self.pos = end;
        Ok(true)
    }

    fn skip_list(&mut self, field: Field, buf: &[u8], max: usize) -> Result<bool, FrameError> {
        if self.strings_left.is_none() {
            let Some(header) = self.peek_u64(buf, max)? else {
                return Ok(false);
            };
            let strings = match field {
                Field::PairList => check_count(header, 2, self.pos + 8, max)?,
                Field::QueueItem => u64::from((header as i64) > 0),
                _ => check_count(header, 1, self.pos + 8, max)?,
            };
            self.pos += 8;
            self.strings_left = Some(strings);
        }
        while let Some(left @ 1..) = self.strings_left {
            if !self.skip_bytes(buf, max)? {
                return Ok(false);
            }
            self.strings_left = Some(left - 1);
        }
        Ok(true)
    }
}

/// `count × per_item` strings, refused when they could not fit in the frame (each needs at
/// least its 8-byte length) — so a hostile count never drives an allocation.
fn check_count(count: u64, per_item: u64, pos: usize, max: usize) -> Result<u64, FrameError> {
    let room = (max.saturating_sub(pos) / 8) as u64;
    match count.checked_mul(per_item) {
        Some(strings) if strings <= room => Ok(strings),
        _ => Err(FrameError::TooLarge { limit: max }),
    }
}

fn bounded_capacity(count: u64, bytes_left: usize) -> usize {
    usize::try_from(count)
        .unwrap_or(usize::MAX)
        .min(bytes_left / 8)
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(bytes);
    u64::from_le_bytes(raw)
}

/// Field reader over a frame that the scan found complete. Errors here would mean scan and
/// parse disagree; they are still errors, never panics.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.rest.len() < n {
            return Err(FrameError::Malformed("truncated field"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(raw))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(le_u64(self.take(8)?))
    }

    fn i64(&mut self) -> Result<i64, FrameError> {
        Ok(self.u64()? as i64)
    }

    fn count(&mut self) -> Result<usize, FrameError> {
        usize::try_from(self.u64()?).map_err(|_| FrameError::Malformed("count out of range"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let len = self.count()?;
        self.take(len)
    }

    fn bytes_list(&mut self) -> Result<Vec<&'a [u8]>, FrameError> {
        let n = self.count()?;
        let mut list = Vec::with_capacity(bounded_capacity(n as u64, self.rest.len()));
        for _ in 0..n {
            list.push(self.bytes()?);
        }
        Ok(list)
    }

    fn finish<T>(self, value: T) -> Result<T, FrameError> {
        if self.rest.is_empty() {
            Ok(value)
        } else {
            Err(FrameError::Malformed("trailing bytes in frame"))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
