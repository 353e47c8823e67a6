//! The JSON configuration (see README.md) and its validation into a ready-to-serve model.

use serde::Deserialize;
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// NVML_NVLINK_MAX_LINKS in the 0.10 bindings (18 on H100 SXM).
pub const MAX_LINKS: u32 = 18;
/// Upper bound on GPUs (device handles are addresses in a static table of this size).
pub const MAX_GPUS: usize = 64;

pub const EV_SBE: u64 = 0x1;
pub const EV_DBE: u64 = 0x2;
pub const EV_PSTATE: u64 = 0x4;
pub const EV_XID: u64 = 0x8;
pub const EV_CLOCK: u64 = 0x10;
pub const EV_POWER_SOURCE: u64 = 0x80;
pub const EV_MIG: u64 = 0x100;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default, rename = "comment")]
    pub _comment: Option<Value>,
    #[serde(default = "default_driver")]
    pub driver_version: String,
    #[serde(default)]
    pub nvml_version: Option<String>,
    #[serde(default = "default_cuda")]
    pub cuda_driver_version: i32,
    #[serde(default)]
    pub gpus: Vec<RawGpu>,
    #[serde(default)]
    pub topology: Option<Vec<Vec<String>>>,
    #[serde(default)]
    pub pci_topology: Option<Vec<Vec<String>>>,
    #[serde(default)]
    pub nvswitch: Option<bool>,
    #[serde(default)]
    pub events_file: Option<String>,
    #[serde(default)]
    pub status_file: Option<String>,
    #[serde(default)]
    pub init_error: Option<Value>,
    #[serde(default)]
    pub attach_processes: bool,
}

fn default_driver() -> String {
    "570.86.15".to_string()
}
fn default_cuda() -> i32 {
    12080
}
fn default_name() -> String {
    "NVIDIA H100 80GB HBM3".to_string()
}
fn default_pci_device_id() -> u32 {
    0x2330_10DE
}
fn default_pci_subsys() -> u32 {
    0x16C1_10DE
}
fn default_mem() -> u64 {
    80 * 1024 * 1024 * 1024
}
fn default_temp() -> u32 {
    35
}
fn default_arch() -> String {
    "hopper".to_string()
}
fn default_cc() -> [i32; 2] {
    [9, 0]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGpu {
    #[serde(default, rename = "comment")]
    pub _comment: Option<Value>,
    pub uuid: String,
    #[serde(default = "default_name")]
    pub name: String,
    pub pci_bus_id: String,
    #[serde(default = "default_pci_device_id", deserialize_with = "u32_or_hex")]
    pub pci_device_id: u32,
    #[serde(default = "default_pci_subsys", deserialize_with = "u32_or_hex")]
    pub pci_sub_system_id: u32,
    #[serde(default = "default_mem")]
    pub memory_total: u64,
    #[serde(default)]
    pub memory_used: u64,
    #[serde(default)]
    pub memory_reserved: u64,
    #[serde(default)]
    pub minor_number: Option<u32>,
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default)]
    pub gpu_numa_id: Option<u32>,
    #[serde(default)]
    pub cpu_affinity: Vec<u32>,
    #[serde(default)]
    pub ecc: RawEcc,
    #[serde(default)]
    pub processes: Vec<RawProcess>,
    #[serde(default)]
    pub supported_events: Option<Vec<Value>>,
    #[serde(default = "default_temp")]
    pub temperature: u32,
    #[serde(default = "default_arch")]
    pub architecture: String,
    #[serde(default = "default_cc")]
    pub cuda_compute_capability: [i32; 2],
    #[serde(default)]
    pub recovery_action: u32,
    #[serde(default)]
    pub lost: bool,
}

