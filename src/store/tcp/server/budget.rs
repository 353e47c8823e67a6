//! The server's memory bound: one total of the bytes every connection buffers (its unparsed input and
//! the output it is writing), and when that total passes the limit the connections holding the most
//! (the slowest readers, the senders stalled mid-frame) are told to close until it is back under.
//!
//! Accounting is one atomic add per change; the holders' table is locked only to register a
//! connection, to forget it and to choose whom to evict, never across I/O or a request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::store::tcp::state::ConnId;

/// What the connections buffer, in bytes: now and at most; and how many the budget closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub now: usize,
    pub peak: usize,
    pub evictions: usize,
}

pub(super) struct Budget {
    limit: usize,
    total: AtomicUsize,
    /// The highest total seen (tests measure the bound with it).
    peak: AtomicUsize,
    evictions: AtomicUsize,
    holders: Mutex<HashMap<ConnId, Arc<Held>>>,
}

#[derive(Default)]
struct Held {
    bytes: AtomicUsize,
    evicted: AtomicBool,
    wake: Notify,
}

/// One connection's share; dropping it returns the bytes and forgets the connection.
pub(super) struct Account {
    budget: Arc<Budget>,
    id: ConnId,
    held: Arc<Held>,
    current: usize,
}

impl Budget {
    pub(super) fn new(limit: usize) -> Budget {
        Budget {
            limit,
            total: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            evictions: AtomicUsize::new(0),
            holders: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn open(self: &Arc<Budget>, id: ConnId) -> Account {
        let held = Arc::new(Held::default());
        self.lock().insert(id, held.clone());
        Account {
            budget: self.clone(),
            id,
            held,
            current: 0,
        }
    }

    pub(super) fn usage(&self) -> Usage {
        Usage {
            now: self.total.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ConnId, Arc<Held>>> {
        // Nothing panics while holding it; the table stays consistent.
        self.holders.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Evicts the largest holders until what the others hold fits the limit. Bytes of
    /// connections already told to close count as freed: they are on their way out.
    fn enforce(&self) {
        let holders = self.lock();
        let total = self.total.load(Ordering::Relaxed);
        let mut candidates: Vec<(usize, &Arc<Held>)> = Vec::new();
        let mut leaving = 0;
        for held in holders.values() {
            let bytes = held.bytes.load(Ordering::Relaxed);
            if held.evicted.load(Ordering::Relaxed) {
                leaving += bytes;
            } else if bytes > 0 {
                candidates.push((bytes, held));
            }
        }
        let keep = |kept: usize| kept <= self.limit;
        let mut kept = total.saturating_sub(leaving);
        candidates.sort_unstable_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
        for (bytes, held) in candidates {
            if keep(kept) {
                break;
            }
            held.evicted.store(true, Ordering::Relaxed);
            held.wake.notify_one();
            self.evictions.fetch_add(1, Ordering::Relaxed);
            kept = kept.saturating_sub(bytes);
        }
    }
}

impl Account {
    /// Records that the connection now buffers `bytes`; over the limit, evicts the largest holders
    /// (possibly this one).
    pub(super) fn set(&mut self, bytes: usize) {
        if bytes == self.current {
            return;
        }
        self.held.bytes.store(bytes, Ordering::Relaxed);
        let budget = &self.budget;
        if bytes > self.current {
            let total = budget
                .total
                .fetch_add(bytes - self.current, Ordering::Relaxed)
                + bytes
                - self.current;
            budget.peak.fetch_max(total, Ordering::Relaxed);
            if total > budget.limit {
                budget.enforce();
            }
        } else {
            budget
                .total
                .fetch_sub(self.current - bytes, Ordering::Relaxed);
        }
        self.current = bytes;
    }

    pub(super) fn bytes(&self) -> usize {
        self.current
    }

    pub(super) fn limit(&self) -> usize {
        self.budget.limit
    }

    /// Resolves once the budget chose this connection to close.
    pub(super) async fn evicted(&self) {
        loop {
            if self.held.evicted.load(Ordering::Relaxed) {
                return;
            }
            self.held.wake.notified().await;
        }
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        self.budget.total.fetch_sub(self.current, Ordering::Relaxed);
        self.budget.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_largest_holders_go_first_until_the_rest_fits() {
        let budget = Arc::new(Budget::new(100));
        let mut accounts: Vec<Account> = (0..4).map(|id| budget.open(id)).collect();
        for (account, bytes) in accounts.iter_mut().zip([10, 50, 30, 20]) {
            account.set(bytes);
        }
        let usage = |now, peak, evictions| Usage {
            now,
            peak,
            evictions,
        };
        assert_eq!(budget.usage(), usage(110, 110, 1));
        let evicted = |a: &Account| a.held.evicted.load(Ordering::Relaxed);
        assert_eq!(
            accounts.iter().map(evicted).collect::<Vec<_>>(),
            [false, true, false, false]
        );
        tokio::time::timeout(std::time::Duration::from_secs(1), accounts[1].evicted())
            .await
            .unwrap();
        // The evicted one still holds its bytes until it closes; growing others counts them as freed.
        accounts[0].set(40);
        assert!(!evicted(&accounts[0]));
        accounts[2].set(70);
        assert_eq!(
            accounts.iter().map(evicted).collect::<Vec<_>>(),
            [false, true, true, false]
        );
        accounts.remove(1);
        accounts.remove(1);
        assert_eq!(budget.usage(), usage(60, 180, 2));
        assert_eq!(budget.lock().len(), 2);
    }
}
