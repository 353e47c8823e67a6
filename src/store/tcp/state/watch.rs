//! Watches: who follows which keys and prefixes, and the events they are sent.

use super::super::frame::{self, EventKind, WatchMode};
use super::{ConnId, State};

impl State {
    pub(super) fn register_watch(&mut self, id: ConnId, mode: WatchMode, pattern: &[u8]) {
        match mode {
            WatchMode::Key => self
                .key_watchers
                .entry(pattern.to_vec())
                .or_default()
                .push(id),
            WatchMode::Prefix => self.prefix_watchers.push((pattern.to_vec(), id)),
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.watches.push((mode, pattern.to_vec()));
        }
    }

    /// Removes one registration of `id` on `pattern` (the connection's own list is its caller's).
    pub(super) fn unregister_watch(&mut self, id: ConnId, mode: WatchMode, pattern: &[u8]) {
        match mode {
            WatchMode::Key => {
                if let Some(list) = self.key_watchers.get_mut(pattern) {
                    if let Some(i) = list.iter().position(|c| *c == id) {
                        list.swap_remove(i);
                    }
                    if list.is_empty() {
                        self.key_watchers.remove(pattern);
                    }
                }
            }
            WatchMode::Prefix => {
                if let Some(i) = self
                    .prefix_watchers
                    .iter()
                    .position(|(p, c)| *c == id && p == pattern)
                {
                    self.prefix_watchers.swap_remove(i);
                }
            }
        }
    }

    pub(super) fn has_watchers(&self) -> bool {
        !self.key_watchers.is_empty() || !self.prefix_watchers.is_empty()
    }

    /// Sends the event to every connection watching `key` (once each, however many of its watches
    /// match).
    pub(super) fn notify(&mut self, key: &[u8], kind: EventKind) {
        if !self.has_watchers() {
            return;
        }
        let mut targets: Vec<ConnId> = self.key_watchers.get(key).cloned().unwrap_or_default();
        targets.extend(
            self.prefix_watchers
                .iter()
                .filter(|(p, _)| key.starts_with(p))
                .map(|(_, id)| *id),
        );
        targets.sort_unstable();
        targets.dedup();
        for id in targets {
            let tagged = self.conns.get(&id).is_some_and(|c| c.agent);
            self.send_deferred(id, |out| {
                if tagged {
                    out.push(frame::TAG_EVENT);
                }
                frame::put_event(out, kind, key)
            });
        }
    }
}
