//! Signal intake: the signals of `--signals-to-handle`, installed before any worker starts, delivered to the
//! agent loop as values. Sending signals to workers is the supervisor's job, not this module's.
//!
//! Two kinds (docs/exit-codes.md, "Preemption"): a *stop* signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) is
//! forwarded and ends the job; a *notice* (SIGUSR1, SIGUSR2: Slurm's `--signal=USR1@T` warning of a coming
//! stop) is forwarded when listed and never stops anything. Notices are always caught, listed or not: their
//! default action would kill the agent, and a warning must not end the job it warns. SIGCONT (which `scancel`
//! sends before SIGTERM) is left at its default, which never ends a process.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Signals that warn of a stop to come; the workers keep running.
pub const NOTICE_SIGNALS: [Signal; 2] = [Signal::SIGUSR1, Signal::SIGUSR2];

/// What a delivered signal asks of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Forward it to the workers, stop them, exit 128+N.
    Stop(Signal),
    /// Forward it to the workers, who keep running.
    Notice(Signal),
}

/// What `sig` means given `--signals-to-handle` (`handled`); None: it is caught only so that it cannot kill
/// the agent, and dropped (a scheduler that signals the whole job step has reached the workers already).
pub fn classify(sig: Signal, handled: &[Signal]) -> Option<Delivery> {
    match (NOTICE_SIGNALS.contains(&sig), handled.contains(&sig)) {
        (true, true) => Some(Delivery::Notice(sig)),
        (true, false) => None,
        (false, true) => Some(Delivery::Stop(sig)),
        (false, false) => None,
    }
}

/// Installs a handler for each handled signal and each notice signal now; each delivery that means
/// something (see [`classify`]) is sent on the returned channel.
pub fn install(handled: &[Signal]) -> std::io::Result<mpsc::UnboundedReceiver<Delivery>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut caught: Vec<Signal> = handled.to_vec();
    caught.extend(NOTICE_SIGNALS.iter().filter(|s| !handled.contains(s)));
    for sig in caught {
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let delivery = classify(sig, handled);
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                let Some(delivery) = delivery else {
                    tracing::info!(
                        "received {}; it is not in --signals-to-handle, so it is not forwarded and the job goes on",
                        sig.as_str()
                    );
                    continue;
                };
                if tx.send(delivery).is_err() {
                    break;
                }
            }
        });
    }
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_and_notice_signals_as_listed() {
        let default = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT];
        let with_usr1 = [Signal::SIGTERM, Signal::SIGUSR1];
        let table: &[(Signal, &[Signal], Option<Delivery>)] = &[
            (Signal::SIGTERM, &default, Some(Delivery::Stop(Signal::SIGTERM))),
            (Signal::SIGQUIT, &default, Some(Delivery::Stop(Signal::SIGQUIT))),
            (Signal::SIGUSR1, &default, None),
            (Signal::SIGUSR2, &default, None),
            (Signal::SIGUSR1, &with_usr1, Some(Delivery::Notice(Signal::SIGUSR1))),
            (Signal::SIGUSR2, &with_usr1, None),
            (Signal::SIGINT, &with_usr1, None),
            (Signal::SIGTERM, &with_usr1, Some(Delivery::Stop(Signal::SIGTERM))),
        ];
        for (sig, handled, want) in table {
            assert_eq!(classify(*sig, handled), *want, "{sig} with {handled:?}");
        }
    }
}
