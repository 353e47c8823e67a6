//! Whether the network still leads to a store: a fresh TCP handshake, nothing more. A store process that
//! is stopped (SIGSTOP, a stall on its disk) or overloaded still has a kernel that completes handshakes, and
//! a host that is up but has no store on the port refuses them; a host cut off (power, NIC, switch port,
//! partition) answers nothing. Only the last means this node can be evicted while it cannot tell the others.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::net::TcpStream;

use super::Reach;

/// [`Reach::Path`] when any of `endpoints` (`host:port`) completes a handshake within `timeout`,
/// [`Reach::Refused`] when none does but one refuses it, else [`Reach::NoPath`].
pub async fn reach_any(endpoints: &[String], timeout: Duration) -> Reach {
    let mut attempts = tokio::task::JoinSet::new();
    // Three handshakes to each at once: one lost SYN (a lossy link) must not read as a cut.
    for endpoint in endpoints.iter().flat_map(|e| std::iter::repeat_n(e.clone(), 3)) {
        attempts.spawn(async move {
            match tokio::time::timeout(timeout, TcpStream::connect(endpoint.as_str())).await {
                Ok(Ok(_)) => Reach::Path,
                Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => Reach::Refused,
                Ok(Err(_)) | Err(_) => Reach::NoPath,
            }
        });
    }
    let mut best = Reach::NoPath;
    while let Some(found) = attempts.join_next().await {
        match found {
            Ok(Reach::Path) => return Reach::Path,
            Ok(Reach::Refused) => best = Reach::Refused,
            Ok(Reach::NoPath) | Err(_) => {}
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listener_or_a_refusal_is_a_path() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let open = listener.local_addr().expect("addr").to_string();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").to_string()
        };
        let t = Duration::from_secs(2);
        assert_eq!(reach_any(std::slice::from_ref(&open), t).await, Reach::Path);
        assert_eq!(reach_any(std::slice::from_ref(&closed), t).await, Reach::Refused, "a refusal comes from a host that is there");
        assert_eq!(reach_any(&[closed, open.clone()], t).await, Reach::Path, "one store that answers is enough");
        assert_eq!(reach_any(&[], t).await, Reach::NoPath);
        // A host that answers nothing at all is the netns tests' (tests/it/partition.rs): traffic here stays on
        // loopback, where every host answers.
    }
}
