//! etcd v3's gRPC messages that muster sends and reads, in the form prost's code generator gives them, kept
//! in the repository so that no build needs `protoc`. Field numbers and names are etcd's own
//! (`etcdserverpb/rpc.proto` and `mvccpb/kv.proto`, the same in 3.4 and 3.5); only the fields muster uses are
//! declared (protobuf skips the others on decode, and a field left out is never sent). The services' method
//! paths are in [`path`]. Checked byte for byte by the vectors in this file's tests.

// Variants are named as etcd names them, which is how prost generates them.
#![allow(clippy::derive_partial_eq_without_eq, clippy::enum_variant_names)]

/// The gRPC method paths (`/package.Service/Method`).
pub mod path {
    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    pub const PUT: &str = "/etcdserverpb.KV/Put";
    pub const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
    pub const TXN: &str = "/etcdserverpb.KV/Txn";
    pub const WATCH: &str = "/etcdserverpb.Watch/Watch";
    pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
    pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
    pub const LEASE_KEEPALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
    pub const STATUS: &str = "/etcdserverpb.Maintenance/Status";
    pub const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    /// Writes since the key was created (1 after the first).
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    /// A read any member answers from its own state, without a quorum round.
    #[prost(bool, tag = "7")]
    pub serializable: bool,
    #[prost(bool, tag = "8")]
    pub keys_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "request_op::Request", tags = "1, 2, 3, 4")]
    pub request: Option<request_op::Request>,
}

pub mod request_op {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Request {
        #[prost(message, tag = "1")]
        RequestRange(super::RangeRequest),
        #[prost(message, tag = "2")]
        RequestPut(super::PutRequest),
        #[prost(message, tag = "3")]
        RequestDeleteRange(super::DeleteRangeRequest),
        #[prost(message, tag = "4")]
        RequestTxn(Box<super::TxnRequest>),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(oneof = "response_op::Response", tags = "1, 2, 3, 4")]
    pub response: Option<response_op::Response>,
}

pub mod response_op {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        #[prost(message, tag = "1")]
        ResponseRange(super::RangeResponse),
        #[prost(message, tag = "2")]
        ResponsePut(super::PutResponse),
        #[prost(message, tag = "3")]
        ResponseDeleteRange(super::DeleteRangeResponse),
        #[prost(message, tag = "4")]
        ResponseTxn(Box<super::TxnResponse>),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    /// `compare::CompareResult`: EQUAL 0, GREATER 1, LESS 2, NOT_EQUAL 3.
    #[prost(int32, tag = "1")]
    pub result: i32,
    /// `compare::CompareTarget`: CREATE 1, MOD 2, VALUE 3.
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "compare::TargetUnion", tags = "4, 5, 6, 7")]
    pub target_union: Option<compare::TargetUnion>,
}

pub mod compare {
    pub const EQUAL: i32 = 0;
    pub const TARGET_CREATE: i32 = 1;
    pub const TARGET_MOD: i32 = 2;
    pub const TARGET_VALUE: i32 = 3;

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum TargetUnion {
        #[prost(int64, tag = "4")]
        Version(i64),
        #[prost(int64, tag = "5")]
        CreateRevision(i64),
        #[prost(int64, tag = "6")]
        ModRevision(i64),
        #[prost(bytes, tag = "7")]
        Value(Vec<u8>),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(oneof = "watch_request::RequestUnion", tags = "1, 2, 3")]
    pub request_union: Option<watch_request::RequestUnion>,
}

pub mod watch_request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum RequestUnion {
        #[prost(message, tag = "1")]
        CreateRequest(super::WatchCreateRequest),
        #[prost(message, tag = "2")]
        CancelRequest(super::WatchCancelRequest),
        #[prost(message, tag = "3")]
        ProgressRequest(super::WatchProgressRequest),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    /// Chosen by the client (etcd 3.4 and later), so that replies are matched by id, not by order.
    #[prost(int64, tag = "7")]
    pub watch_id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCancelRequest {
    #[prost(int64, tag = "1")]
    pub watch_id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchProgressRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// PUT 0, DELETE 1.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
}

pub const EVENT_DELETE: i32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// 0: the lease is gone.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(uint64, tag = "4")]
    pub leader: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateResponse {
    #[prost(string, tag = "2")]
    pub token: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Vectors written from the protobuf encoding rules (tag = field << 3 | wire type; 0 varint, 2 bytes).
    #[test]
    fn requests_encode_as_etcd_reads_them() {
        let range = RangeRequest { key: b"a".to_vec(), range_end: b"b".to_vec(), serializable: true, keys_only: false };
        assert_eq!(range.encode_to_vec(), [0x0a, 1, b'a', 0x12, 1, b'b', 0x38, 1]);
        let put = PutRequest { key: b"k".to_vec(), value: vec![], lease: 300 };
        assert_eq!(put.encode_to_vec(), [0x0a, 1, b'k', 0x18, 0xac, 0x02]);
        let cmp = Compare {
            result: compare::EQUAL,
            target: compare::TARGET_MOD,
            key: b"k".to_vec(),
            target_union: Some(compare::TargetUnion::ModRevision(5)),
        };
        assert_eq!(cmp.encode_to_vec(), [0x10, 2, 0x1a, 1, b'k', 0x30, 5]);
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"k".to_vec(),
                range_end: vec![],
                start_revision: 9,
                watch_id: 3,
            })),
        };
        assert_eq!(create.encode_to_vec(), [0x0a, 7, 0x0a, 1, b'k', 0x18, 9, 0x38, 3]);
        let grant = LeaseGrantRequest { ttl: 15 };
        assert_eq!(grant.encode_to_vec(), [0x08, 15]);
    }

    #[test]
    fn replies_decode_with_unknown_fields_skipped() {
        // A RangeResponse: header {cluster_id 7 (not declared), member_id 1, revision 4}, one kv, more=false,
        // count 1 (not declared).
        let bytes = [
            0x0a, 6, 0x08, 7, 0x10, 1, 0x18, 4, // header
            0x12, 10, 0x0a, 1, b'k', 0x20, 2, 0x2a, 1, b'v', 0x30, 0, // kvs[0]: key, version 2, value, lease 0
            0x20, 1, // count
        ];
        let reply = RangeResponse::decode(&bytes[..]).expect("decodes");
        assert_eq!(reply.header, Some(ResponseHeader { member_id: 1, revision: 4 }));
        assert_eq!(reply.kvs.len(), 1);
        assert_eq!((reply.kvs[0].key.as_slice(), reply.kvs[0].value.as_slice(), reply.kvs[0].version), (&b"k"[..], &b"v"[..], 2));
        let event = Event::decode(&[0x08, 1, 0x12, 3, 0x0a, 1, b'k'][..]).expect("decodes");
        assert_eq!((event.r#type, event.kv.map(|kv| kv.key)), (EVENT_DELETE, Some(b"k".to_vec())));
    }
}
