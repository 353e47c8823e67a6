//! The store's data and semantics, apart from sockets: one `State` behind one mutex, so every
//! request is atomic, as in torch's single-threaded servers. The mutex is never held across I/O.
//!
//! Every byte a connection must send (its own replies, wake-ups of its pending `WAIT`, watch
//! events) is appended to that connection's outbox here, under the lock, so the bytes leave in
//! the order they were produced. The connection's task drains the outbox.

use std::collections::{HashMap, HashSet, VecDeque};
use std::mem;
use std::sync::Arc;

use thiserror::Error;
use tokio::sync::Notify;

use super::frame::{self, EventKind, Query, Request, WatchMode};
use integer::parse_leading_integer;

mod access;
mod integer;
mod watch;


pub(crate) type ConnId = u64;
type Key = Vec<u8>;

/// Why a request makes the server close its connection (torch's servers report errors only
/// that way, and its clients expect it).
#[derive(Debug, Error)]
pub(crate) enum Refusal {
    #[error("{query:?} on key {key:?} whose value {value:?} is not a decimal integer")]
    NotAnInteger {
        query: Query,
        key: String,
        value: String,
    },
    #[error("{query:?} on key {key:?} overflows a 64-bit integer")]
    Overflow { query: Query, key: String },
    #[error("the reply to {query:?} would exceed the {limit}-byte limit (max_frame_bytes)")]
    ReplyTooLarge { query: Query, limit: usize },
    #[error("{query:?} would grow a value past the {limit}-byte limit (max_frame_bytes)")]
    ValueTooLarge { query: Query, limit: usize },
    #[error("VALIDATE or HELLO after the first request")]
    LateValidate,
    #[error("{0:?} on a tagged (agent) connection, which waits by watching")]
    NotOnTaggedConnection(Query),
    #[error("{0:?} names muster's rendezvous keys, which only the job's agents may use")]
    Protected(Query),
}

/// What a `HELLO` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hello {
    /// The connection is an agent's, tagged from now on; the reply is queued.
    Welcome,
    /// Wrong or missing token: the refusal is queued, then the connection must close.
    WrongToken,
    /// A protocol version this server does not speak: close without a reply.
    UnknownVersion(u32),
}

struct Conn {
    /// Bytes to send, in production order.
    out: Vec<u8>,
    /// Tells the connection's task that another connection queued bytes for it.
    wake: Arc<Notify>,
    /// Keys the pending WAIT/BARRIER is registered on (with repeats), and wake-ups still needed.
    wait_keys: Vec<Key>,
    awaited: usize,
    /// Session-bound keys this connection owns.
    sessions: HashSet<Key>,
    watches: Vec<(WatchMode, Key)>,
    /// Watchers that stopped reading get closed instead of buffering without bound.
    overflowed: bool,
    /// Said `HELLO`: every message to it is tagged, and it may use muster's keys.
    agent: bool,
}

pub(crate) struct State {
    kv: HashMap<Key, Vec<u8>>,
    /// libuv's queues: a namespace apart from `kv` (not counted or listed); empty ones removed.
    queues: HashMap<Key, VecDeque<Vec<u8>>>,
    waiters: HashMap<Key, Vec<ConnId>>,
    owners: HashMap<Key, ConnId>,
    key_watchers: HashMap<Key, Vec<ConnId>>,
    prefix_watchers: Vec<(Key, ConnId)>,
    conns: HashMap<ConnId, Conn>,
    next_id: ConnId,
    max_frame: usize,
    /// The job token a `HELLO` must present, if the server has one.
    token: Option<Vec<u8>>,
}

impl State {
    pub(crate) fn new(max_frame_bytes: usize, token: Option<Vec<u8>>) -> State {
        State {
            kv: HashMap::new(),
            queues: HashMap::new(),
            waiters: HashMap::new(),
            owners: HashMap::new(),
            key_watchers: HashMap::new(),
            prefix_watchers: Vec::new(),
            conns: HashMap::new(),
            next_id: 0,
            max_frame: max_frame_bytes,
            token,
        }
    }

