//! Reading several keys in one request: a read-only transaction of up to [`MAX_TXN_OPS`] Ranges. etcd 3.5.0
//! to 3.5.4 panic, and the member exits, when such a transaction's request is cancelled while it runs
//! (etcd-io/etcd#14110, fixed in 3.5.5): etcd cancels a request at its gRPC deadline, and a client that gives
//! up resets it, so under load a busy member would be brought down by its own clients. There the transaction
//! goes without a deadline and is never reset ([`Deadline::Uncancelled`]): the caller stops waiting at its
//! bound as before, and the request finishes on its own.

use tokio::time::Instant;

use super::cluster::Deadline;
use super::pb::{self, path};
use super::{wire, EtcdStore, MAX_TXN_OPS};
use crate::store::StoreError;

/// Whether etcd `version` (as its status reports it, e.g. `3.5.1`) survives a cancelled read-only
/// transaction. A version this cannot read is not trusted with one.
pub(super) fn survives_cancelled_reads(version: &str) -> bool {
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
        let kind = if self.cancel_reads { Deadline::Call } else { Deadline::Uncancelled };
        let mut replies = Vec::with_capacity(reads.len());
        let mut reads = reads.into_iter().peekable();
        while reads.peek().is_some() {
            let chunk = reads.by_ref().take(MAX_TXN_OPS).map(wire::op_range).collect();
            let deadline = Instant::now() + self.timeout;
            let reply: pb::TxnResponse = self.cluster.call_as(path::TXN, &wire::txn(&[], chunk, vec![]), deadline, kind).await?;
            let revision = wire::revision(reply.header.as_ref());
            replies.extend(wire::ranges(reply).map(|r| (r, revision)));
        }
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::survives_cancelled_reads;

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
            assert_eq!(survives_cancelled_reads(version), safe, "{version:?}");
        }
    }
}