/// A u32 given as a JSON number or as a "0x..." hex string (PCI ids read better in hex).
fn u32_or_hex<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    use serde::de::Error;
    match Value::deserialize(d)? {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| D::Error::custom("not a u32")),
        Value::String(s) => s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| D::Error::custom(format!("bad hex u32 {s:?}"))),
        other => Err(D::Error::custom(format!(
            "expected a number or a hex string, got {other}"
        ))),
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEcc {
    #[serde(default)]
    pub volatile_sbe: u64,
    #[serde(default)]
    pub volatile_dbe: u64,
    #[serde(default)]
    pub aggregate_sbe: u64,
    #[serde(default)]
    pub aggregate_dbe: u64,
    #[serde(default)]
    pub retired_sbe: Vec<u64>,
    #[serde(default)]
    pub retired_dbe: Vec<u64>,
    #[serde(default)]
    pub retired_pending: bool,
    #[serde(default)]
    pub remapped_cor: u32,
    #[serde(default)]
    pub remapped_unc: u32,
    #[serde(default)]
    pub remap_pending: bool,
    #[serde(default)]
    pub remap_failure: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProcess {
    pub pid: u32,
    #[serde(default)]
    pub used_gpu_memory: u64,
}

/// A PCI address, parsed from either the NVML (`00000000:18:00.0`) or the sysfs (`0000:18:00.0`)
/// form, case-insensitively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bdf {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl Bdf {
    pub fn parse(s: &str) -> Option<Bdf> {
        let s = s.trim();
        let (rest, function) = s.rsplit_once('.')?;
        let mut parts = rest.split(':').collect::<Vec<_>>();
        let device = parts.pop()?;
        let bus = parts.pop()?;
        let domain = parts.pop().unwrap_or("0");
        if !parts.is_empty() || domain.len() > 8 || bus.len() > 2 || device.len() > 2 {
            return None;
        }
        Some(Bdf {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u32::from_str_radix(bus, 16).ok()?,
            device: u32::from_str_radix(device, 16).ok()?,
            function: u32::from_str_radix(function, 16).ok()?,
        })
    }
    /// NVML `busId`: 8-digit domain, upper-case hex, as the real library prints it.
    pub fn nvml(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
    /// NVML `busIdLegacy`: 4-digit domain.
    pub fn legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// One cell of an `nvidia-smi topo -m` style matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    X,
    Nv(u32),
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
}

impl Cell {
    pub fn parse(s: &str) -> Option<Cell> {
        let u = s.trim().to_ascii_uppercase();
        Some(match u.as_str() {
            "X" => Cell::X,
            "PIX" => Cell::Pix,
            "PXB" => Cell::Pxb,
            "PHB" => Cell::Phb,
            "NODE" => Cell::Node,
            "SYS" => Cell::Sys,
            _ => {
                let n: u32 = u.strip_prefix("NV")?.parse().ok()?;
                if n == 0 || n > MAX_LINKS {
                    return None;
                }
                Cell::Nv(n)
            }
        })
    }
    /// nvmlGpuTopologyLevel_t for nvmlDeviceGetTopologyCommonAncestor.
    pub fn level(self) -> u32 {
        match self {
            Cell::X | Cell::Nv(_) => 0, // NVML_TOPOLOGY_INTERNAL
            Cell::Pix => 10,            // SINGLE
            Cell::Pxb => 20,            // MULTIPLE
            Cell::Phb => 30,            // HOSTBRIDGE
            Cell::Node => 40,           // NODE
            Cell::Sys => 50,            // SYSTEM
        }
    }
}

/// Where an active NVLink goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    Gpu(usize),
    Switch(usize),
}

/// The fake NVSwitches' PCI addresses (switch mode), one per `link % 4`.
pub const SWITCH_BDFS: [Bdf; 4] = [
    Bdf {
        domain: 0,
        bus: 0x05,
        device: 0,
        function: 0,
    },
    Bdf {
        domain: 0,
        bus: 0x06,
        device: 0,
        function: 0,
    },
    Bdf {
        domain: 0,
        bus: 0x07,
        device: 0,
        function: 0,
    },
    Bdf {
        domain: 0,
        bus: 0x08,
        device: 0,
        function: 0,
    },
];

#[derive(Debug, Clone)]
pub struct GpuModel {
    pub uuid: String,
    pub name: String,
    pub bdf: Bdf,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub memory_total: u64,
    pub memory_used: u64,
    pub memory_reserved: u64,
    pub minor_number: u32,
    pub numa_node: Option<u32>,
    pub gpu_numa_id: Option<u32>,
    pub cpu_affinity: Vec<u32>,
    pub ecc: RawEcc,
    pub processes: Vec<(u32, u64)>,
    pub supported_events: u64,
    pub temperature: u32,
    pub architecture: u32,
    pub cuda_cc: [i32; 2],
    pub recovery_action: u32,
    pub lost: bool,
    /// Set by `lost <gpu> stall=N`: every call on the lost GPU sleeps this long before answering.
    pub stall: Option<std::time::Duration>,
    /// Active NVLinks, link index = position. `None` means the GPU has no NVLink at all
    /// (every NVLink query answers NOT_SUPPORTED).
    pub links: Option<Vec<Remote>>,
    /// Links of `links` that are down (`nvlink <gpu> <link> down`): their state answers inactive.
    pub links_down: Vec<u32>,
    /// The clock-event (throttle) reasons, a bitmask of nvmlClocksEventReason* (`clocks <gpu> <mask>`).
    pub clock_reasons: u64,
    /// The SM (and graphics) clock in MHz (`clocks <gpu> <mask> sm=MHz`).
    pub sm_clock: u32,
}

