//! The reading side of a [`super::Mux`]: tagged frames in, replies to their requests (in order),
//! events to the subscriptions that follow their keys.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::mpsc;

use super::super::frame::{EventKind, FrameError, Reply, ReplyDecoder, ReplyShape, WatchMode, TAG_EVENT, TAG_REPLY};
use super::Shared;
use crate::store::{WatchEvent, WatchEventKind};

type Pattern = (WatchMode, Vec<u8>);
type EventSender = mpsc::UnboundedSender<WatchEvent>;

/// A subscription's handle: [`super::Mux::unsubscribe`] ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subscription(u64);

/// Which subscriptions follow which patterns, and how many follow each (the server is asked to
/// WATCH a pattern once, and to UNWATCH it when nobody follows it any more).
#[derive(Default)]
pub(super) struct Subscribers {
    next: u64,
    subs: HashMap<Subscription, (Vec<Pattern>, EventSender)>,
    followers: HashMap<Pattern, usize>,
    /// Patterns nobody follows any more whose UNWATCH is still to be sent.
    due: Vec<Pattern>,
    closed: bool,
}

impl Subscribers {
    /// Adds a subscription; returns it and the patterns the server must now be asked to WATCH. On a
    /// failed connection the sender is dropped at once (the caller's next request fails anyway).
    pub(super) fn add(&mut self, targets: Vec<Pattern>, events: EventSender) -> (Subscription, Vec<Pattern>) {
        let id = Subscription(self.next);
        self.next += 1;
        if self.closed {
            return (id, Vec::new());
        }
        let mut new = Vec::new();
        for target in &targets {
            let followers = self.followers.entry(target.clone()).or_insert(0);
            *followers += 1;
            if *followers == 1 && !self.due.contains(target) {
                new.push(target.clone());
            }
            // A pattern due to be unwatched is followed again: its WATCH still stands.
            self.due.retain(|p| p != target);
        }
        self.subs.insert(id, (targets, events));
        (id, new)
    }

    /// Removes a subscription; returns the UNWATCHes due now.
    pub(super) fn remove(&mut self, id: Subscription) -> Vec<Pattern> {
        if let Some((targets, _)) = self.subs.remove(&id) {
            self.release(targets);
        }
        std::mem::take(&mut self.due)
    }

    pub(super) fn take_due(&mut self) -> Vec<Pattern> {
        std::mem::take(&mut self.due)
    }

    fn release(&mut self, targets: Vec<Pattern>) {
        for target in targets {
            if let Some(followers) = self.followers.get_mut(&target) {
                *followers -= 1;
                if *followers == 0 {
                    self.followers.remove(&target);
                    self.due.push(target);
                }
            }
        }
    }

    /// Sends the event to every subscription following its key; one whose receiver is gone is removed.
    fn dispatch(&mut self, kind: EventKind, key: &[u8]) {
        let kind = match kind {
            EventKind::Written => WatchEventKind::Written,
            EventKind::Deleted => WatchEventKind::Deleted,
            // Acknowledgements are replies on a tagged connection; one here is ignored.
            EventKind::Watching => return,
        };
        let user_key = String::from_utf8_lossy(key.strip_prefix(b"/").unwrap_or(key)).into_owned();
        let mut gone = Vec::new();
        for (id, (targets, events)) in &self.subs {
            let follows = targets.iter().any(|(mode, pattern)| match mode {
                WatchMode::Key => key == pattern.as_slice(),
                WatchMode::Prefix => key.starts_with(pattern),
            });
            if follows && events.send(WatchEvent { kind, key: user_key.clone() }).is_err() {
                gone.push(*id);
            }
        }
        for id in gone {
            if let Some((targets, _)) = self.subs.remove(&id) {
                self.release(targets);
            }
        }
    }

    /// The connection failed: every channel closes.
    pub(super) fn close(&mut self) {
        self.closed = true;
        self.subs.clear();
        self.followers.clear();
        self.due.clear();
    }
}

/// What the frame being read is.
enum Partial {
    Reply(ReplyDecoder),
    Event(ReplyDecoder),
}

pub(super) struct Reader {
    read: OwnedReadHalf,
    shared: Arc<Shared>,
    max_reply: usize,
}

impl Reader {
    pub(super) fn new(read: OwnedReadHalf, shared: Arc<Shared>, max_reply: usize) -> Reader {
        Reader { read, shared, max_reply }
    }

    /// Reads until the connection fails or closes, then fails it for everyone.
    pub(super) async fn run(mut self) {
        let shared = self.shared.clone();
        let result = tokio::select! {
            result = self.read_frames() => result,
            () = shared.stopped() => Ok(()),
        };
        if let Err(e) = result {
            tracing::debug!("store connection failed: {e}");
        }
        self.shared.fail();
    }

    async fn read_frames(&mut self) -> Result<(), FrameError> {
        let mut input: Vec<u8> = Vec::with_capacity(8 << 10);
        let mut partial: Option<Partial> = None;
        loop {
            let mut consumed = 0;
            while let Some(n) = self.frame(&input[consumed..], &mut partial)? {
                consumed += n;
            }
            input.drain(..consumed);
            input.reserve(8 << 10);
            match self.read.read_buf(&mut input).await {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            }
        }
    }

    /// Handles the frame at the start of `buf` if it is complete: its length, or `None` for more bytes.
    fn frame(&self, buf: &[u8], partial: &mut Option<Partial>) -> Result<Option<usize>, FrameError> {
        let Some((&tag, body)) = buf.split_first() else {
            return Ok(None);
        };
        if partial.is_none() {
            *partial = Some(match tag {
                TAG_REPLY => Partial::Reply(ReplyDecoder::new(self.expected_shape()?, self.max_reply)),
                TAG_EVENT => Partial::Event(ReplyDecoder::new(ReplyShape::Event, self.max_reply)),
                _ => return Err(FrameError::Malformed("unknown message tag")),
            });
        }
        let decoded = match partial.as_mut() {
            Some(Partial::Reply(decoder) | Partial::Event(decoder)) => decoder.decode(body)?,
            None => None,
        };
        let Some((reply, len)) = decoded else {
            return Ok(None);
        };
        match (partial.take(), reply) {
            (Some(Partial::Event(_)), Reply::Event { kind, key }) => self.shared.subscribers().dispatch(kind, key),
            (Some(Partial::Reply(_)), _) => self.answer(&body[..len]),
            _ => return Err(FrameError::Malformed("an event of another shape")),
        }
        Ok(Some(1 + len))
    }

    /// The shape of the oldest request's reply.
    fn expected_shape(&self) -> Result<ReplyShape, FrameError> {
        let pending = self.shared.pending();
        match pending.as_ref().and_then(|p| p.front()) {
            Some(request) => Ok(request.shape),
            None => Err(FrameError::Malformed("a reply to no request")),
        }
    }

    /// Hands the oldest request its reply (dropped if its future was).
    fn answer(&self, bytes: &[u8]) {
        let request = self.shared.pending().as_mut().and_then(|p| p.pop_front());
        if let Some(request) = request {
            let _ = request.reply.send(bytes.to_vec());
        }
    }
}
