//! The host's own checks: shared memory and free space (`shm`), and the links the job's traffic takes
//! (`network`): the interface that carries this node's address, and the InfiniBand ports, both read from
//! sysfs (`$MUSTER_SYSFS_ROOT`, so a fixture tree stands in for hardware this machine lacks).

use std::net::{IpAddr, ToSocketAddrs};
use std::path::Path;

use super::{Check, Finding, GateConfig};

const MIB: u64 = 1 << 20;

/// Bytes free for an unprivileged writer on the file system holding `path`.
#[allow(clippy::useless_conversion)] // fsblkcnt_t and c_ulong are narrower than u64 on 32-bit targets
fn free_bytes(path: &Path) -> Result<u64, String> {
    let s = nix::sys::statvfs::statvfs(path).map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    Ok(u64::from(s.blocks_available()).saturating_mul(u64::from(s.fragment_size())))
}

pub(super) fn shm(config: &GateConfig) -> Finding {
    let want = config.shm_per_worker.saturating_mul(u64::from(config.workers.max(1)));
    let shm = match free_bytes(Path::new("/dev/shm")) {
        Ok(n) => n,
        Err(e) => return Finding::failed(Check::Shm, e, "a /dev/shm (tmpfs) mounted in the node's container"),
    };
    if shm < want {
        return Finding::failed(
            Check::Shm,
            format!("/dev/shm has {} MiB free, {} worker(s) want {} MiB", shm / MIB, config.workers, want / MIB),
            "a larger /dev/shm (docker --shm-size, a Kubernetes emptyDir with medium: Memory) or a lower --gate-shm-min",
        );
    }
    let Some(logs) = config.paths.first() else { return Finding::ok(Check::Shm, format!("/dev/shm {} MiB free", shm / MIB)) };
    match free_bytes(logs) {
        Ok(free) if free >= config.min_free => {
            Finding::ok(Check::Shm, format!("/dev/shm {} MiB free; {} {} MiB free", shm / MIB, logs.display(), free / MIB))
        }
        Ok(free) => Finding::failed(
            Check::Shm,
            format!("{} has {} MiB free", logs.display(), free / MIB),
            format!("at least {} MiB free for the logs", config.min_free / MIB),
        ),
        Err(e) => Finding::failed(Check::Shm, e, "a log directory on a file system that answers"),
    }
}

/// An interface as this node's network namespace sees it (getifaddrs, not sysfs: a /sys mounted in another
/// namespace shows that one's interfaces).
pub(super) struct Iface {
    pub(super) name: String,
    /// IFF_UP: administratively up.
    pub(super) up: bool,
    /// IFF_RUNNING: operational, with a carrier.
    pub(super) running: bool,
}

/// The interface whose addresses include one `addr` resolves to (None: none here, say a name that
/// resolves elsewhere: nothing to judge).
pub(super) fn interface_of(addr: &str) -> Option<Iface> {
    let ips: Vec<IpAddr> = match addr.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => (addr, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect(),
    };
    find_interface(|_, ip| ip.is_some_and(|ip| ips.contains(&ip)))
}

/// The interface called `name`, as this namespace sees it now.
pub(super) fn interface_named(name: &str) -> Option<Iface> {
    find_interface(|n, _| n == name)
}

/// The first interface address (its interface's name and IP, if it has one) that `hit` picks.
fn find_interface(hit: impl Fn(&str, Option<IpAddr>) -> bool) -> Option<Iface> {
    use nix::net::if_::InterfaceFlags;
    let ifaces = nix::ifaddrs::getifaddrs().ok()?;
    for iface in ifaces {
        let ip = iface.address.and_then(|a| match (a.as_sockaddr_in(), a.as_sockaddr_in6()) {
            (Some(v4), _) => Some(IpAddr::V4(v4.ip())),
            (_, Some(v6)) => Some(IpAddr::V6(v6.ip())),
            _ => None,
        });
        if hit(&iface.interface_name, ip) {
            let flags = iface.flags;
            return Some(Iface {
                name: iface.interface_name,
                up: flags.contains(InterfaceFlags::IFF_UP),
                running: flags.contains(InterfaceFlags::IFF_RUNNING),
            });
        }
    }
    None
}