    pub(crate) fn connect(&mut self, wake: Arc<Notify>) -> ConnId {
        let id = self.next_id;
        self.next_id += 1;
        let conn = Conn {
            out: Vec::new(),
            wake,
            wait_keys: Vec::new(),
            awaited: 0,
            sessions: HashSet::new(),
            watches: Vec::new(),
            overflowed: false,
            agent: false,
        };
        self.conns.insert(id, conn);
        id
    }

    /// Forgets the connection: its waits and watches end, its session keys are deleted.
    pub(crate) fn disconnect(&mut self, id: ConnId) {
        self.cancel_wait(id);
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        for (mode, pattern) in &conn.watches {
            self.unregister_watch(id, *mode, pattern);
        }
        for key in conn.sessions {
            self.owners.remove(&key);
            if self.kv.remove(&key).is_some() {
                self.notify(&key, EventKind::Deleted);
            }
        }
    }

    /// Moves the connection's pending output into `buf` (empty on entry). `Err` when it fell
    /// so far behind reading that it must be closed.
    pub(crate) fn take_output(&mut self, id: ConnId, buf: &mut Vec<u8>) -> Result<(), Overflowed> {
        let Some(conn) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        if conn.overflowed {
            return Err(Overflowed);
        }
        mem::swap(&mut conn.out, buf);
        Ok(())
    }

    /// Bytes queued for the connection and not yet taken.
    pub(crate) fn pending_output(&self, id: ConnId) -> usize {
        self.conns.get(&id).map_or(0, |c| c.out.len())
    }

    /// Connections whose pending WAIT or BARRIER is registered on `key` (wire form): how tests know
    /// a waiter is parked before they write what must wake it.
    #[cfg(test)]
    pub(crate) fn waiters_on(&self, key: &[u8]) -> usize {
        self.waiters.get(key).map_or(0, Vec::len)
    }

    /// Deletes every key and queue; pending waits stay pending.
    pub(crate) fn clear(&mut self) {
        let watched = self.has_watchers();
        let keys: Vec<Key> = self.kv.drain().map(|(k, _)| k).collect();
        self.queues.clear();
        self.owners.clear();
        self.conns.values_mut().for_each(|c| c.sessions.clear());
        if watched {
            for key in keys {
                self.notify(&key, EventKind::Deleted);
            }
        }
    }

    /// Deletes every key and queue except the keys that start with `keep` (wire form, with torch's
    /// leading `/`): a store shared by agents and workers keeps the agents' keys across restarts.
    pub(crate) fn clear_except(&mut self, keep: &[u8]) {
        let watched = self.has_watchers();
        let keys: Vec<Key> = self.kv.keys().filter(|k| !k.starts_with(keep)).cloned().collect();
        for key in &keys {
            self.kv.remove(key);
            if let Some(owner) = self.owners.remove(key) {
                if let Some(conn) = self.conns.get_mut(&owner) {
                    conn.sessions.remove(key);
                }
            }
        }
        self.queues.clear();
        if watched {
            for key in keys {
                self.notify(&key, EventKind::Deleted);
            }
        }
    }

    /// A connection's first request was `HELLO`: it becomes an agent's (tagged) connection if it
    /// presents the server's token (any token where the server has none).
    pub(crate) fn hello(&mut self, id: ConnId, version: u32, token: &[u8]) -> Hello {
        if version != frame::HELLO_VERSION {
            return Hello::UnknownVersion(version);
        }
        let welcome = self
            .token
            .as_deref()
            .is_none_or(|expected| access::token_matches(expected, token));
        let Some(conn) = self.conns.get_mut(&id) else {
            return Hello::WrongToken;
        };
        conn.agent = welcome;
        conn.out.push(frame::TAG_REPLY);
        if welcome {
            conn.out.push(frame::HELLO_OK);
            Hello::Welcome
        } else {
            conn.out.push(frame::HELLO_REFUSED);
            Hello::WrongToken
        }
    }

