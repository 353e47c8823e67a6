//! etcd v3's JSON gateway as data: the request bodies muster sends and the replies it reads, pure.
//!
//! What the gateway does that a reader must not trip over (measured on 3.4.23 and 3.5.1): keys and values
//! are base64; int64 fields come back as strings; proto3 leaves out every default (a missing key has no
//! `kvs`, a failed transaction no `succeeded`, a keepalive of an expired lease no `TTL`); field names are
//! case-sensitive; 3.5 adds stray spaces. So replies are parsed, with every field defaulted, never matched.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

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

fn de_b64<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = String::deserialize(d)?;
    B64.decode(s.as_bytes()).map_err(serde::de::Error::custom)
}

/// An int64 as the gateway writes it (a string), or as a number should one ever come.
fn de_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    de_int(d)
}

/// A uint64 (member ids use the whole range).
fn de_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    de_int(d)
}

fn de_int<'de, D: Deserializer<'de>, T: std::str::FromStr + TryFrom<u64> + TryFrom<i64>>(d: D) -> Result<T, D::Error>
where
    <T as std::str::FromStr>::Err: std::fmt::Display,
{
    let bad = || serde::de::Error::custom("an integer out of range");
    match Value::deserialize(d)? {
        Value::String(s) => s.trim().parse().map_err(serde::de::Error::custom),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => T::try_from(u).map_err(|_| bad()),
            (None, Some(i)) => T::try_from(i).map_err(|_| bad()),
            _ => Err(bad()),
        },
        other => Err(serde::de::Error::custom(format!("not an integer: {other}"))),
    }
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct Header {
    #[serde(default, deserialize_with = "de_i64")]
    pub revision: i64,
    #[serde(default, deserialize_with = "de_u64")]
    pub member_id: u64,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct KeyValue {
    #[serde(default, deserialize_with = "de_b64")]
    pub key: Vec<u8>,
    #[serde(default, deserialize_with = "de_b64")]
    pub value: Vec<u8>,
    #[serde(default, deserialize_with = "de_i64")]
    pub create_revision: i64,
    #[serde(default, deserialize_with = "de_i64")]
    pub mod_revision: i64,
    /// Writes since the key was created (1 after the first).
    #[serde(default, deserialize_with = "de_i64")]
    pub version: i64,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct RangeReply {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub kvs: Vec<KeyValue>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct DeleteReply {
    #[serde(default, deserialize_with = "de_i64")]
    pub deleted: i64,
}

/// One operation's reply inside a transaction's.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct OpReply {
    #[serde(default)]
    pub response_range: Option<RangeReply>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct TxnReply {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<OpReply>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct LeaseReply {
    #[serde(default, rename = "ID", deserialize_with = "de_i64")]
    pub id: i64,
    /// 0 (left out) on a keepalive: the lease is gone.
    #[serde(default, rename = "TTL", deserialize_with = "de_i64")]
    pub ttl: i64,
}

/// A keepalive's answer: the gateway wraps the (streamed) reply in `result`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct KeepaliveReply {
    #[serde(default)]
    pub result: LeaseReply,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct StatusReply {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub version: String,
    #[serde(default, deserialize_with = "de_u64")]
    pub leader: u64,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct AuthReply {
    #[serde(default)]
    pub token: String,
}

/// An error body: `{"error","message","code"}`, `code` the gRPC status.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub struct ErrorReply {
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub error: String,
    #[serde(default)]
    pub code: i64,
}

/// gRPC status codes the client acts on.
/// Cancelled: the gateway's own connection to its member is closing (the member is shutting down).
pub const CODE_CANCELLED: i64 = 1;
/// A request without a user to an etcd with auth on ("user name is empty").
pub const CODE_INVALID_ARGUMENT: i64 = 3;
pub const CODE_PERMISSION_DENIED: i64 = 7;
pub const CODE_NOT_FOUND: i64 = 5;
pub const CODE_UNAVAILABLE: i64 = 14;
pub const CODE_UNAUTHENTICATED: i64 = 16;
/// Deadline exceeded (a request during a leader election, "etcdserver: request timed out").
pub const CODE_DEADLINE: i64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    pub key: Vec<u8>,
    pub mod_revision: i64,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    kv: KeyValue,
}

#[derive(Deserialize)]
struct RawWatch {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    created: bool,
    #[serde(default)]
    canceled: bool,
    #[serde(default, deserialize_with = "de_i64")]
    compact_revision: i64,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default)]
    events: Vec<RawEvent>,
}

#[derive(Deserialize)]
struct WatchLine {
    #[serde(default)]
    result: Option<RawWatch>,
    #[serde(default)]
    error: Option<Value>,
}

/// One line of a watch stream.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchMessage {
    Created,
    Events { events: Vec<Event>, revision: i64 },
    /// The start revision was compacted away; the stream stays open and must be closed by the reader.
    Compacted { compact_revision: i64 },
    /// Cancelled for another reason, or an error line: the stream is done.
    Ended(String),
}

