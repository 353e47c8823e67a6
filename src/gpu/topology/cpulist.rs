//! Kernel CPU lists (`0-7,16-23`), as sysfs writes them and numactl reads them.

use std::collections::BTreeSet;

/// Parses a kernel CPU list (`0-7,16-23`, possibly empty); None when malformed.
pub fn parse_cpulist(text: &str) -> Option<Vec<u32>> {
    let mut out = BTreeSet::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().ok()?);
            }
        }
    }
    Some(out.into_iter().collect())
}

/// The kernel/numactl form of a CPU set: sorted ranges, `0-3,16-19`.
pub fn format_cpulist(cpus: &[u32]) -> String {
    let sorted: BTreeSet<u32> = cpus.iter().copied().collect();
    let mut parts: Vec<String> = Vec::new();
    let mut iter = sorted.into_iter().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_parse_and_format() {
        assert_eq!(parse_cpulist("0-3,8,16-17\n"), Some(vec![0, 1, 2, 3, 8, 16, 17]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(format_cpulist(&[17, 0, 1, 2, 3, 8, 16]), "0-3,8,16-17");
    }
}