/// Whether `sysfs` describes this namespace's `iface` (its `ifindex` is the one the kernel gives this
/// namespace's interface of that name), or is a fixture tree given in `$MUSTER_SYSFS_ROOT`.
pub(super) fn sysfs_is_ours(sysfs: &Path, iface: &str) -> bool {
    if sysfs != Path::new("/sys") {
        return true;
    }
    let index = read(&sysfs.join("class/net").join(iface).join("ifindex")).and_then(|i| i.parse::<u32>().ok());
    index.is_some() && index == nix::net::if_::if_nametoindex(iface).ok()
}

/// The link of the interface that carries the job's address: up with a carrier by its flags, then by sysfs
/// (its state and carrier changes) where sysfs shows this namespace.
fn judge_link(sysfs: &Path, iface: &Iface) -> Result<String, String> {
    let name = &iface.name;
    if !iface.up {
        return Err(format!("{name} is down (administratively)"));
    }
    if !iface.running {
        return Err(format!("{name} has no carrier (its cable, switch port or peer is down)"));
    }
    if sysfs_is_ours(sysfs, name) {
        return link(sysfs, name);
    }
    Ok(format!("{name} up, running"))
}

pub(super) fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Whether an interface's sysfs entry says its link is up: `operstate` up (or unknown, as for virtual
/// interfaces without link detection) and `carrier` 1 where it is readable.
pub(super) fn link(sysfs: &Path, iface: &str) -> Result<String, String> {
    let dir = sysfs.join("class/net").join(iface);
    let state = read(&dir.join("operstate")).unwrap_or_else(|| "unknown".into());
    let carrier = read(&dir.join("carrier"));
    let changes = read(&dir.join("carrier_changes")).unwrap_or_else(|| "?".into());
    match (state.as_str(), carrier.as_deref()) {
        ("down" | "lowerlayerdown" | "notpresent" | "dormant", _) | (_, Some("0")) => {
            Err(format!("{iface} is {state} (carrier {}, {changes} carrier change(s))", carrier.as_deref().unwrap_or("?")))
        }
        _ => Ok(format!("{iface} {state}, {changes} carrier change(s)")),
    }
}

/// `NCCL_IB_HCA`'s selection: `mlx5_0,mlx5_1:1`, `^mlx5_2` (all but), `=mlx5_0` (exact names): whether `hca`
/// port `port` is one the job may use.
fn selected(filter: Option<&str>, hca: &str, port: &str) -> bool {
    let Some(filter) = filter.map(str::trim).filter(|f| !f.is_empty()) else { return true };
    let (exclude, list) = match filter.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, filter),
    };
    let (exact, list) = match list.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let hit = list.split(',').map(str::trim).any(|item| {
        let (name, p) = item.split_once(':').map_or((item, None), |(n, p)| (n, Some(p)));
        let name_ok = if exact { name == hca } else { hca.starts_with(name) };
        name_ok && p.is_none_or(|p| p == port)
    });
    hit != exclude
}

/// Every InfiniBand port the job may use: (name, state, rate, link_downed).
pub(super) fn ib_ports(sysfs: &Path, filter: Option<&str>) -> Vec<(String, String, String, String)> {
    let mut found = Vec::new();
    let Ok(hcas) = std::fs::read_dir(sysfs.join("class/infiniband")) else { return found };
    for hca in hcas.flatten() {
        let name = hca.file_name().to_string_lossy().into_owned();
        let Ok(ports) = std::fs::read_dir(hca.path().join("ports")) else { continue };
        for port in ports.flatten() {
            let p = port.file_name().to_string_lossy().into_owned();
            if !selected(filter, &name, &p) {
                continue;
            }
            let dir = port.path();
            let state = read(&dir.join("state")).unwrap_or_else(|| "?".into());
            let rate = read(&dir.join("rate")).unwrap_or_else(|| "?".into());
            let downed = read(&dir.join("counters/link_downed")).unwrap_or_else(|| "?".into());
            found.push((format!("{name} port {p}"), state, rate, downed));
        }
    }
    found.sort();
    found
}