    /// Applies one request from connection `id`, queueing its reply.
    pub(crate) fn apply(&mut self, id: ConnId, request: Request<'_>) -> Result<(), Refusal> {
        let Some(conn) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let agent = conn.agent;
        let query = request.query();
        if agent && matches!(request, Request::Wait { .. } | Request::Barrier { .. }) {
            return Err(Refusal::NotOnTaggedConnection(query));
        }
        if !agent && access::forbidden(&request) {
            return Err(Refusal::Protected(query));
        }
        // Own replies go to `out` (tagged on an agent's connection: the tag is taken back if
        // the request has no reply); bytes other requests queue for this connection meanwhile
        // (a wake-up of its own WAIT, events) follow them.
        let mut out = mem::take(&mut conn.out);
        let start = out.len();
        if agent {
            out.push(frame::TAG_REPLY);
        }
        let result = self.execute(id, request, &mut out);
        if agent && out.len() == start + 1 {
            out.truncate(start);
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            out.append(&mut conn.out);
            conn.out = out;
        }
        result
    }

    /// Whether connection `id` may see key `key` (muster's keys are for agents only).
    fn visible(&self, id: ConnId, key: &[u8]) -> bool {
        !access::protected(key) || self.conns.get(&id).is_some_and(|c| c.agent)
    }

