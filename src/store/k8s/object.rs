//! A key as a Lease, pure: what an object written for a key holds, and what a Lease read back says. The
//! value goes in an annotation (base64: annotations are strings), the key beside it for people; a session
//! object is a Lease whose spec says who holds it and for how long, renewed by its holder; a session key
//! names its session object in a label, and (where a real cluster's garbage collector runs) in an owner
//! reference, so that it goes with its session; every other object but the lemon memory names the job
//! (the pod's controller, where the agent found it) as its owner.

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

/// The owner of the objects this handle creates, and the keys left without one.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub reference: OwnerReference,
    /// Keys under this prefix are created unowned (the lemon memory).
    pub unowned: String,
}

/// `lease` as this handle creates it: owned by `owner` unless its key is unowned or it has an owner
/// already (a session key goes with its session object).
pub fn owned(lease: &Lease, owner: Option<&Owner>) -> Lease {
    let mut lease = lease.clone();
    let key = lease.metadata.annotations.as_ref().and_then(|a| a.get(names::KEY_TEXT));
    if let Some(owner) = owner.filter(|o| key.is_some_and(|k| !k.starts_with(&o.unowned))) {
        lease.metadata.owner_references.get_or_insert_with(|| vec![owner.reference.clone()]);
    }
    lease
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
    let version = meta.resource_version.clone().ok_or_else(|| missing("resourceVersion"))?;
    let session = meta.labels.as_ref().and_then(|l| l.get(names::SESSION)).cloned();
    Ok(Entry { key: key.clone(), value, version, session })
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
    fn an_object_not_ours_is_named() {
        let foreign = Lease { metadata: ObjectMeta { name: Some("kube-scheduler".into()), ..ObjectMeta::default() }, spec: None };
        assert_eq!(entry(&foreign).unwrap_err().to_string(), "the Lease kube-scheduler has no annotations");
    }

    fn job_reference(kind: &str) -> OwnerReference {
        OwnerReference { api_version: "batch/v1".into(), kind: kind.into(), name: "trainer".into(), uid: format!("uid-{kind}"), ..OwnerReference::default() }
    }

    #[test]
    fn every_key_but_the_unowned_and_session_keys_is_owned() {
        let owner = Owner { reference: job_reference("Job"), unowned: "muster/j/culprits/".into() };
        let lease = |key: &str, owners: Option<Vec<OwnerReference>>| {
            let annotations = BTreeMap::from([(names::KEY_TEXT.to_string(), key.to_string())]);
            Lease { metadata: ObjectMeta { annotations: Some(annotations), owner_references: owners, ..ObjectMeta::default() }, spec: None }
        };
        let kinds = |l: Lease| l.metadata.owner_references.map(|o| o.into_iter().map(|r| r.kind).collect::<Vec<_>>());
        assert_eq!(kinds(owned(&lease("muster/j/r/0/slot", None), Some(&owner))), Some(vec!["Job".into()]));
        assert_eq!(kinds(owned(&lease("muster/j/culprits/n1", None), Some(&owner))), None);
        let session = vec![job_reference("Lease")];
        assert_eq!(kinds(owned(&lease("muster/j/alive/n1", Some(session)), Some(&owner))), Some(vec!["Lease".into()]));
        assert_eq!(kinds(owned(&lease("muster/j/r/0/slot", None), None)), None);
    }
}