pub fn parse_watch_line(line: &[u8]) -> Result<WatchMessage, serde_json::Error> {
    let line: WatchLine = serde_json::from_slice(line)?;
    let Some(w) = line.result else {
        let why = line.error.map(|e| e.to_string()).unwrap_or_else(|| "a line with neither result nor error".into());
        return Ok(WatchMessage::Ended(why));
    };
    if w.canceled {
        return Ok(match w.compact_revision {
            r if r > 0 => WatchMessage::Compacted { compact_revision: r },
            _ => WatchMessage::Ended(format!("the watch was cancelled: {}", w.cancel_reason)),
        });
    }
    if w.created && w.events.is_empty() {
        return Ok(WatchMessage::Created);
    }
    let events = w
        .events
        .into_iter()
        .map(|e| Event {
            kind: if e.kind == "DELETE" { EventKind::Delete } else { EventKind::Put },
            key: e.kv.key,
            mod_revision: e.kv.mod_revision,
        })
        .collect();
    Ok(WatchMessage::Events { events, revision: w.header.revision })
}

/// The range of one key, or of every key under it when `prefix`.
pub fn range(key: &[u8], prefix: bool, keys_only: bool) -> Value {
    let mut body = json!({ "key": b64(key) });
    if prefix {
        body["range_end"] = json!(b64(&prefix_end(key)));
    }
    if keys_only {
        body["keys_only"] = json!(true);
    }
    body
}

pub fn put(key: &[u8], value: &[u8], lease: Option<i64>) -> Value {
    let mut body = json!({ "key": b64(key), "value": b64(value) });
    if let Some(id) = lease {
        body["lease"] = json!(id.to_string());
    }
    body
}