/// The SM clock a GPU reports until an incident sets another: an H100 SXM's boost clock.
pub const DEFAULT_SM_CLOCK: u32 = 1980;

#[derive(Debug, Clone)]
pub struct Model {
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    pub gpus: Vec<GpuModel>,
    /// topology cells, `cells[i][j]`
    pub cells: Vec<Vec<Cell>>,
    /// nvmlGpuTopologyLevel_t per pair
    pub levels: Vec<Vec<u32>>,
    pub events_file: Option<PathBuf>,
    pub status_file: Option<PathBuf>,
    pub init_error: Option<u32>,
    /// Also list the live processes whose environment binds them to a GPU (see `procs`).
    pub attach_processes: bool,
}

fn event_bit(v: &Value) -> Result<u64, String> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    let s = v
        .as_str()
        .ok_or_else(|| format!("supported_events: bad entry {v}"))?;
    Ok(match s.to_ascii_lowercase().as_str() {
        "sbe" | "single_bit_ecc" => EV_SBE,
        "dbe" | "double_bit_ecc" => EV_DBE,
        "pstate" => EV_PSTATE,
        "xid" | "critical_xid" => EV_XID,
        "clock" => EV_CLOCK,
        "power_source" => EV_POWER_SOURCE,
        "mig" | "mig_config" => EV_MIG,
        other => {
            let hex = other
                .strip_prefix("0x")
                .ok_or_else(|| format!("supported_events: unknown event {s:?}"))?;
            u64::from_str_radix(hex, 16)
                .map_err(|_| format!("supported_events: unknown event {s:?}"))?
        }
    })
}

fn arch_code(s: &str) -> Result<u32, String> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "kepler" => 2,
        "maxwell" => 3,
        "pascal" => 4,
        "volta" => 5,
        "turing" => 6,
        "ampere" => 7,
        "ada" => 8,
        "hopper" => 9,
        "blackwell" => 10,
        "unknown" => u32::MAX,
        _ => return Err(format!("unknown architecture {s:?}")),
    })
}

fn init_error_code(v: &Value) -> Result<u32, String> {
    if let Some(n) = v.as_u64() {
        return u32::try_from(n).map_err(|_| "init_error out of range".to_string());
    }
    let s = v
        .as_str()
        .ok_or("init_error must be a string or a number")?;
    Ok(match s.to_ascii_lowercase().as_str() {
        "uninitialized" => 1,
        "no_permission" => 4,
        "driver_not_loaded" => 9,
        "lib_rm_version_mismatch" => 18,
        "unknown" => 999,
        _ => return Err(format!("unknown init_error {s:?}")),
    })
}

fn parse_matrix(m: &[Vec<String>], n: usize, what: &str) -> Result<Vec<Vec<Cell>>, String> {
    if m.len() != n {
        return Err(format!("{what}: {} rows for {n} gpus", m.len()));
    }
    let mut out = Vec::with_capacity(n);
    for (i, row) in m.iter().enumerate() {
        if row.len() != n {
            return Err(format!(
                "{what}: row {i} has {} cells for {n} gpus",
                row.len()
            ));
        }
        let mut r = Vec::with_capacity(n);
        for (j, c) in row.iter().enumerate() {
            let cell = Cell::parse(c).ok_or_else(|| format!("{what}[{i}][{j}]: bad cell {c:?}"))?;
            if (i == j) != (cell == Cell::X) {
                return Err(format!("{what}[{i}][{j}]: X must be exactly the diagonal"));
            }
            r.push(cell);
        }
        out.push(r);
    }
    for (i, row) in out.iter().enumerate() {
        for (j, c) in row.iter().enumerate() {
            if *c != out[j][i] {
                return Err(format!("{what}: not symmetric at [{i}][{j}]"));
            }
        }
    }
    Ok(out)
}

fn resolve(dir: &Path, p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() {
        p
    } else {
        dir.join(p)
    }
}

