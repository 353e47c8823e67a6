//! The events-file grammar: one line is one effect on one GPU, optionally shaped like a real incident
//! (`kill=`, `companion=`, `remap=`, `stall=` modifiers). See README.md, "Fault injection".

use std::time::Duration;

/// What a line does to its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Xid(u64),
    Dbe,
    Sbe,
    Lost,
    Process { pid: u32, bytes: u64 },
    NoProcess(u64),
    Recovery(u32),
    Remap(Remap),
    /// `retired <gpu> pending|clear`: a page retirement waiting for the next reset, or none.
    Retired(bool),
    /// `nvlink <gpu> <link> down|up`.
    Nvlink { link: u32, up: bool },
    /// `clocks <gpu> <reasons> [sm=MHz]`: the clock-event reasons (decimal or 0x hex) and the SM clock.
    Clocks { reasons: u64, sm: Option<u32> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remap {
    Pending,
    Failure,
    Clear,
}

/// When the GPU's attached processes are SIGKILLed relative to the line's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// `kill=-N`: kill now, apply the effect N ms later (the process dies before NVML reports).
    Before(Duration),
    /// `kill=+N` (or `kill=N`): apply the effect now, kill N ms later.
    After(Duration),
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub gpu: usize,
    pub effect: Effect,
    pub kill: Option<Kill>,
    /// `companion=48@20,…`: XID events that follow the effect by the given delay, as the driver logs them.
    pub companions: Vec<(u64, Duration)>,
    /// `remap=pending|failure`: the row-remap state the effect leaves (as `remap <gpu> …`).
    pub remap: Option<Remap>,
    /// `stall=N` (lost only): every later call on the GPU sleeps N ms before it answers GPU_IS_LOST.
    pub stall: Option<Duration>,
}

fn ms(s: &str) -> Option<Duration> {
    s.parse::<u64>().ok().map(Duration::from_millis)
}

