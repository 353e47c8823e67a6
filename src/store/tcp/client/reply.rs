//! The client's key namespace and its reply converters: each takes a decoded [`Reply`] and returns the value
//! of the shape an operation expects, or `None` for another shape (the caller's protocol error).

use super::super::frame::Reply;

/// A key as torch's client puts it on the wire (`/` + key).
pub(super) fn wire(key: &str) -> Vec<u8> {
    let mut wire = Vec::with_capacity(key.len() + 1);
    wire.push(b'/');
    wire.extend_from_slice(key.as_bytes());
    wire
}

pub(super) fn wires(keys: &[&str]) -> Vec<Vec<u8>> {
    keys.iter().map(|k| wire(k)).collect()
}

pub(super) fn byte_of(reply: Reply<'_>) -> Option<u8> {
    match reply {
        Reply::Byte(b) => Some(b),
        _ => None,
    }
}

pub(super) fn nonce_of(reply: Reply<'_>) -> Option<u32> {
    match reply {
        Reply::Nonce(n) => Some(n),
        _ => None,
    }
}

pub(super) fn int_of(reply: Reply<'_>) -> Option<i64> {
    match reply {
        Reply::Int(n) => Some(n),
        _ => None,
    }
}

pub(super) fn value_of(reply: Reply<'_>) -> Option<Vec<u8>> {
    match reply {
        Reply::Value(v) => Some(v.to_vec()),
        _ => None,
    }
}

pub(super) fn values_of(reply: Reply<'_>) -> Option<Vec<Vec<u8>>> {
    match reply {
        Reply::Values(values) => Some(values.into_iter().map(<[u8]>::to_vec).collect()),
        _ => None,
    }
}

pub(super) fn item_of(reply: Reply<'_>) -> Option<Option<Vec<u8>>> {
    match reply {
        Reply::QueueItem { value, .. } => Some(value.map(<[u8]>::to_vec)),
        _ => None,
    }
}

/// Keys in the client namespace, without their `/`; others (torch's `init/`) left out.
pub(super) fn keys_of(reply: Reply<'_>) -> Option<Vec<String>> {
    match reply {
        Reply::Keys(keys) => Some(
            keys.into_iter()
                .filter_map(|k| k.strip_prefix(b"/"))
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect(),
        ),
        _ => None,
    }
}
