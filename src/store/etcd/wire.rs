//! The requests muster sends to etcd, built from the messages in `pb`, and what their replies hold: pure.
//!
//! What a reader must not trip over: proto3 leaves out every default, so a missing key has no `kvs`, a
//! failed transaction no `succeeded`, a keepalive of an expired lease a TTL of 0; a counter's value is its
//! key's `version` (see `counter`).

use super::pb::{self, compare as cmp, request_op::Request, response_op::Response};

/// The end of the range of every key that starts with `prefix` (etcd's `range_end`): the prefix with its
/// last byte below 0xff incremented; "\0" (every key) when there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn end_of(key: &[u8], prefix: bool) -> Vec<u8> {
    if prefix {
        prefix_end(key)
    } else {
        Vec::new()
    }
}

/// The range of one key, or of every key under it when `prefix`.
pub fn range(key: &[u8], prefix: bool, keys_only: bool) -> pb::RangeRequest {
    pb::RangeRequest { key: key.to_vec(), range_end: end_of(key, prefix), serializable: false, keys_only }
}

pub fn put(key: &[u8], value: &[u8], lease: Option<i64>) -> pb::PutRequest {
    pb::PutRequest { key: key.to_vec(), value: value.to_vec(), lease: lease.unwrap_or(0) }
}

pub fn delete(key: &[u8]) -> pb::DeleteRangeRequest {
    pb::DeleteRangeRequest { key: key.to_vec(), range_end: Vec::new() }
}

/// What a transaction compares.
#[derive(Debug, Clone, PartialEq)]
pub enum Compare<'a> {
    /// The key does not exist.
    Absent(&'a [u8]),
    /// The key's value equals this (a missing key never does).
    Value(&'a [u8], &'a [u8]),
    /// The key was last written at this revision.
    ModRevision(&'a [u8], i64),
}

fn compare(c: &Compare<'_>) -> pb::Compare {
    let (key, target, union) = match c {
        Compare::Absent(k) => (k, cmp::TARGET_CREATE, cmp::TargetUnion::CreateRevision(0)),
        Compare::Value(k, v) => (k, cmp::TARGET_VALUE, cmp::TargetUnion::Value(v.to_vec())),
        Compare::ModRevision(k, r) => (k, cmp::TARGET_MOD, cmp::TargetUnion::ModRevision(*r)),
    };
    pb::Compare { result: cmp::EQUAL, target, key: key.to_vec(), target_union: Some(union) }
}

/// A transaction: `success` when every comparison holds, else `failure`.
pub fn txn(compares: &[Compare<'_>], success: Vec<pb::RequestOp>, failure: Vec<pb::RequestOp>) -> pb::TxnRequest {
    pb::TxnRequest { compare: compares.iter().map(compare).collect(), success, failure }
}

pub fn op_put(put: pb::PutRequest) -> pb::RequestOp {
    pb::RequestOp { request: Some(Request::RequestPut(put)) }
}

pub fn op_range(range: pb::RangeRequest) -> pb::RequestOp {
    pb::RequestOp { request: Some(Request::RequestRange(range)) }
}

/// A transaction inside a transaction's branch (etcd 3.3 and later).
pub fn op_txn(txn: pb::TxnRequest) -> pb::RequestOp {
    pb::RequestOp { request: Some(Request::RequestTxn(Box::new(txn))) }
}

/// The reply of the first transaction inside a transaction's branch, if it had one.
pub fn nested(reply: pb::TxnResponse) -> Option<pb::TxnResponse> {
    reply.responses.into_iter().find_map(|r| match r.response {
        Some(Response::ResponseTxn(txn)) => Some(*txn),
        _ => None,
    })
}

/// The ranges' replies of a transaction, in order (puts' replies left out).
pub fn ranges(reply: pb::TxnResponse) -> impl Iterator<Item = pb::RangeResponse> {
    reply.responses.into_iter().filter_map(|r| match r.response {
        Some(Response::ResponseRange(range)) => Some(range),
        _ => None,
    })
}

/// The first key of a range's reply.
pub fn first(range: pb::RangeResponse) -> Option<pb::KeyValue> {
    range.kvs.into_iter().next()
}

/// The revision a reply was made at (0 when etcd left the header out).
pub fn revision(header: Option<&pb::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

/// Asks a watch stream's member to answer at once (a progress notification): proof the stream still works.
pub fn watch_progress() -> pb::WatchRequest {
    pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::ProgressRequest(pb::WatchProgressRequest {})) }
}

pub fn watch_create(key: &[u8], prefix: bool, start_revision: i64, watch_id: i64) -> pb::WatchRequest {
    let create = pb::WatchCreateRequest { key: key.to_vec(), range_end: end_of(key, prefix), start_revision, watch_id };
    pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)) }
}

pub fn watch_cancel(watch_id: i64) -> pb::WatchRequest {
    pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CancelRequest(pb::WatchCancelRequest { watch_id })) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn an_absent_key_is_compared_on_its_create_revision() {
        let t = txn(&[Compare::Absent(b"k")], vec![op_put(put(b"k", b"v", Some(7)))], vec![op_range(range(b"k", false, false))]);
        assert_eq!(t.compare[0].target, cmp::TARGET_CREATE);
        assert_eq!(t.compare[0].target_union, Some(cmp::TargetUnion::CreateRevision(0)));
        assert_eq!(t.success[0].request, Some(Request::RequestPut(pb::PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), lease: 7 })));
        let watch = watch_create(b"p/", true, 5, 2);
        let Some(pb::watch_request::RequestUnion::CreateRequest(c)) = watch.request_union else { panic!("a create") };
        assert_eq!((c.range_end.as_slice(), c.start_revision, c.watch_id), (&b"p0"[..], 5, 2));
    }

    #[test]
    fn a_transactions_ranges_come_in_order() {
        let range_of = |k: &[u8]| pb::ResponseOp {
            response: Some(Response::ResponseRange(pb::RangeResponse {
                header: None,
                kvs: vec![pb::KeyValue { key: k.to_vec(), ..Default::default() }],
            })),
        };
        let put = pb::ResponseOp { response: Some(Response::ResponsePut(pb::PutResponse { header: None })) };
        let reply = pb::TxnResponse { header: None, succeeded: true, responses: vec![put, range_of(b"a"), range_of(b"b")] };
        let keys: Vec<Vec<u8>> = ranges(reply).filter_map(first).map(|kv| kv.key).collect();
        assert_eq!(keys, [b"a".to_vec(), b"b".to_vec()]);
    }
}
