//! A key as a Lease, pure: what an object written for a key holds, and what a Lease read back says. The
//! value goes in an annotation (base64: annotations are strings), the key beside it for people; a session
//! object is a Lease whose spec says who holds it and for how long, renewed by its holder; a session key
//! names its session object in a label, and (where a real cluster's garbage collector runs) in an owner
//! reference, so that it goes with its session. A counter's adds are annotations of their own beside the
//! value (N nodes adding at once then cost N patches, none refused), summed where the object is read.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

use super::names;

/// The most a value may hold: annotations share 256 KiB, the key and base64's third more besides.
pub const MAX_VALUE: usize = 180 * 1024;

/// What a key's object says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Vec<u8>,
    /// The object's resourceVersion: what a compare-and-set is conditional on.
    pub version: String,
    /// The session object it goes with (a session key), if any.
    pub session: Option<String>,
}

/// Why a Lease is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("the Lease {name} has no {what}")]
    Missing { name: String, what: &'static str },
    #[error("the Lease {name} holds a value that is not base64: {why}")]
    Value { name: String, why: String },
    #[error("the Lease {name} holds an add that is not a decimal integer: {annotation}={delta:?}")]
    Add { name: String, annotation: String, delta: String },
}

/// Who holds a session object, and for how long each renewal counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub id: String,
    pub ttl: Duration,
}

/// The object of `key` in job `job` holding `value`; `version`: the resourceVersion the write is
/// conditional on (None: unconditional). `session`: the session object's name and uid of a session key.
/// `holder`: set on a session object itself, renewed now.
pub fn lease(job: &str, key: &str, value: &[u8], version: Option<&str>, link: Link<'_>) -> Lease {
    let mut labels = names::labels(job, key);
    let annotations = BTreeMap::from([
        (names::KEY_TEXT.to_string(), key.to_string()),
        (names::VALUE.to_string(), base64::engine::general_purpose::STANDARD.encode(value)),
    ]);
    let (mut owner_references, mut spec) = (None, None);
    match link {
        Link::None => {}
        Link::SessionKey { session, uid } => {
            labels.insert(names::SESSION.to_string(), session.to_string());
            owner_references = uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "coordination.k8s.io/v1".into(),
                    kind: "Lease".into(),
                    name: session.to_string(),
                    uid: uid.to_string(),
                    ..OwnerReference::default()
                }]
            });
        }
        Link::Holder(holder) => {
            labels.insert(names::ROLE.to_string(), names::ROLE_SESSION.to_string());
            spec = Some(renewed(holder));
        }
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(names::object_name(job, key)),
            labels: Some(labels),
            annotations: Some(annotations),
            resource_version: version.map(str::to_string),
            owner_references,
            ..ObjectMeta::default()
        },
        spec,
    }
}

/// An add of `delta` to `key`'s counter, `id` unique to it: the patch carrying its one annotation, and
/// the object to create where the key is absent (its value empty: 0).
pub fn increment(job: &str, key: &str, delta: i64, id: &str) -> (Lease, Lease) {
    let annotations = BTreeMap::from([(names::KEY_TEXT.to_string(), key.to_string()), (format!("{}{id}", names::ADD), delta.to_string())]);
    let metadata = ObjectMeta {
        name: Some(names::object_name(job, key)),
        labels: Some(names::labels(job, key)),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    };
    let patch = Lease { metadata, spec: None };
    let mut create = patch.clone();
    create.metadata.annotations.get_or_insert_default().insert(names::VALUE.to_string(), String::new());
    (patch, create)
}

/// How many adds `lease` holds beside its value.
pub fn adds(lease: &Lease) -> usize {
    lease.metadata.annotations.as_ref().map_or(0, |a| a.keys().filter(|k| k.starts_with(names::ADD)).count())
}

