//! Where a key lives on the API server, pure: each key is one Lease, named from the key's hash (a key
//! holds `/`, `_` and capitals, which object names refuse), labelled so that the reads the rendezvous makes
//! are each one selector: the job (`muster.dev/job`, for the clean-up), the key itself (`muster.dev/k`, so
//! one watch follows several keys: `muster.dev/k in (...)`) and each prefix the key is under
//! (`muster.dev/d<N>`: the key's first N segments), so a prefix's listing or watch is exact at any depth.

use std::collections::BTreeMap;

/// The label of the job's objects: one selector deletes them all.
pub const JOB: &str = "muster.dev/job";
/// The label naming the key (its hash): a watch of several keys selects them by it.
pub const KEY: &str = "muster.dev/k";
/// The label naming the session object a session key goes with.
pub const SESSION: &str = "muster.dev/session";
/// The label marking a session object (what a sweep lists), and its value.
pub const ROLE: &str = "muster.dev/role";
pub const ROLE_SESSION: &str = "session";
/// The annotation holding the key as written, for people (`kubectl get leases -o yaml`).
pub const KEY_TEXT: &str = "muster.dev/key";
/// The annotation holding the value, base64 (annotations are strings; values are bytes).
pub const VALUE: &str = "muster.dev/v";
/// Prefixes deeper than this are listed by the deepest label and filtered by key: labels stay few.
pub const MAX_DEPTH: usize = 8;

/// Hex characters of SHA-256 kept in names and label values: 80 bits, no collision among a job's keys.
const HASH_CHARS: usize = 20;

fn hash(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>()[..HASH_CHARS].to_string()
}

/// The object holding `key` of job `job` (two jobs may use the same keys: tests, a store's own names).
pub fn object_name(job: &str, key: &str) -> String {
    format!("muster-{}", key_label(job, key))
}

/// The label value naming `key` of job `job` (under [`KEY`]).
pub fn key_label(job: &str, key: &str) -> String {
    hash(&format!("{job}\n{key}"))
}

/// A prefix as the labels see it: the segments it covers (a prefix ends with `/`, or covers the segments
/// before its last `/`, the rest matched by key).
fn prefix_depth(prefix: &str) -> (usize, &str) {
    let covered = match prefix.rfind('/') {
        Some(i) => &prefix[..=i],
        None => "",
    };
    (covered.matches('/').count().min(MAX_DEPTH), covered)
}

/// The labels of `key`'s object in job `job` (the run's own prefix, hashed).
pub fn labels(job: &str, key: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(JOB.to_string(), hash(job)), (KEY.to_string(), key_label(job, key))]);
    for (depth, (i, _)) in key.match_indices('/').take(MAX_DEPTH).enumerate() {
        labels.insert(format!("muster.dev/d{}", depth + 1), hash(&key[..=i]));
    }
    labels
}

/// The label selector of every key under `prefix` (some perhaps not: filter by [`under`]).
pub fn prefix_selector(job: &str, prefix: &str) -> String {
    let (depth, covered) = prefix_depth(prefix);
    let mut cut = covered;
    if depth == MAX_DEPTH {
        // The label of the deepest level kept: the prefix's first MAX_DEPTH segments.
        let end = covered.match_indices('/').nth(MAX_DEPTH - 1).map_or(covered.len(), |(i, _)| i + 1);
        cut = &covered[..end];
    }
    match depth {
        0 => format!("{JOB}={}", hash(job)),
        d => format!("{JOB}={},muster.dev/d{d}={}", hash(job), hash(cut)),
    }
}

/// The label selector of every object of job `job` but those under `keep` (a prefix of whole segments,
/// ending with `/`): `!=` also selects the objects without that depth's label.
pub fn job_selector_except(job: &str, keep: &str) -> String {
    let (depth, covered) = prefix_depth(keep);
    format!("{JOB}={},muster.dev/d{depth}!={}", hash(job), hash(covered))
}

/// Whether `key` is under `prefix` (what a selector cannot tell alone: a partial last segment, or a
/// prefix deeper than the labels).
pub fn under(key: &str, prefix: &str) -> bool {
    key.starts_with(prefix)
}

