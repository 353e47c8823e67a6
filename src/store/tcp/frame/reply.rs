//! Replies: their shapes (known from the request), decoded form, encoding and incremental decoder.

use super::scan::{bounded_capacity, check_count, Cursor, Field, Scan};
use super::{put_bytes, put_event, put_i64, put_u64, EventKind, FrameError};

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
    ///
    /// [`RequestDecoder::decode`]: super::RequestDecoder::decode
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