/// The adds `lease` holds folded into its value, as JSON patch operations: applied only while the value
/// is the one read (else another fold won: the test fails and nothing changes), and never in an add's
/// way (the adds since stay). None: nothing to fold, or not an object of ours.
pub fn fold(lease: &Lease) -> Option<serde_json::Value> {
    let annotations = lease.metadata.annotations.as_ref()?;
    let written = annotations.get(names::VALUE)?;
    let folded = base64::engine::general_purpose::STANDARD.encode(entry(lease).ok()?.value);
    let path = |annotation: &str| format!("/metadata/annotations/{}", annotation.replace('~', "~0").replace('/', "~1"));
    let mut ops = vec![
        serde_json::json!({"op": "test", "path": path(names::VALUE), "value": written}),
        serde_json::json!({"op": "replace", "path": path(names::VALUE), "value": folded}),
    ];
    ops.extend(annotations.keys().filter(|k| k.starts_with(names::ADD)).map(|k| serde_json::json!({"op": "remove", "path": path(k)})));
    let folds = ops.len() > 2;
    folds.then_some(serde_json::Value::Array(ops))
}

/// How an object is tied to this handle's session.
#[derive(Debug, Clone, Copy)]
pub enum Link<'a> {
    None,
    /// A session key: deleted with its session object.
    SessionKey { session: &'a str, uid: Option<&'a str> },
    /// The session object itself, renewed by this write.
    Holder(&'a Holder),
}

/// A session object's spec as its holder renews it: now, for `ttl`.
fn renewed(holder: &Holder) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.id.clone()),
        lease_duration_seconds: Some(i32::try_from(holder.ttl.as_secs().max(1)).unwrap_or(i32::MAX)),
        renew_time: Some(MicroTime(jiff::Timestamp::now())),
        ..LeaseSpec::default()
    }
}

/// What `lease` holds.
pub fn entry(lease: &Lease) -> Result<Entry, Unreadable> {
    let meta = &lease.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let missing = |what| Unreadable::Missing { name: name.clone(), what };
    let annotations = meta.annotations.as_ref().ok_or_else(|| missing("annotations"))?;
    let key = annotations.get(names::KEY_TEXT).ok_or_else(|| missing("key annotation"))?;
    let encoded = annotations.get(names::VALUE).map(String::as_str).unwrap_or_default();
    let value = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| Unreadable::Value { name: name.clone(), why: e.to_string() })?;
    let value = counted(&name, value, annotations)?;
    let version = meta.resource_version.clone().ok_or_else(|| missing("resourceVersion"))?;
    let session = meta.labels.as_ref().and_then(|l| l.get(names::SESSION)).cloned();
    Ok(Entry { key: key.clone(), value, version, session })
}

/// A key's value with the adds since it was written summed in. A value that is not a number refused
/// those adds (each add said so to its caller): it stands as written.
fn counted(name: &str, written: Vec<u8>, annotations: &BTreeMap<String, String>) -> Result<Vec<u8>, Unreadable> {
    let mut adds = annotations.iter().filter(|(k, _)| k.starts_with(names::ADD)).peekable();
    let base = match std::str::from_utf8(&written).map(str::trim) {
        _ if adds.peek().is_none() => return Ok(written),
        Ok("") => 0,
        Ok(text) => match text.parse::<i64>() {
            Ok(n) => n,
            Err(_) => return Ok(written),
        },
        Err(_) => return Ok(written),
    };
    let mut sum = base;
    for (annotation, delta) in adds {
        let bad = || Unreadable::Add { name: name.to_string(), annotation: annotation.clone(), delta: delta.clone() };
        sum = sum.saturating_add(delta.parse::<i64>().map_err(|_| bad())?);
    }
    Ok(sum.to_string().into_bytes())
}