    fn execute(
        &mut self,
        id: ConnId,
        request: Request<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let query = request.query();
        match request {
            Request::Validate { .. } | Request::Hello { .. } => {
                return Err(Refusal::LateValidate)
            }
            Request::Set { key, value } => {
                self.unbind(key);
                self.write(key, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => match self.kv.get_mut(key) {
                Some(current) if current == expected => {
                    *current = desired.to_vec();
                    frame::put_bytes(out, desired);
                    self.notify(key, EventKind::Written);
                }
                Some(current) => frame::put_bytes(out, current),
                // Wakes waiters only when the key now exists. libuv wakes them on every
                // COMPARE_SET (a torch `get` then returns b''), legacy never does.
                None if expected.is_empty() => {
                    frame::put_bytes(out, desired);
                    self.write(key, desired);
                }
                // torch replies `expected` here ("lying", says its source); so do we.
                None => frame::put_bytes(out, expected),
            },
            // A missing key reads as empty, as in libuv (legacy closes the connection).
            Request::Get { key } => {
                frame::put_bytes(out, self.kv.get(key).map_or(&[][..], Vec::as_slice))
            }
            Request::Add { key, delta } => {
                let sum = self
                    .integer(query, key)?
                    .checked_add(delta)
                    .ok_or_else(|| Refusal::Overflow {
                        query,
                        key: lossy(key),
                    })?;
                frame::put_i64(out, sum);
                self.write(key, sum.to_string().as_bytes());
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|k| self.present(k));
                out.push(if ready {
                    frame::CHECK_READY
                } else {
                    frame::CHECK_NOT_READY
                });
            }
            Request::Wait { keys } => {
                // torch tracks one wait per connection; a new one replaces the old.
                self.cancel_wait(id);
                let missing: Vec<Key> = keys
                    .iter()
                    .filter(|k| !self.present(k))
                    .map(|k| k.to_vec())
                    .collect();
                if missing.is_empty() {
                    out.push(frame::STOP_WAITING);
                } else {
                    self.register_wait(id, missing);
                }
            }
            Request::GetNumKeys => {
                let n = self.kv.keys().filter(|k| self.visible(id, k)).count();
                frame::put_i64(out, n as i64)
            }
            Request::DeleteKey { key } => {
                let deleted = self.kv.remove(key).is_some();
                if deleted {
                    self.unbind(key);
                    self.notify(key, EventKind::Deleted);
                }
                frame::put_i64(out, i64::from(deleted));
            }
            Request::Append { key, value } => {
                // Bounded like SET: the grown value must still fit a GET reply.
                let len = self.kv.get(key).map_or(0, Vec::len) + value.len();
                if 8 + len > self.max_frame {
                    return Err(Refusal::ValueTooLarge {
                        query,
                        limit: self.max_frame,
                    });
                }
                self.kv
                    .entry(key.to_vec())
                    .or_default()
                    .extend_from_slice(value);
                self.wake_all(key);
                self.notify(key, EventKind::Written);
            }
            Request::MultiGet { keys } => {
                let values: Vec<&[u8]> = keys
                    .iter()
                    .map(|k| self.kv.get(*k).map_or(&[][..], Vec::as_slice))
                    .collect();
                let size: usize = values.iter().map(|v| 8 + v.len()).sum();
                if size > self.max_frame {
                    return Err(Refusal::ReplyTooLarge {
                        query,
                        limit: self.max_frame,
                    });
                }
                values.iter().for_each(|v| frame::put_bytes(out, v));
            }
            Request::MultiSet { pairs } => {
                for (key, value) in pairs {
                    self.unbind(key);
                    self.write(key, value);
                }
            }
            Request::CancelWait => {
                self.cancel_wait(id);
                out.push(frame::WAIT_CANCELED);
            }
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::QueuePush { key, value } => {
                self.queues
                    .entry(key.to_vec())
                    .or_default()
                    .push_back(value.to_vec());
                self.wake_one(key);
            }
            Request::QueuePop { key } => {
                let queue = self.queues.get_mut(key);
                let len_before = queue.as_ref().map_or(0, |q| q.len());
                frame::put_i64(out, len_before as i64);
                if let Some(queue) = queue {
                    if let Some(value) = queue.pop_front() {
                        frame::put_bytes(out, &value);
                    }
                    if queue.is_empty() {
                        self.queues.remove(key);
                    }
                }
            }
            Request::QueueLen { key } => {
                frame::put_i64(out, self.queues.get(key).map_or(0, |q| q.len()) as i64)
            }
            Request::ListKeys => {
                let keys: Vec<&Key> = self.kv.keys().filter(|k| self.visible(id, k)).collect();
                let size: usize = 8 + keys.iter().map(|k| 8 + k.len()).sum::<usize>();
                if size > self.max_frame {
                    return Err(Refusal::ReplyTooLarge {
                        query,
                        limit: self.max_frame,
                    });
                }
                frame::put_i64(out, keys.len() as i64);
                keys.iter().for_each(|k| frame::put_bytes(out, k));
            }
            Request::Barrier { key, world_size } => {
                let count =
                    self.integer(query, key)?
                        .checked_add(1)
                        .ok_or_else(|| Refusal::Overflow {
                            query,
                            key: lossy(key),
                        })?;
                // The count is never reset: later arrivals pass at once, as in torch.
                self.kv.insert(key.to_vec(), count.to_string().into_bytes());
                self.notify(key, EventKind::Written);
                if count >= world_size {
                    out.push(frame::STOP_WAITING);
                    self.wake_all(key);
                } else {
                    self.cancel_wait(id);
                    self.register_wait(id, vec![key.to_vec()]);
                }
            }
            Request::SetSession { key, value } => {
                self.write(key, value);
                self.bind(key, id);
            }
            Request::Watch { mode, pattern } => {
                self.register_watch(id, mode, pattern);
                frame::put_event(out, EventKind::Watching, pattern);
            }
            Request::Unwatch { mode, pattern } => {
                if let Some(conn) = self.conns.get_mut(&id) {
                    if let Some(i) = conn.watches.iter().position(|(m, p)| *m == mode && p == pattern) {
                        conn.watches.swap_remove(i);
                        self.unregister_watch(id, mode, pattern);
                    }
                }
            }
        }
        Ok(())
    }

    /// Stores `value`, wakes waiters on `key` and tells its watchers.
    fn write(&mut self, key: &[u8], value: &[u8]) {
        // Overwriting reuses the key and value buffers: the hot path of a busy store.
        match self.kv.get_mut(key) {
            Some(current) => {
                current.clear();
                current.extend_from_slice(value);
            }
            None => {
                self.kv.insert(key.to_vec(), value.to_vec());
            }
        }
        self.wake_all(key);
        self.notify(key, EventKind::Written);
    }

    /// A key counts as present for CHECK/WAIT when set or naming a non-empty queue (libuv).
    fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.contains_key(key)
    }