impl Model {
    /// Reads the config named by `FAKE_NVML_CONFIG` (with the env overrides
    /// `FAKE_NVML_EVENTS_FILE` / `FAKE_NVML_STATUS_FILE`).
    pub fn from_env() -> Result<Model, String> {
        let path = std::env::var_os("FAKE_NVML_CONFIG").ok_or("FAKE_NVML_CONFIG is not set")?;
        let path = PathBuf::from(path);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut m = Model::parse(&text, &dir).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(p) = std::env::var_os("FAKE_NVML_EVENTS_FILE") {
            m.events_file = Some(PathBuf::from(p));
        }
        if let Some(p) = std::env::var_os("FAKE_NVML_STATUS_FILE") {
            m.status_file = Some(PathBuf::from(p));
        }
        Ok(m)
    }

    pub fn parse(text: &str, dir: &Path) -> Result<Model, String> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let n = raw.gpus.len();
        if n > MAX_GPUS {
            return Err(format!("at most {MAX_GPUS} gpus"));
        }
        let mut gpus = Vec::with_capacity(n);
        let mut uuids = HashSet::new();
        let mut bdfs = Vec::new();
        for (i, g) in raw.gpus.iter().enumerate() {
            if !uuids.insert(g.uuid.clone()) {
                return Err(format!("gpus[{i}]: duplicate uuid {}", g.uuid));
            }
            let bdf = Bdf::parse(&g.pci_bus_id)
                .ok_or_else(|| format!("gpus[{i}]: bad pci_bus_id {:?}", g.pci_bus_id))?;
            if bdfs.contains(&bdf) {
                return Err(format!("gpus[{i}]: duplicate pci_bus_id {}", g.pci_bus_id));
            }
            bdfs.push(bdf);
            let supported = match &g.supported_events {
                None => EV_SBE | EV_DBE | EV_XID,
                Some(list) => {
                    let mut m = 0;
                    for v in list {
                        m |= event_bit(v).map_err(|e| format!("gpus[{i}]: {e}"))?;
                    }
                    m
                }
            };
            gpus.push(GpuModel {
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                bdf,
                pci_device_id: g.pci_device_id,
                pci_sub_system_id: g.pci_sub_system_id,
                memory_total: g.memory_total,
                memory_used: g.memory_used,
                memory_reserved: g.memory_reserved,
                minor_number: g.minor_number.unwrap_or(i as u32),
                numa_node: g.numa_node,
                gpu_numa_id: g.gpu_numa_id,
                cpu_affinity: g.cpu_affinity.clone(),
                ecc: g.ecc.clone(),
                processes: g
                    .processes
                    .iter()
                    .map(|p| (p.pid, p.used_gpu_memory))
                    .collect(),
                supported_events: supported,
                temperature: g.temperature,
                architecture: arch_code(&g.architecture).map_err(|e| format!("gpus[{i}]: {e}"))?,
                cuda_cc: g.cuda_compute_capability,
                recovery_action: g.recovery_action,
                lost: g.lost,
                stall: None,
                links: None,
                links_down: Vec::new(),
                clock_reasons: 0,
                sm_clock: DEFAULT_SM_CLOCK,
            });
        }

