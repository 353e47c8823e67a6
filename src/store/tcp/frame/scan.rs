//! The grammar frames are made of: a resumable scan that finds where a frame ends (checking every
//! length and count against the frame limit first), and a cursor that reads the fields of a
//! frame the scan found complete.

use super::FrameError;

/// The grammar every frame is made of.
#[derive(Debug, Clone, Copy)]
pub(super) enum Field {
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
pub(super) struct Scan {
    /// Bytes of the frame known to be complete.
    pos: usize,
    /// Index of the field being scanned.
    field: usize,
    /// `Bytes` items left in the current list-like field, once its header is read.
    pub(super) strings_left: Option<u64>,
}

impl Scan {
    pub(super) fn starting_at(pos: usize) -> Scan {
        Scan {
            pos,
            field: 0,
            strings_left: None,
        }
    }

    /// Continues over `buf`; `Ok(Some(len))` once the whole frame of `len` bytes is there.
    pub(super) fn run(
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
pub(super) fn check_count(
    count: u64,
    per_item: u64,
    pos: usize,
    max: usize,
) -> Result<u64, FrameError> {
    let room = (max.saturating_sub(pos) / 8) as u64;
    match count.checked_mul(per_item) {
        Some(strings) if strings <= room => Ok(strings),
        _ => Err(FrameError::TooLarge { limit: max }),
    }
}

pub(super) fn bounded_capacity(count: u64, bytes_left: usize) -> usize {
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
pub(super) struct Cursor<'a> {
    pub(super) rest: &'a [u8],
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

    pub(super) fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u32(&mut self) -> Result<u32, FrameError> {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(raw))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(le_u64(self.take(8)?))
    }

    pub(super) fn i64(&mut self) -> Result<i64, FrameError> {
        Ok(self.u64()? as i64)
    }

    pub(super) fn count(&mut self) -> Result<usize, FrameError> {
        usize::try_from(self.u64()?).map_err(|_| FrameError::Malformed("count out of range"))
    }

    pub(super) fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let len = self.count()?;
        self.take(len)
    }

    pub(super) fn bytes_list(&mut self) -> Result<Vec<&'a [u8]>, FrameError> {
        let n = self.count()?;
        let mut list = Vec::with_capacity(bounded_capacity(n as u64, self.rest.len()));
        for _ in 0..n {
            list.push(self.bytes()?);
        }
        Ok(list)
    }

    pub(super) fn finish<T>(self, value: T) -> Result<T, FrameError> {
        if self.rest.is_empty() {
            Ok(value)
        } else {
            Err(FrameError::Malformed("trailing bytes in frame"))
        }
    }
}
