//! What a GPU fault means for the job: one table from XID (and the non-XID NVML signals) to one action.
//!
//! Defaults follow `docs/gpu-faults.md` (NVIDIA's catalogue, the k8s device plugin and the EKS
//! agent, reduced to launcher actions). "Exclude-class" faults (the GPU needs a reset) become `Exclude` with
//! `--on-gpu-fault exclude` and `Drain` otherwise; `--xid-policy 13=ignore,79=drain` overrides single XIDs.

use std::collections::BTreeMap;
use std::fmt;

/// What the agent does about a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Log it and count it.
    Ignore,
    /// Restart the local worker group (spends one restart).
    Restart,
    /// Stop using the GPU and continue with one worker fewer on this node.
    Exclude,
    /// Stop the workers, leave the rendezvous, run the node-fault hook, exit with the unhealthy-node code.
    Drain,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Ignore => "ignore",
            Action::Restart => "restart",
            Action::Exclude => "exclude",
            Action::Drain => "drain",
        }
    }

    fn parse(s: &str) -> Option<Action> {
        match s {
            "ignore" => Some(Action::Ignore),
            "restart" => Some(Action::Restart),
            "exclude" => Some(Action::Exclude),
            "drain" => Some(Action::Drain),
            _ => None,
        }
    }
}

/// A fault as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A critical XID event with its code (`None`: NVML reported "unknown").
    Xid(Option<u64>),
    /// A double-bit (uncorrectable) ECC error event or a rising volatile uncorrected counter: as XID 48.
    DoubleBitEcc,
    /// The GPU stopped answering (`GpuLost`): as XID 79.
    Lost,
    /// Row remapping failed (NVML field 145): the memory cannot be repaired.
    RemapFailure,
    /// The driver's recovery action (field 230) changed: 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and
    /// reset (what XID 154 announces).
    RecoveryAction(u32),
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::Xid(Some(x)) => write!(f, "XID {x}"),
            FaultKind::Xid(None) => write!(f, "XID unknown"),
            FaultKind::DoubleBitEcc => write!(f, "double-bit ECC error"),
            FaultKind::Lost => write!(f, "GPU lost"),
            FaultKind::RemapFailure => write!(f, "row remapping failure"),
            FaultKind::RecoveryAction(a) => write!(f, "driver recovery action {a}"),
        }
    }
}

impl FaultKind {
    /// The XID this fault counts as, for policies and the hook's environment.
    pub fn xid(self) -> Option<u64> {
        match self {
            FaultKind::Xid(x) => x,
            FaultKind::DoubleBitEcc => Some(48),
            FaultKind::Lost => Some(79),
            FaultKind::RemapFailure => Some(64),
            FaultKind::RecoveryAction(_) => Some(154),
        }
    }
}

/// The table's classes before `--on-gpu-fault` resolves exclude-class entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Ignore,
    Restart,
    /// The GPU needs a reset: exclude it or drain the node.
    Reset,
    Drain,
}

/// Default class per XID (`docs/gpu-faults.md`, "The default table"; H100/H200).
fn default_class(xid: Option<u64>) -> Class {
    let Some(xid) = xid else { return Class::Reset };
    match xid {
        8 | 11 | 13 | 25 | 31 | 32 | 45 | 69 | 80 | 94 | 109 | 137 | 159 => Class::Restart,
        38 | 43 | 44 | 63 | 66 | 67 | 68 | 92 | 93 | 121 | 141 | 154 | 156 | 160 | 161 | 171 | 172 => Class::Ignore,
        46 | 48 | 62 | 74 | 95 | 110 | 119 | 120 | 136 | 140 | 143 | 144..=150 | 155 | 158 => Class::Reset,
        54 | 64 | 79 | 151 | 157 => Class::Drain,
        // Unknown to the catalogue: conservative (`docs/gpu-faults.md`).
        _ => Class::Reset,
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid value '{value}' for '{flag}': {reason}")]
pub struct PolicyError {
    flag: &'static str,
    value: String,
    reason: String,
}

/// The effective policy: `--on-gpu-fault` plus `--xid-policy` overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// What exclude-class faults do: `Exclude` or `Drain`.
    pub on_gpu_fault: Action,
    pub overrides: BTreeMap<u64, Action>,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy { on_gpu_fault: Action::Drain, overrides: BTreeMap::new() }
    }
}