/// The label selector of exactly these keys (one watch for all of them).
pub fn keys_selector(job: &str, keys: &[String]) -> String {
    let hashes: Vec<String> = keys.iter().map(|k| key_label(job, k)).collect();
    format!("{JOB}={},{KEY} in ({})", hash(job), hashes.join(","))
}

/// The selector of the session keys that go with session object `session`.
pub fn session_selector(job: &str, session: &str) -> String {
    format!("{JOB}={},{SESSION}={session}", hash(job))
}

/// The selector of the job's session objects.
pub fn sessions_selector(job: &str) -> String {
    format!("{JOB}={},{ROLE}={ROLE_SESSION}", hash(job))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_selected_but_what_it_keeps() {
        let keep = "muster/j/culprits/";
        let selector = job_selector_except("muster/j/", keep);
        assert_eq!(selector, format!("{JOB}={},muster.dev/d3!={}", hash("muster/j/"), hash(keep)));
        let kept = labels("muster/j/", "muster/j/culprits/h/1");
        assert_eq!(kept.get("muster.dev/d3"), Some(&hash(keep)), "a kept key has the label the selector excludes");
        let gone = labels("muster/j/", "muster/j/round");
        assert_eq!(gone.get("muster.dev/d3"), None, "a shallower key lacks it: `!=` selects it");
    }

    #[test]
    fn names_and_labels_are_valid_kubernetes_names_whatever_the_key() {
        for key in ["muster/run-1/alive/Host_A:1234_0", "muster/r/hb/10.0.0.1_77_0", "x", "a//b/", "ÜTF/ß"] {
            let name = object_name("muster/run-1/", key);
            assert!(name.len() <= 63 && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
            for (k, v) in labels("muster/run-1/", key) {
                assert!(k.starts_with("muster.dev/") && k.len() <= 63 + "muster.dev/".len(), "{k}");
                assert!(v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric()), "{v}");
            }
        }
        assert_ne!(object_name("j/", "muster/r/a"), object_name("j/", "muster/r/b"));
        assert_ne!(object_name("j/", "a"), object_name("k/", "a"), "two jobs, one key");
    }

    #[test]
    fn a_prefix_selects_by_the_label_of_its_depth() {
        let job = "muster/r/";
        let key = "muster/r/alive/n1";
        let labels = labels(job, key);
        // muster/, muster/r/, muster/r/alive/: three levels.
        assert_eq!(labels.len(), 2 + 3, "{labels:?}");
        let selector = prefix_selector(job, "muster/r/alive/");
        let d3 = format!("muster.dev/d3={}", labels["muster.dev/d3"]);
        assert!(selector.ends_with(&d3), "{selector} vs {d3}");
        // A partial last segment selects its parent's level; the key filter does the rest.
        assert_eq!(prefix_selector(job, "muster/r/al"), prefix_selector(job, "muster/r/"));
        assert!(under(key, "muster/r/al") && !under("muster/r/hb/n1", "muster/r/al"));
        // No segment at all: the whole job.
        assert_eq!(prefix_selector(job, ""), format!("{JOB}={}", hash(job)));
    }

    #[test]
    fn deep_prefixes_use_the_deepest_label() {
        let deep = "a/b/c/d/e/f/g/h/i/j/k";
        let labels = labels("a/", deep);
        assert_eq!(labels.len(), 2 + MAX_DEPTH);
        let selector = prefix_selector("a/", "a/b/c/d/e/f/g/h/i/j/");
        assert!(selector.ends_with(&format!("muster.dev/d{MAX_DEPTH}={}", labels[&format!("muster.dev/d{MAX_DEPTH}")])), "{selector}");
    }

    #[test]
    fn a_watch_of_keys_selects_each_by_its_hash() {
        let s = keys_selector("j/", &["j/round".into(), "j/closed".into()]);
        assert_eq!(s, format!("{JOB}={},{KEY} in ({},{})", hash("j/"), key_label("j/", "j/round"), key_label("j/", "j/closed")));
    }
}
