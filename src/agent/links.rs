//! What happens when a link drops between gates (`crate::gate::link`): the interface that carries the job's
//! address, or an InfiniBand port the job may use, went down or flapped while the workers ran (or since the
//! last look, at the next gate). `--on-link-drop report` says so once per drop and training goes on;
//! `drain` drains the node as a failed health check does (`agent/gate.rs`): it leaves the rendezvous at
//! once, the hook runs with `network`, the workers are stopped, exit 75.

use std::time::Duration;

use crate::config::OnLinkDrop;
use crate::gate::link::{drops, Links, Sample};
use crate::gate::{Check, Finding};

/// How often the links are read while the workers run: a few sysfs files and one getifaddrs.
const LINK_EVERY: Duration = Duration::from_secs(1);

/// The links and what they were at the last look.
pub(super) struct LinkWatch {
    links: Links,
    last: Option<Sample>,
    on_drop: OnLinkDrop,
}

impl LinkWatch {
    /// Waits for a link drop that drains the node (never, without a link watch).
    pub(super) async fn drained(watch: Option<&mut LinkWatch>) -> String {
        match watch {
            Some(watch) => watch.next_drain().await,
            None => std::future::pending().await,
        }
    }

    pub(super) fn new(links: Links, on_drop: OnLinkDrop) -> LinkWatch {
        LinkWatch { links, last: None, on_drop }
    }

    /// What dropped since the last look (nothing at the first, which only takes the counters).
    pub(super) async fn look(&mut self) -> Vec<String> {
        let links = self.links.clone();
        let known = self.last.as_ref().and_then(|s| s.iface.as_ref()).map(|i| i.name.clone());
        let Ok(now) = tokio::task::spawn_blocking(move || links.sample(known.as_deref())).await else { return Vec::new() };
        let found = self.last.as_ref().map(|before| drops(before, &now)).unwrap_or_default();
        self.last = Some(now);
        found
    }

    /// Reads the links every [`LINK_EVERY`] while the workers run; each drop is said (`when`: while the
    /// workers ran, since the last look). Returns the failed check's line once a drop is to drain the node.
    /// Cancel-safe: a look cut short is taken again.
    async fn next_drain(&mut self) -> String {
        loop {
            tokio::time::sleep(LINK_EVERY).await;
            let found = self.look().await;
            if let Some(line) = self.judge(found, "while the workers ran") {
                return line;
            }
        }
    }

    /// Says each drop; the line to drain with, when the policy drains.
    pub(super) fn judge(&self, found: Vec<String>, when: &str) -> Option<String> {
        if found.is_empty() {
            return None;
        }
        let what = format!("{} {when}", found.join("; "));
        match self.on_drop {
            OnLinkDrop::Report => {
                tracing::warn!("network: {what}; training goes on (--on-link-drop report)");
                None
            }
            OnLinkDrop::Drain => {
                let finding = Finding::failed(Check::Network, what, "links that stay up (--on-link-drop drain)");
                Some(finding.line())
            }
        }
    }
}
