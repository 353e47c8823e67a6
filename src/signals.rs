//! Signal intake: the signals of `--signals-to-handle`, installed before any worker starts, delivered to the
//! agent loop as values. Sending signals to workers is the supervisor's job, not this module's.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Installs a handler for each signal now; each delivery is sent on the returned channel.
pub fn install(signals: &[Signal]) -> std::io::Result<mpsc::UnboundedReceiver<Signal>> {
    let (tx, rx) = mpsc::unbounded_channel();
    for &sig in signals {
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }
    Ok(rx)
}
