//! Who may touch which keys: muster's own rendezvous keys (under the protected prefix) belong to the
//! agents of the job, the connections that said `HELLO` (with the job's token, where the server has
//! one). Everyone else, torch's workers included, has the rest of the key space as in torch.

use super::super::frame::Request;

/// muster's rendezvous keys in wire form (torch's client prefixes every key with `/`).
pub(super) const PROTECTED_PREFIX: &[u8] = b"/muster/";

/// Whether `key` is one of muster's own.
pub(super) fn protected(key: &[u8]) -> bool {
    key.starts_with(PROTECTED_PREFIX)
}

/// Whether a request from a connection that is not an agent's must be refused: it names a protected
/// key, or watches anything. (LIST_KEYS and GET_NUM_KEYS are served with muster's keys
/// left out instead, so torch's `num_keys()` and listing still work.)
pub(super) fn forbidden(request: &Request<'_>) -> bool {
    match request {
        Request::Set { key, .. }
        | Request::CompareSet { key, .. }
        | Request::Get { key }
        | Request::Add { key, .. }
        | Request::DeleteKey { key }
        | Request::Append { key, .. }
        | Request::QueuePush { key, .. }
        | Request::QueuePop { key }
        | Request::QueueLen { key }
        | Request::Barrier { key, .. }
        | Request::SetSession { key, .. } => protected(key),
        Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
            keys.iter().any(|k| protected(k))
        }
        Request::MultiSet { pairs } => pairs.iter().any(|(k, _)| protected(k)),
        // Events share a connection with replies only once it is tagged (an agent's).
        Request::Watch { .. } | Request::Unwatch { .. } => true,
        Request::Validate { .. }
        | Request::Hello { .. }
        | Request::GetNumKeys
        | Request::CancelWait
        | Request::Ping { .. }
        | Request::ListKeys => false,
    }
}

/// Compares a presented token with the job's in time independent of where they differ.
pub(super) fn token_matches(expected: &[u8], presented: &[u8]) -> bool {
    let mut diff = expected.len() ^ presented.len();
    for (i, e) in expected.iter().enumerate() {
        diff |= usize::from(e ^ presented.get(i).copied().unwrap_or(!e));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tcp::frame::WatchMode;

    #[test]
    fn requests_naming_muster_keys_are_forbidden_to_others() {
        let cases: &[(Request<'_>, bool)] = &[
            (Request::Set { key: b"/muster/run/closed", value: b"1" }, true),
            (Request::Set { key: b"/MASTER_ADDR", value: b"x" }, false),
            (Request::Add { key: b"/muster/run/round", delta: 1 }, true),
            (Request::DeleteKey { key: b"/muster/run/alive/n1" }, true),
            (Request::Get { key: b"/muster" }, false),
            (Request::Check { keys: vec![b"/a", b"/muster/x"] }, true),
            (Request::MultiSet { pairs: vec![(b"/a", b"1"), (b"/muster/b", b"2")] }, true),
            (Request::Watch { mode: WatchMode::Prefix, pattern: b"/" }, true),
            (Request::Watch { mode: WatchMode::Prefix, pattern: b"/work/" }, true),
            (Request::Watch { mode: WatchMode::Key, pattern: b"/muster/run/seal" }, true),
            (Request::ListKeys, false),
            (Request::GetNumKeys, false),
            (Request::Ping { nonce: 1 }, false),
        ];
        for (request, want) in cases {
            assert_eq!(forbidden(request), *want, "{request:?}");
        }
    }

    #[test]
    fn the_protected_prefix_is_the_rendezvous_prefix() {
        let wire = format!("/{}", crate::rendezvous::KEY_PREFIX);
        assert_eq!(PROTECTED_PREFIX, wire.as_bytes());
    }

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches(b"secret", b"secret"));
        assert!(!token_matches(b"secret", b"secreT"));
        assert!(!token_matches(b"secret", b"secret2"));
        assert!(!token_matches(b"secret", b""));
        assert!(!token_matches(b"", b"x"));
        assert!(token_matches(b"", b""));
    }
}