pub fn delete(key: &[u8]) -> Value {
    json!({ "key": b64(key) })
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

fn compare(c: &Compare<'_>) -> Value {
    match c {
        Compare::Absent(k) => json!({"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}),
        Compare::Value(k, v) => json!({"key": b64(k), "target": "VALUE", "result": "EQUAL", "value": b64(v)}),
        Compare::ModRevision(k, r) => {
            json!({"key": b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": r.to_string()})
        }
    }
}

/// A transaction: `success` (puts) when every comparison holds, else `failure` (ranges).
pub fn txn(compares: &[Compare<'_>], success: Vec<Value>, failure: Vec<Value>) -> Value {
    json!({
        "compare": compares.iter().map(compare).collect::<Vec<_>>(),
        "success": success,
        "failure": failure,
    })
}

pub fn op_put(body: Value) -> Value {
    json!({ "request_put": body })
}

pub fn op_range(body: Value) -> Value {
    json!({ "request_range": body })
}

pub fn watch_create(key: &[u8], prefix: bool, start_revision: i64) -> Value {
    let mut create = json!({ "key": b64(key), "start_revision": start_revision.to_string() });
    if prefix {
        create["range_end"] = json!(b64(&prefix_end(key)));
    }
    json!({ "create_request": create })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    /// Replies as etcd 3.4.23 and 3.5.1 wrote them (3.5's stray spaces included).
    #[test]
    fn replies_parse_with_defaults_left_out() {
        let empty: RangeReply =
            serde_json::from_str(r#"{"header":{"cluster_id":"1","member_id":"17145498371286302730","revision":"7","raft_term":"2"}}"#)
                .unwrap();
        assert!(empty.kvs.is_empty());
        assert_eq!(empty.header.revision, 7);
        let one: RangeReply = serde_json::from_str(
            r#"{"header":{"revision":"3"},"kvs":[{"key":"aw==","create_revision":"2","mod_revision":"3","version":"2","value":"dg=="}],"count":"1"}"#,
        )
        .unwrap();
        assert_eq!((one.kvs[0].key.as_slice(), one.kvs[0].value.as_slice(), one.kvs[0].mod_revision), (&b"k"[..], &b"v"[..], 3));
        let failed: TxnReply = serde_json::from_str(r#"{"header":{"revision":"9"},"responses":[{"response_range":{"header":{"revision":"9"}}}]}"#).unwrap();
        assert!(!failed.succeeded);
        assert!(failed.responses[0].response_range.as_ref().unwrap().kvs.is_empty());
        let lost: LeaseReply = serde_json::from_str(r#"{"header":{"revision":"4"}, "ID":"7587862234186536197"}"#).unwrap();
        assert_eq!((lost.id, lost.ttl), (7587862234186536197, 0));
        let alive: KeepaliveReply = serde_json::from_str(r#"{"result":{"header":{"revision":"4"},"ID":"5","TTL":"10"}}"#).unwrap();
        assert_eq!(alive.result.ttl, 10);
        let expired: KeepaliveReply = serde_json::from_str(r#"{"result":{"header":{"revision":"4"},"ID":"5"}}"#).unwrap();
        assert_eq!(expired.result.ttl, 0);
        let err: ErrorReply =
            serde_json::from_str(r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#)
                .unwrap();
        assert_eq!(err.code, CODE_NOT_FOUND);
        assert!(serde_json::from_str::<RangeReply>(r#"{"header":{"revision":"x"}}"#).is_err());
    }

    #[test]
    fn watch_lines() {
        let created = br#"{"result":{"header":{"revision":"5"},"created":true}}"#;
        assert_eq!(parse_watch_line(created).unwrap(), WatchMessage::Created);
        let events = br#"{"result":{"header":{"revision":"7"},"events":[{"kv":{"key":"YQ==","create_revision":"6","mod_revision":"6","version":"1","value":"MQ=="}},{"type":"DELETE","kv":{"key":"Yg==","mod_revision":"7"}}]}}"#;
        let want = WatchMessage::Events {
            events: vec![
                Event { kind: EventKind::Put, key: b"a".to_vec(), mod_revision: 6 },
                Event { kind: EventKind::Delete, key: b"b".to_vec(), mod_revision: 7 },
            ],
            revision: 7,
        };
        assert_eq!(parse_watch_line(events).unwrap(), want);
        let compacted = br#"{"result":{"header":{"revision":"9"},"canceled":true,"compact_revision":"8"}}"#;
        assert_eq!(parse_watch_line(compacted).unwrap(), WatchMessage::Compacted { compact_revision: 8 });
        let error = br#"{"error":{"grpc_code":14,"http_code":503,"message":"unavailable"}}"#;
        assert!(matches!(parse_watch_line(error).unwrap(), WatchMessage::Ended(_)));
        assert!(parse_watch_line(b"not json").is_err());
    }

    #[test]
    fn requests_name_fields_as_the_gateway_wants() {
        let t = txn(&[Compare::Absent(b"k")], vec![op_put(put(b"k", b"v", Some(12)))], vec![op_range(range(b"k", false, false))]);
        assert_eq!(
            t,
            json!({
                "compare": [{"key": "aw==", "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                "success": [{"request_put": {"key": "aw==", "value": "dg==", "lease": "12"}}],
                "failure": [{"request_range": {"key": "aw=="}}],
            })
        );
        assert_eq!(range(b"a/", true, true), json!({"key": "YS8=", "range_end": "YTA=", "keys_only": true}));
        assert_eq!(
            watch_create(b"a/", true, 4),
            json!({"create_request": {"key": "YS8=", "range_end": "YTA=", "start_revision": "4"}})
        );
    }
}
