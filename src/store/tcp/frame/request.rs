//! Requests: the decoded form, its wire encoding and the incremental decoder a server reads with.

use super::scan::{Cursor, Scan};
use super::{put_bytes, put_i64, put_u64, FrameError, Query, ReplyShape, WatchMode};

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
    Hello {
        version: u32,
        token: &'a [u8],
    },
    Unwatch {
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
            Request::Hello { .. } => Query::Hello,
            Request::Unwatch { .. } => Query::Unwatch,
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
            | Request::SetSession { .. }
            | Request::Unwatch { .. } => return None,
            Request::CompareSet { .. } | Request::Get { .. } => ReplyShape::Value,
            Request::Add { .. }
            | Request::GetNumKeys
            | Request::DeleteKey { .. }
            | Request::QueueLen { .. } => ReplyShape::Int,
            Request::Check { .. }
            | Request::Wait { .. }
            | Request::CancelWait
            | Request::Barrier { .. }
            | Request::Hello { .. } => ReplyShape::Byte,
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
            Request::Watch { mode, pattern } | Request::Unwatch { mode, pattern } => {
                out.push(*mode as u8);
                put_bytes(out, pattern);
            }
            Request::Hello { version, token } => {
                out.extend_from_slice(&version.to_le_bytes());
                put_bytes(out, token);
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
            Query::Watch => Request::Watch {
                mode: watch_mode(c.u8()?)?,
                pattern: c.bytes()?,
            },
            Query::Unwatch => Request::Unwatch {
                mode: watch_mode(c.u8()?)?,
                pattern: c.bytes()?,
            },
            Query::Hello => Request::Hello {
                version: c.u32()?,
                token: c.bytes()?,
            },
        };
        c.finish(request)
    }
}

fn watch_mode(byte: u8) -> Result<WatchMode, FrameError> {
    match byte {
        0 => Ok(WatchMode::Key),
        1 => Ok(WatchMode::Prefix),
        _ => Err(FrameError::Malformed("unknown WATCH mode")),
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
