//! Counters (`add`) on etcd without contention. N joiners taking a slot at once each add 1 to one key; a
//! compare-and-set on its value lets one of them win each try, so a node made O(N) tries (1024 nodes: 94 s
//! to seal). Instead a counter that only ever gains 1 is counted by etcd itself: every put of a key bumps
//! its `version` by one, atomically, so `add(key, 1)` is one transaction (put a marker, read the key back)
//! that never fails and returns the version. The counter's creation is in the same transaction (a nested
//! one, taken when the key is not a counter yet): a joiner that raced the creation made three transactions,
//! each a write to etcd's log whatever its comparison found (4096 nodes joining at once: 8,000 writes more
//! than joiners). Readers see the count as the value (`get`, `multi_get`). Any other delta on it, or an add
//! on a value set otherwise, is the compare-and-set it was.

use super::pb::KeyValue;
use super::wire::{self, Compare};
use super::EtcdStore;
use crate::store::StoreError;

/// The stored value of a counter kept by its version.
const MARK: &[u8] = b"\0muster-counter";

/// What a reader sees: a counter as its count.
pub(super) fn visible(kv: KeyValue) -> Vec<u8> {
    match kv.value.as_slice() == MARK {
        true => kv.version.to_string().into_bytes(),
        false => kv.value,
    }
}

impl EtcdStore {
    /// The count `kv` holds (a counter's version, else its value as an integer).
    fn count(&self, kv: &KeyValue) -> Result<i64, StoreError> {
        if kv.value.as_slice() == MARK {
            return Ok(kv.version);
        }
        let text = std::str::from_utf8(&kv.value).ok().map(str::trim);
        text.and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| self.failed(format!("add on {}: the value is not an integer", self.name(&kv.key))))
    }

    /// Adds 1 to the counter `key`, creating it when absent, in one transaction: its count, or the key as it
    /// is when it holds a value set otherwise.
    async fn count_one(&self, key: &[u8]) -> Result<Result<i64, KeyValue>, StoreError> {
        let put = || wire::op_put(wire::put(key, MARK, None));
        let read = || wire::op_range(wire::range(key, false, false));
        let create = wire::txn(&[Compare::Absent(key)], vec![put(), read()], vec![read()]);
        let reply = self.txn(&wire::txn(&[Compare::Value(key, MARK)], vec![put(), read()], vec![wire::op_txn(create)])).await?;
        let (counted, reply) = match reply.succeeded {
            true => (true, reply),
            false => {
                let created = wire::nested(reply).ok_or_else(|| self.failed(format!("add on {}: no nested reply", self.name(key))))?;
                (created.succeeded, created)
            }
        };
        let kv = wire::ranges(reply).next().and_then(wire::first);
        match (counted, kv) {
            (true, Some(kv)) => Ok(Ok(kv.version)),
            (false, Some(kv)) => Ok(Err(kv)),
            (_, None) => Err(self.failed(format!("add on {}: the key vanished", self.name(key)))),
        }
    }

    pub(super) async fn add_to(&self, key: &[u8], delta: i64) -> Result<i64, StoreError> {
        // An add of 1 reads nothing first: it is tried as a counter's (`count_one`).
        let mut current = match delta {
            1 => None,
            _ => self.range(key, false).await?,
        };
        loop {
            if delta == 0 {
                // A read only: a write would count.
                return current.map_or(Ok(0), |kv| self.count(&kv));
            }
            if delta == 1 && current.as_ref().is_none_or(|kv| kv.value.as_slice() == MARK) {
                match self.count_one(key).await? {
                    Ok(count) => return Ok(count),
                    Err(valued) => current = Some(valued),
                }
            }
            // Any other add: a compare-and-set of the value read.
            let (compare, new) = match &current {
                None => (Compare::Absent(key), delta),
                Some(kv) => (
                    Compare::ModRevision(key, kv.mod_revision),
                    self.count(kv)?
                        .checked_add(delta)
                        .ok_or_else(|| self.failed(format!("add on {} overflows", self.name(key))))?,
                ),
            };
            let put = wire::op_put(wire::put(key, new.to_string().as_bytes(), None));
            let read = || wire::op_range(wire::range(key, false, false));
            let reply = self.txn(&wire::txn(&[compare], vec![put, read()], vec![read()])).await?;
            if reply.succeeded {
                return Ok(new);
            }
            // Another writer came first (or made it a counter): again, from what the transaction read.
            current = wire::ranges(reply).next().and_then(wire::first);
        }
    }
}
