//! The links between gates: the interface that carries the job's address and the InfiniBand ports the job
//! may use, sampled while the workers run and again at each gate. A link that went down, or whose drop
//! counters rose (`carrier_changes`, an IB port's `link_downed`), dropped since the last sample, even if
//! it is back up by now: a flapping link slows every collective it carries.

use std::path::PathBuf;

use super::host::{ib_ports, interface_named, interface_of, read, sysfs_is_ours};

/// The links at one moment, as far as this node can read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    pub iface: Option<Iface>,
    pub ports: Vec<Port>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    /// Up, with a carrier.
    pub running: bool,
    /// sysfs `carrier_changes`, where sysfs shows this namespace.
    pub carrier_changes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub name: String,
    pub state: String,
    pub link_downed: Option<u64>,
}

/// What is sampled: the interface of `local_addr` and the ports `NCCL_IB_HCA` selects, under `sysfs`.
#[derive(Debug, Clone)]
pub struct Links {
    pub local_addr: String,
    pub sysfs: PathBuf,
    pub ib_hca: Option<String>,
}

impl Links {
    /// Reads the links now (blocking, but only sysfs and one getifaddrs: call it off the async threads).
    /// `iface`: the interface found at an earlier look, read by its name (the address, often a host name,
    /// is resolved only while none is known).
    pub fn sample(&self, iface: Option<&str>) -> Sample {
        let found = match iface {
            Some(name) => interface_named(name),
            None => interface_of(&self.local_addr),
        };
        let iface = found.filter(|i| i.name != "lo").map(|i| {
            let changes = sysfs_is_ours(&self.sysfs, &i.name)
                .then(|| read(&self.sysfs.join("class/net").join(&i.name).join("carrier_changes")))
                .flatten()
                .and_then(|c| c.parse().ok());
            Iface { running: i.up && i.running, carrier_changes: changes, name: i.name }
        });
        let ports = ib_ports(&self.sysfs, self.ib_hca.as_deref())
            .into_iter()
            .map(|(name, state, _, downed)| Port { name, state, link_downed: downed.parse().ok() })
            .collect();
        Sample { iface, ports }
    }
}

/// What dropped between two samples (pure): each a phrase such as "vh0 lost its carrier".
pub fn drops(before: &Sample, now: &Sample) -> Vec<String> {
    let mut found = Vec::new();
    if let (Some(b), None) = (&before.iface, &now.iface) {
        found.push(format!("{} is gone (removed or renamed)", b.name));
    }
    if let (Some(b), Some(n)) = (&before.iface, &now.iface) {
        if b.name == n.name {
            match (b.running, n.running) {
                (true, false) => found.push(format!("{} lost its carrier", n.name)),
                (false, true) => {}
                _ => {
                    if let (Some(x), Some(y)) = (b.carrier_changes, n.carrier_changes) {
                        if y > x {
                            found.push(format!("{}'s carrier changed {} time(s) (carrier_changes {x} → {y})", n.name, y - x));
                        }
                    }
                }
            }
        }
    }
    for n in &now.ports {
        let Some(b) = before.ports.iter().find(|p| p.name == n.name) else { continue };
        let active = |p: &Port| p.state.contains("ACTIVE");
        if active(b) && !active(n) {
            found.push(format!("InfiniBand {} went {}", n.name, n.state));
        } else if let (Some(x), Some(y)) = (b.link_downed, n.link_downed) {
            if y > x {
                found.push(format!("InfiniBand {} went down and up {} time(s) (link_downed {x} → {y})", n.name, y - x));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(running: bool, changes: Option<u64>) -> Option<Iface> {
        Some(Iface { name: "eth0".into(), running, carrier_changes: changes })
    }

    fn port(state: &str, downed: Option<u64>) -> Port {
        Port { name: "mlx5_0 port 1".into(), state: state.into(), link_downed: downed }
    }

    #[test]
    fn a_drop_is_a_carrier_lost_or_a_counter_that_rose() {
        let s = |iface: Option<Iface>, ports: Vec<Port>| Sample { iface, ports };
        let up = || s(iface(true, Some(2)), vec![port("4: ACTIVE", Some(0))]);
        // (before, now, what dropped)
        let table: Vec<(Sample, Sample, Vec<&str>)> = vec![
            (up(), up(), vec![]),
            (up(), s(iface(false, Some(3)), vec![port("4: ACTIVE", Some(0))]), vec!["eth0 lost its carrier"]),
            (s(iface(false, Some(3)), vec![]), s(iface(true, Some(4)), vec![]), vec![]),
            (up(), s(iface(true, Some(4)), vec![port("4: ACTIVE", Some(0))]), vec!["eth0's carrier changed 2 time(s) (carrier_changes 2 → 4)"]),
            (up(), s(iface(true, None), vec![port("4: ACTIVE", Some(0))]), vec![]),
            (up(), s(iface(true, Some(2)), vec![port("1: DOWN", Some(1))]), vec!["InfiniBand mlx5_0 port 1 went 1: DOWN"]),
            (
                up(),
                s(iface(true, Some(2)), vec![port("4: ACTIVE", Some(3))]),
                vec!["InfiniBand mlx5_0 port 1 went down and up 3 time(s) (link_downed 0 → 3)"],
            ),
            (s(None, vec![]), up(), vec![]),
            (up(), s(None, vec![port("4: ACTIVE", Some(0))]), vec!["eth0 is gone (removed or renamed)"]),
        ];
        for (before, now, want) in table {
            assert_eq!(drops(&before, &now), want, "{before:?} → {now:?}");
        }
    }
}