pub(super) fn network(config: &GateConfig) -> Finding {
    let mut saw = Vec::new();
    match interface_of(&config.local_addr) {
        Some(iface) if iface.name == "lo" => saw.push(format!("{} is on lo", config.local_addr)),
        Some(iface) => match judge_link(&config.sysfs, &iface) {
            Ok(s) => saw.push(s),
            Err(e) => {
                return Finding::failed(Check::Network, format!("{e}: it carries {}", config.local_addr), "its link up with a carrier")
            }
        },
        None => saw.push(format!("no interface here has {}'s address", config.local_addr)),
    }
    let ports = ib_ports(&config.sysfs, config.ib_hca.as_deref());
    let rate = |r: &str| r.split_whitespace().next().and_then(|n| n.parse::<f64>().ok()).unwrap_or(0.0);
    let best = ports.iter().map(|(_, _, r, _)| rate(r)).fold(0.0, f64::max);
    for (name, state, r, downed) in &ports {
        if !state.contains("ACTIVE") {
            return Finding::failed(Check::Network, format!("InfiniBand {name} is {state} (link_downed {downed})"), "every port the job may use ACTIVE (NCCL_IB_HCA selects them)");
        }
        if rate(r) < best {
            return Finding::failed(Check::Network, format!("InfiniBand {name} runs at {r}, its peers at {best} Gb/sec"), "every port at the rate of the others (a degraded link)");
        }
    }
    if !ports.is_empty() {
        saw.push(format!("{} InfiniBand port(s) ACTIVE at {best} Gb/sec", ports.len()));
    }
    Finding::ok(Check::Network, saw.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_ib_hca_selects_ports_as_nccl_does() {
        // (NCCL_IB_HCA, hca, port) -> used
        let table = [
            (None, "mlx5_0", "1", true),
            (Some("mlx5_0"), "mlx5_0", "1", true),
            (Some("mlx5"), "mlx5_3", "1", true),
            (Some("mlx5_0:2"), "mlx5_0", "1", false),
            (Some("^mlx5_1"), "mlx5_1", "1", false),
            (Some("^mlx5_1"), "mlx5_0", "1", true),
            (Some("=mlx5_1"), "mlx5_10", "1", false),
        ];
        for (filter, hca, port, want) in table {
            assert_eq!(selected(filter, hca, port), want, "{filter:?} {hca}:{port}");
        }
    }

    fn fixture(ports: &[(&str, &str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        for (name, state, rate) in ports {
            let (hca, port) = name.split_once(':').expect("hca:port");
            let dir = root.path().join("class/infiniband").join(hca).join("ports").join(port);
            std::fs::create_dir_all(dir.join("counters")).expect("mkdir");
            std::fs::write(dir.join("state"), format!("{state}\n")).expect("state");
            std::fs::write(dir.join("rate"), format!("{rate}\n")).expect("rate");
            std::fs::write(dir.join("counters/link_downed"), "0\n").expect("counter");
        }
        root
    }

    fn config(sysfs: &Path, hca: Option<&str>) -> GateConfig {
        GateConfig {
            sysfs: sysfs.to_path_buf(),
            ib_hca: hca.map(str::to_string),
            ..GateConfig::new(vec![Check::Network], Vec::new(), 1, "127.0.0.1")
        }
    }

    #[test]
    fn infiniband_ports_from_a_sysfs_tree() {
        let up = ("mlx5_0:1", "4: ACTIVE", "200 Gb/sec (4X HDR)");
        let healthy = fixture(&[up, ("mlx5_1:1", "4: ACTIVE", "200 Gb/sec (4X HDR)")]);
        assert!(network(&config(healthy.path(), None)).ok);
        let down = fixture(&[up, ("mlx5_1:1", "1: DOWN", "200 Gb/sec (4X HDR)")]);
        let f = network(&config(down.path(), None));
        assert!(!f.ok && f.saw.contains("mlx5_1 port 1 is 1: DOWN"), "{f:?}");
        assert!(network(&config(down.path(), Some("mlx5_0"))).ok, "NCCL_IB_HCA leaves the down port out");
        let slow = fixture(&[up, ("mlx5_1:1", "4: ACTIVE", "100 Gb/sec (4X EDR)")]);
        let f = network(&config(slow.path(), None));
        assert!(!f.ok && f.saw.contains("runs at 100 Gb/sec"), "{f:?}");
    }

    #[test]
    fn an_interface_down_or_without_carrier_fails() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("class/net/eth9");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("operstate"), "up\n").expect("write");
        std::fs::write(dir.join("carrier"), "1\n").expect("write");
        assert!(link(root.path(), "eth9").is_ok());
        std::fs::write(dir.join("carrier"), "0\n").expect("write");
        assert!(link(root.path(), "eth9").is_err());
        std::fs::write(dir.join("operstate"), "down\n").expect("write");
        assert!(link(root.path(), "eth9").unwrap_err().contains("eth9 is down"));
    }
}