impl Policy {
    /// Parses `--on-gpu-fault` (exclude | drain) and `--xid-policy` (`XID=ACTION,...`).
    pub fn parse(on_gpu_fault: &str, xid_policy: &str) -> Result<Policy, PolicyError> {
        let on_gpu_fault = match on_gpu_fault {
            "exclude" => Action::Exclude,
            "drain" => Action::Drain,
            other => {
                return Err(PolicyError {
                    flag: "--on-gpu-fault",
                    value: other.into(),
                    reason: "use exclude or drain".into(),
                })
            }
        };
        let mut overrides = BTreeMap::new();
        for item in xid_policy.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = |reason: &str| PolicyError { flag: "--xid-policy", value: item.into(), reason: reason.into() };
            let (xid, action) = item.split_once('=').ok_or_else(|| bad("use XID=ACTION, e.g. 13=ignore,79=drain"))?;
            let xid = xid.trim().parse::<u64>().map_err(|_| bad("the XID must be a number"))?;
            let action =
                Action::parse(action.trim()).ok_or_else(|| bad("the action must be ignore, restart, exclude or drain"))?;
            overrides.insert(xid, action);
        }
        Ok(Policy { on_gpu_fault, overrides })
    }

    /// The action for a fault.
    pub fn action(&self, kind: FaultKind) -> Action {
        if let Some(a) = kind.xid().and_then(|x| self.overrides.get(&x)) {
            return *a;
        }
        let class = match kind {
            FaultKind::Lost => Class::Drain,
            FaultKind::RemapFailure => Class::Drain,
            FaultKind::RecoveryAction(0) => Class::Ignore,
            FaultKind::RecoveryAction(2) => Class::Drain,
            FaultKind::RecoveryAction(_) => Class::Reset,
            other => default_class(other.xid()),
        };
        match class {
            Class::Ignore => Action::Ignore,
            Class::Restart => Action::Restart,
            Class::Reset => self.on_gpu_fault,
            Class::Drain => Action::Drain,
        }
    }

    /// One line for the startup banner.
    pub fn describe(&self) -> String {
        let overrides: Vec<String> = self.overrides.iter().map(|(x, a)| format!("{x}={}", a.as_str())).collect();
        format!(
            "restart on XID 8,11,13,25,31,32,45,69,80,94,109,137,159; {} on XID 46,48,62,74,95,110,119,120,136,140,\
             143-150,155,158, double-bit ECC and unknown XIDs; drain on XID 54,64,79,151,157, GPU lost, row-remap \
             failure and a node-reboot recovery action; ignore the rest of the catalogue{}",
            self.on_gpu_fault.as_str(),
            if overrides.is_empty() { String::new() } else { format!("; overrides {}", overrides.join(",")) }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_reference_table() {
        let p = Policy::default();
        assert_eq!(p.action(FaultKind::Xid(Some(13))), Action::Restart);
        assert_eq!(p.action(FaultKind::Xid(Some(79))), Action::Drain);
        assert_eq!(p.action(FaultKind::Xid(Some(63))), Action::Ignore);
        assert_eq!(p.action(FaultKind::Xid(Some(48))), Action::Drain, "exclude-class drains by default");
        assert_eq!(p.action(FaultKind::Lost), Action::Drain);
        assert_eq!(p.action(FaultKind::Xid(None)), Action::Drain);
        assert_eq!(p.action(FaultKind::RecoveryAction(2)), Action::Drain, "node reboot");
        assert_eq!(p.action(FaultKind::RecoveryAction(0)), Action::Ignore);
    }

    #[test]
    fn exclude_mode_and_overrides() {
        let p = Policy::parse("exclude", "13=ignore, 79=restart").unwrap();
        assert_eq!(p.action(FaultKind::DoubleBitEcc), Action::Exclude);
        assert_eq!(p.action(FaultKind::Xid(Some(95))), Action::Exclude);
        assert_eq!(p.action(FaultKind::Xid(Some(13))), Action::Ignore);
        assert_eq!(p.action(FaultKind::Lost), Action::Restart, "overrides apply to what a fault counts as");
        assert!(p.describe().contains("overrides 13=ignore,79=restart"));
    }

    #[test]
    fn bad_policies_name_the_flag() {
        for (f, x) in [("maybe", ""), ("drain", "13"), ("drain", "x=drain"), ("drain", "13=reboot")] {
            let e = Policy::parse(f, x).unwrap_err().to_string();
            assert!(e.contains("--on-gpu-fault") || e.contains("--xid-policy"), "{e}");
        }
    }
}
