//! What every networked store must do alike, checked by each store's own tests against a real server:
//! counters and compare-and-set, where the stores' implementations differ most.

use super::Store;

/// Counters count from absent, refuse text, start again from a value set over them; compare-and-set takes
/// absent (and empty) as empty and answers with the value held. Uses the keys `n`, `text`, `c`, `missing`
/// and `empty`.
pub(crate) async fn counters_and_compare_set(s: &impl Store) {
    assert_eq!(s.add("n", 2).await.unwrap(), 2);
    assert_eq!(s.add("n", -5).await.unwrap(), -3);
    assert_eq!(s.add("n", 0).await.unwrap(), -3);
    s.set("n", b"10").await.unwrap();
    assert_eq!(s.add("n", 1).await.unwrap(), 11, "a value set replaces the count");
    assert_eq!(s.compare_set("n", b"11", b"20").await.unwrap(), b"20");
    assert_eq!(s.add("n", 1).await.unwrap(), 21);
    assert_eq!(s.get("n").await.unwrap().as_deref(), Some(&b"21"[..]));
    s.set("text", b"x").await.unwrap();
    assert!(s.add("text", 1).await.is_err(), "a text value does not add");
    assert_eq!(s.get("text").await.unwrap().as_deref(), Some(&b"x"[..]), "nor changes");
    assert_eq!(s.compare_set("c", b"", b"v1").await.unwrap(), b"v1");
    assert_eq!(s.compare_set("c", b"", b"v2").await.unwrap(), b"v1", "the value held, when it differs");
    assert_eq!(s.compare_set("c", b"v1", b"v3").await.unwrap(), b"v3");
    assert_eq!(s.compare_set("missing", b"x", b"y").await.unwrap(), b"", "absent is empty");
    s.set("empty", b"").await.unwrap();
    assert_eq!(s.compare_set("empty", b"", b"z").await.unwrap(), b"z", "empty matches an empty value");
}
