//! Reading several keys in one request, where etcd can take it. A read-only transaction is one request for
//! any number of keys (up to [`MAX_TXN_OPS`] each), but etcd 3.5.0 to 3.5.4 panic, and the member exits,
//! when such a transaction's request is cancelled while it runs (etcd-io/etcd#14110, fixed in 3.5.5): a
//! request past its deadline is cancelled by etcd itself, and one this side gives up is reset, so under load
//! a busy member would be brought down by its clients. Such a member is read key by key, one Range each (a
//! cancelled Range only fails), [`IN_FLIGHT`] at a time.

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cluster::Cluster;
use super::pb::{self, path};
use super::{wire, EtcdStore, MAX_TXN_OPS};
use crate::store::StoreError;

/// The most Ranges one read key by key keeps in flight: a few keys' reads at once, not a burst of
/// thousands that would time out together.
const IN_FLIGHT: usize = 16;

/// Whether etcd `version` (as its status reports it, e.g. `3.5.1`) survives a cancelled read-only
/// transaction. A version this cannot read is not trusted with one.
pub(super) fn txn_reads_safe(version: &str) -> bool {
    let mut parts = version.trim().trim_start_matches('v').split(['.', '-', '+']).map(str::parse::<u32>);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(3)), Some(Ok(5)), Some(Ok(patch))) => patch >= 5,
        (Some(Ok(major)), Some(Ok(minor)), Some(Ok(_))) => (major, minor) != (3, 5),
        _ => false,
    }
}

impl EtcdStore {
    /// Every read's reply, in order, each with the revision it was made at.
    pub(super) async fn read_all(&self, reads: Vec<pb::RangeRequest>) -> Result<Vec<(pb::RangeResponse, i64)>, StoreError> {
        if !self.txn_reads {
            return key_by_key(&self.cluster, reads, Instant::now() + self.timeout).await;
        }
        let mut replies = Vec::with_capacity(reads.len());
        let mut reads = reads.into_iter().peekable();
        while reads.peek().is_some() {
            let chunk = reads.by_ref().take(MAX_TXN_OPS).map(wire::op_range).collect();
            let reply = self.txn(&wire::txn(&[], chunk, vec![])).await?;
            let revision = wire::revision(reply.header.as_ref());
            replies.extend(wire::ranges(reply).map(|r| (r, revision)));
        }
        Ok(replies)
    }
}

async fn key_by_key(cluster: &Arc<Cluster>, reads: Vec<pb::RangeRequest>, deadline: Instant) -> Result<Vec<(pb::RangeResponse, i64)>, StoreError> {
    let mut replies: Vec<Option<(pb::RangeResponse, i64)>> = vec![None; reads.len()];
    let mut calls = JoinSet::new();
    let mut reads = reads.into_iter().enumerate();
    loop {
        while calls.len() < IN_FLIGHT {
            let Some((i, read)) = reads.next() else { break };
            let cluster = cluster.clone();
            calls.spawn(async move { (i, cluster.call::<_, pb::RangeResponse>(path::RANGE, &read, deadline).await) });
        }
        let Some(done) = calls.join_next().await else { break };
        let (i, reply) = done.map_err(|e| StoreError::Etcd { endpoint: cluster.named.clone(), code: 0, message: e.to_string() })?;
        let reply = reply?;
        let revision = wire::revision(reply.header.as_ref());
        replies[i] = Some((reply, revision));
    }
    Ok(replies.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::txn_reads_safe;

    #[test]
    fn only_the_releases_that_survive_a_cancelled_read_transaction_get_one() {
        let cases = [
            ("3.4.23", true),
            ("3.5.0", false),
            ("3.5.1", false),
            ("3.5.4", false),
            ("3.5.5", true),
            ("3.5.17", true),
            ("3.6.0", true),
            ("v3.5.2", false),
            ("3.5.3-rc.0", false),
            ("", false),
            ("three", false),
        ];
        for (version, safe) in cases {
            assert_eq!(txn_reads_safe(version), safe, "{version:?}");
        }
    }
}