/// A bitmask, decimal or `0x` hex.
fn mask(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn remap(s: &str) -> Option<Remap> {
    match s {
        "pending" => Some(Remap::Pending),
        "failure" => Some(Remap::Failure),
        "clear" => Some(Remap::Clear),
        _ => None,
    }
}

/// Parses one line; Ok(None) for blank lines and comments, Err(()) for a malformed one. `gpus` bounds the
/// GPU index.
pub fn parse(line: &str, gpus: usize) -> Result<Option<Line>, ()> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let (words, modifiers): (Vec<&str>, Vec<&str>) = line.split_whitespace().partition(|t| !t.contains('='));
    let num = |i: usize| words.get(i).and_then(|s| s.parse::<u64>().ok());
    let gpu = num(1).and_then(|g| usize::try_from(g).ok()).filter(|g| *g < gpus).ok_or(())?;
    let effect = match words[0] {
        "xid" => Effect::Xid(num(2).ok_or(())?),
        "dbe" => Effect::Dbe,
        "sbe" => Effect::Sbe,
        "lost" => Effect::Lost,
        "process" => match (num(2).and_then(|p| u32::try_from(p).ok()), num(3)) {
            (Some(pid), Some(bytes)) => Effect::Process { pid, bytes },
            _ => return Err(()),
        },
        "noprocess" => Effect::NoProcess(num(2).ok_or(())?),
        "recovery" => Effect::Recovery(num(2).and_then(|a| u32::try_from(a).ok()).ok_or(())?),
        "remap" => Effect::Remap(words.get(2).copied().and_then(remap).ok_or(())?),
        "retired" => match words.get(2).copied() {
            Some("pending") => Effect::Retired(true),
            Some("clear") => Effect::Retired(false),
            _ => return Err(()),
        },
        "nvlink" => match (num(2).and_then(|l| u32::try_from(l).ok()), words.get(3).copied()) {
            (Some(link), Some("down")) => Effect::Nvlink { link, up: false },
            (Some(link), Some("up")) => Effect::Nvlink { link, up: true },
            _ => return Err(()),
        },
        "clocks" => Effect::Clocks { reasons: words.get(2).copied().and_then(mask).ok_or(())?, sm: None },
        _ => return Err(()),
    };
    let mut out = Line { gpu, effect, kill: None, companions: Vec::new(), remap: None, stall: None };
    let incident = matches!(effect, Effect::Xid(_) | Effect::Dbe | Effect::Lost);
    for m in modifiers {
        let (key, value) = m.split_once('=').ok_or(())?;
        match key {
            "kill" if incident => {
                out.kill = Some(match value.strip_prefix('-') {
                    Some(n) => Kill::Before(ms(n).ok_or(())?),
                    None => Kill::After(ms(value.strip_prefix('+').unwrap_or(value)).ok_or(())?),
                })
            }
            "companion" if incident => {
                for c in value.split(',') {
                    let (code, delay) = c.split_once('@').unwrap_or((c, "0"));
                    out.companions.push((code.parse().map_err(|_| ())?, ms(delay).ok_or(())?));
                }
            }
            "remap" if incident => out.remap = Some(remap(value).filter(|r| *r != Remap::Clear).ok_or(())?),
            "stall" if effect == Effect::Lost => out.stall = Some(ms(value).ok_or(())?),
            "sm" => match &mut out.effect {
                Effect::Clocks { sm, .. } => *sm = Some(value.parse().map_err(|_| ())?),
                _ => return Err(()),
            },
            _ => return Err(()),
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(gpu: usize, effect: Effect) -> Line {
        Line { gpu, effect, kill: None, companions: Vec::new(), remap: None, stall: None }
    }

    #[test]
    fn plain_lines_parse_as_before() {
        let cases: &[(&str, Result<Option<Line>, ()>)] = &[
            ("", Ok(None)),
            ("  # a comment", Ok(None)),
            ("xid 1 13", Ok(Some(line(1, Effect::Xid(13))))),
            ("dbe 0", Ok(Some(line(0, Effect::Dbe)))),
            ("sbe 3", Ok(Some(line(3, Effect::Sbe)))),
            ("lost 2", Ok(Some(line(2, Effect::Lost)))),
            ("process 1 777 2048", Ok(Some(line(1, Effect::Process { pid: 777, bytes: 2048 })))),
            ("noprocess 1 777", Ok(Some(line(1, Effect::NoProcess(777))))),
            ("recovery 0 4", Ok(Some(line(0, Effect::Recovery(4))))),
            ("remap 0 pending", Ok(Some(line(0, Effect::Remap(Remap::Pending))))),
            ("retired 1 pending", Ok(Some(line(1, Effect::Retired(true))))),
            ("retired 1 clear", Ok(Some(line(1, Effect::Retired(false))))),
            ("nvlink 0 3 down", Ok(Some(line(0, Effect::Nvlink { link: 3, up: false })))),
            ("nvlink 0 3 up", Ok(Some(line(0, Effect::Nvlink { link: 3, up: true })))),
            ("clocks 2 0x48", Ok(Some(line(2, Effect::Clocks { reasons: 0x48, sm: None })))),
            ("clocks 2 0 sm=1200", Ok(Some(line(2, Effect::Clocks { reasons: 0, sm: Some(1200) })))),
            ("nvlink 0 3 sideways", Err(())),
            ("clocks 0 0xzz", Err(())),
            ("clocks 0 8 sm=fast", Err(())),
            ("dbe 0 sm=1200", Err(())),
            ("xid 4 13", Err(())),
            ("xid 0", Err(())),
            ("frobnicate 0", Err(())),
            ("remap 0 sideways", Err(())),
        ];
        for (text, want) in cases {
            assert_eq!(&parse(text, 4), want, "{text:?}");
        }
    }

    #[test]
    fn incident_modifiers() {
        let mut l = line(0, Effect::Xid(79));
        l.kill = Some(Kill::Before(Duration::from_millis(30)));
        assert_eq!(parse("xid 0 79 kill=-30", 1), Ok(Some(l.clone())));
        l.kill = Some(Kill::After(Duration::from_millis(30)));
        assert_eq!(parse("xid 0 79 kill=+30", 1), Ok(Some(l.clone())));
        assert_eq!(parse("xid 0 kill=30 79", 1), Ok(Some(l)));

        let mut l = line(0, Effect::Dbe);
        l.companions = vec![(48, Duration::from_millis(20)), (63, Duration::ZERO)];
        l.remap = Some(Remap::Pending);
        assert_eq!(parse("dbe 0 companion=48@20,63 remap=pending", 1), Ok(Some(l)));

        let mut l = line(0, Effect::Lost);
        l.stall = Some(Duration::from_secs(10));
        l.kill = Some(Kill::Before(Duration::ZERO));
        assert_eq!(parse("lost 0 stall=10000 kill=-0", 1), Ok(Some(l)));

        for bad in ["xid 0 13 stall=5", "sbe 0 kill=-3", "process 0 1 2 kill=1", "dbe 0 kill=-x", "dbe 0 companion=48@", "dbe 0 remap=clear", "dbe 0 color=red"] {
            assert_eq!(parse(bad, 1), Err(()), "{bad}");
        }
    }
}