        // Topology cells; without a matrix: NODE within a NUMA node, SYS across, no NVLink.
        let cells = match &raw.topology {
            Some(m) => parse_matrix(m, n, "topology")?,
            None => (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| {
                            if i == j {
                                Cell::X
                            } else if gpus[i].numa_node == gpus[j].numa_node {
                                Cell::Node
                            } else {
                                Cell::Sys
                            }
                        })
                        .collect()
                })
                .collect(),
        };
        let levels = match &raw.pci_topology {
            Some(m) => {
                let pc = parse_matrix(m, n, "pci_topology")?;
                if pc.iter().flatten().any(|c| matches!(c, Cell::Nv(_))) {
                    return Err("pci_topology: NV<n> cells belong in topology".into());
                }
                pc.iter()
                    .map(|r| r.iter().map(|c| c.level()).collect())
                    .collect()
            }
            None => cells
                .iter()
                .map(|r| r.iter().map(|c| c.level()).collect())
                .collect(),
        };

        // NVLinks.
        let nv = |i: usize, j: usize| match cells[i][j] {
            Cell::Nv(k) => k,
            _ => 0,
        };
        let max_sum = (0..n)
            .map(|i| (0..n).map(|j| nv(i, j)).sum::<u32>())
            .max()
            .unwrap_or(0);
        let switch_mode = raw.nvswitch.unwrap_or(max_sum > MAX_LINKS);
        for (i, g) in gpus.iter_mut().enumerate() {
            let peers: Vec<(usize, u32)> = (0..n)
                .filter(|&j| nv(i, j) > 0)
                .map(|j| (j, nv(i, j)))
                .collect();
            if peers.is_empty() {
                continue;
            }
            let mut links = Vec::new();
            if switch_mode {
                let k = peers[0].1;
                if peers.iter().any(|p| p.1 != k) {
                    return Err(format!(
                        "topology: nvswitch mode needs the same NV<n> in all of row {i}"
                    ));
                }
                links.extend((0..k as usize).map(|l| Remote::Switch(l % SWITCH_BDFS.len())));
            } else {
                for (j, k) in peers {
                    links.extend(std::iter::repeat_n(Remote::Gpu(j), k as usize));
                }
                if links.len() > MAX_LINKS as usize {
                    return Err(format!(
                        "topology: gpu {i} needs {} direct NVLinks (> {MAX_LINKS}); set \"nvswitch\": true",
                        links.len()
                    ));
                }
            }
            g.links = Some(links);
        }

        let init_error = raw.init_error.as_ref().map(init_error_code).transpose()?;
        Ok(Model {
            nvml_version: raw
                .nvml_version
                .clone()
                .unwrap_or_else(|| format!("12.{}", raw.driver_version)),
            driver_version: raw.driver_version,
            cuda_driver_version: raw.cuda_driver_version,
            gpus,
            cells,
            levels,
            events_file: raw.events_file.as_deref().map(|p| resolve(dir, p)),
            status_file: raw.status_file.as_deref().map(|p| resolve(dir, p)),
            init_error,
            attach_processes: raw.attach_processes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_forms() {
        let a = Bdf::parse("00000000:9a:00.0").unwrap();
        let b = Bdf::parse("0000:9A:00.0").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.nvml(), "00000000:9A:00.0");
        assert_eq!(a.legacy(), "0000:9A:00.0");
        assert!(Bdf::parse("garbage").is_none());
        assert!(Bdf::parse("0000:9A:00").is_none());
    }

    #[test]
    fn cells() {
        assert_eq!(Cell::parse("nv18"), Some(Cell::Nv(18)));
        assert_eq!(Cell::parse("NV19"), None);
        assert_eq!(Cell::parse("PXB").unwrap().level(), 20);
        assert_eq!(Cell::parse("SYS").unwrap().level(), 50);
    }

    fn gpus(n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    r#"{{"uuid":"GPU-{i}","pci_bus_id":"0000:{:02x}:00.0"}}"#,
                    i + 1
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn direct_and_switch_links() {
        let direct = format!(
            r#"{{"gpus":[{}],"topology":[["X","NV4","NV2"],["NV4","X","SYS"],["NV2","SYS","X"]]}}"#,
            gpus(3)
        );
        let m = Model::parse(&direct, Path::new("/")).unwrap();
        let l0 = m.gpus[0].links.as_ref().unwrap();
        assert_eq!(l0.iter().filter(|r| **r == Remote::Gpu(1)).count(), 4);
        assert_eq!(l0.iter().filter(|r| **r == Remote::Gpu(2)).count(), 2);
        assert_eq!(m.levels[1][2], 50);

        let row = |i: usize| {
            (0..4)
                .map(|j| if i == j { "\"X\"" } else { "\"NV18\"" })
                .collect::<Vec<_>>()
                .join(",")
        };
        let sw = format!(
            r#"{{"gpus":[{}],"topology":[[{}],[{}],[{}],[{}]]}}"#,
            gpus(4),
            row(0),
            row(1),
            row(2),
            row(3)
        );
        let m = Model::parse(&sw, Path::new("/")).unwrap();
        assert_eq!(m.gpus[3].links.as_ref().unwrap().len(), 18);
        assert!(matches!(
            m.gpus[3].links.as_ref().unwrap()[0],
            Remote::Switch(_)
        ));
    }

    #[test]
    fn rejects_bad_configs() {
        let asym = format!(
            r#"{{"gpus":[{}],"topology":[["X","NV4"],["PIX","X"]]}}"#,
            gpus(2)
        );
        assert!(Model::parse(&asym, Path::new("/")).is_err());
        let unknown_field = format!(r#"{{"gpus":[{}],"typo":1}}"#, gpus(1));
        assert!(Model::parse(&unknown_field, Path::new("/")).is_err());
        let too_many = format!(
            r#"{{"gpus":[{}],"nvswitch":false,"topology":[["X","NV18","NV4"],["NV18","X","NV4"],["NV4","NV4","X"]]}}"#,
            gpus(3)
        );
        assert!(Model::parse(&too_many, Path::new("/")).is_err());
    }
}