/// A session object's renewal as its holder wrote it: the time (the holder's clock: a hint, never a
/// verdict) and the duration it counts for.
pub fn renewal(lease: &Lease) -> Option<(jiff::Timestamp, Duration)> {
    let spec = lease.spec.as_ref()?;
    let at = spec.renew_time.as_ref()?.0;
    let secs = u64::try_from(spec.lease_duration_seconds?).ok()?;
    Some((at, Duration::from_secs(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_comes_back_as_written_bytes_and_all() {
        let value = [0u8, 159, 146, 150, b'x'];
        let mut written = lease("j/", "j/r/1/m/0", &value, None, Link::None);
        written.metadata.resource_version = Some("42".into());
        let read = entry(&written).unwrap();
        assert_eq!(read, Entry { key: "j/r/1/m/0".into(), value: value.to_vec(), version: "42".into(), session: None });
    }

    #[test]
    fn a_session_key_names_its_session_and_the_session_object_its_holder() {
        let key = lease("j/", "j/alive/n1", b"1", Some("7"), Link::SessionKey { session: "muster-abc", uid: Some("u-1") });
        assert_eq!(key.metadata.labels.as_ref().unwrap()[names::SESSION], "muster-abc");
        assert_eq!(key.metadata.owner_references.as_ref().unwrap()[0].uid, "u-1");
        assert_eq!(key.metadata.resource_version.as_deref(), Some("7"));
        let holder = Holder { id: "n1".into(), ttl: Duration::from_secs(15) };
        let object = lease("j/", "j/hb/n1", b"beat", None, Link::Holder(&holder));
        let (_, ttl) = renewal(&object).unwrap();
        assert_eq!(ttl, Duration::from_secs(15));
        assert_eq!(object.spec.unwrap().holder_identity.as_deref(), Some("n1"));
    }

    #[test]
    fn a_counter_is_its_value_and_the_adds_since() {
        let read = |value: &[u8], adds: &[&str]| {
            let mut lease = lease("j/", "j/r/1/slot", value, Some("3"), Link::None);
            let annotations = lease.metadata.annotations.as_mut().unwrap();
            for (i, delta) in adds.iter().enumerate() {
                annotations.insert(format!("{}{i}", names::ADD), delta.to_string());
            }
            entry(&lease).map(|e| String::from_utf8_lossy(&e.value).into_owned()).map_err(|e| e.to_string())
        };
        assert_eq!(read(b"", &["1", "1", "1"]), Ok("3".into()));
        assert_eq!(read(b"10", &["5", "-2"]), Ok("13".into()));
        assert_eq!(read(b"7", &[]), Ok("7".into()));
        assert_eq!(read(b"text", &["1"]), Ok("text".into()), "a value that is not a number stands");
        assert_eq!(read(&[0xff], &["1"]), Ok("\u{fffd}".into()));
        let bad = read(b"1", &["x"]).unwrap_err();
        assert_eq!(bad, format!("the Lease {} holds an add that is not a decimal integer: muster.dev/add-0=\"x\"", names::object_name("j/", "j/r/1/slot")));
        let (patch, mut create) = increment("j/", "j/r/1/slot", 1, "abc");
        assert_eq!((adds(&patch), adds(&create)), (1, 1));
        assert!(!patch.metadata.annotations.as_ref().unwrap().contains_key(names::VALUE), "an add leaves the value alone");
        create.metadata.resource_version = Some("1".into());
        assert_eq!(entry(&create).unwrap().value, b"1");
    }

    #[test]
    fn a_fold_tests_the_value_read_and_removes_only_the_adds_it_summed() {
        let mut lease = lease("j/", "j/n", b"5", Some("3"), Link::None);
        assert_eq!(fold(&lease), None, "nothing to fold");
        lease.metadata.annotations.as_mut().unwrap().insert(format!("{}a", names::ADD), "2".into());
        let ops = fold(&lease).unwrap();
        let expected = serde_json::json!([
            {"op": "test", "path": "/metadata/annotations/muster.dev~1v", "value": "NQ=="},
            {"op": "replace", "path": "/metadata/annotations/muster.dev~1v", "value": "Nw=="},
            {"op": "remove", "path": "/metadata/annotations/muster.dev~1add-a"},
        ]);
        assert_eq!(ops, expected);
    }

    #[test]
    fn an_object_not_ours_is_named() {
        let foreign = Lease { metadata: ObjectMeta { name: Some("kube-scheduler".into()), ..ObjectMeta::default() }, spec: None };
        assert_eq!(entry(&foreign).unwrap_err().to_string(), "the Lease kube-scheduler has no annotations");
    }
}