    /// The key's value read as torch's `std::stoll` does; a missing key is 0.
    fn integer(&self, query: Query, key: &[u8]) -> Result<i64, Refusal> {
        let Some(value) = self.kv.get(key) else {
            return Ok(0);
        };
        parse_leading_integer(value).ok_or_else(|| Refusal::NotAnInteger {
            query,
            key: lossy(key),
            value: lossy(value),
        })
    }

    fn register_wait(&mut self, id: ConnId, keys: Vec<Key>) {
        for key in &keys {
            self.waiters.entry(key.clone()).or_default().push(id);
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.awaited = keys.len();
            conn.wait_keys = keys;
        }
    }

    fn cancel_wait(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.awaited = 0;
        for key in mem::take(&mut conn.wait_keys) {
            if let Some(list) = self.waiters.get_mut(&key) {
                list.retain(|c| *c != id);
                if list.is_empty() {
                    self.waiters.remove(&key);
                }
            }
        }
    }

    fn wake_all(&mut self, key: &[u8]) {
        if self.waiters.is_empty() {
            return;
        }
        if let Some(list) = self.waiters.remove(key) {
            list.into_iter().for_each(|id| self.wake(id));
        }
    }

    /// QUEUE_PUSH wakes one waiter: one item serves one blocked `queue_pop`.
    fn wake_one(&mut self, key: &[u8]) {
        let Some(list) = self.waiters.get_mut(key) else {
            return;
        };
        let Some(id) = (!list.is_empty()).then(|| list.remove(0)) else {
            return;
        };
        if list.is_empty() {
            self.waiters.remove(key);
        }
        self.wake(id);
    }

    /// One registration of `id` fired; the last one answers its WAIT.
    fn wake(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.awaited = conn.awaited.saturating_sub(1);
        if conn.awaited == 0 {
            conn.wait_keys.clear();
            self.send_deferred(id, |out| out.push(frame::STOP_WAITING));
        }
    }

    /// Queues bytes for a connection other than the one being served, and wakes its task.
    fn send_deferred(&mut self, id: ConnId, write: impl FnOnce(&mut Vec<u8>)) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.overflowed {
            return;
        }
        write(&mut conn.out);
        // Own replies are drained after each request batch, so past two frames' worth the
        // connection has stopped reading.
        if conn.out.len() > 2 * self.max_frame {
            conn.overflowed = true;
            conn.out = Vec::new();
        }
        conn.wake.notify_one();
    }

    fn bind(&mut self, key: &[u8], id: ConnId) {
        if let Some(previous) = self.owners.insert(key.to_vec(), id) {
            if let Some(conn) = self.conns.get_mut(&previous) {
                conn.sessions.remove(key);
            }
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.sessions.insert(key.to_vec());
        }
    }

    fn unbind(&mut self, key: &[u8]) {
        if self.owners.is_empty() {
            return;
        }
        if let Some(owner) = self.owners.remove(key) {
            if let Some(conn) = self.conns.get_mut(&owner) {
                conn.sessions.remove(key);
            }
        }
    }
}

/// The connection fell too far behind reading its events.
#[derive(Debug)]
pub(crate) struct Overflowed;

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
