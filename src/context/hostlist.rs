//! Slurm host lists (`SLURM_JOB_NODELIST`, `SLURM_STEP_NODELIST`) as Slurm's `hostlist.c` expands them.
//!
//! The forms: comma-separated entries (commas inside brackets do not separate), a bracket group of numbers and
//! ranges (`gpu[001-004,010]`), leading zeros kept at the width of the range's first bound (`[08-10]` is 08, 09,
//! 10), text after a group (`node[1-2]-ib`), and several groups in one entry, expanded as Slurm does with the
//! last group varying fastest (`rack[1-2]n[1-2]`: rack1n1, rack1n2, rack2n1, rack2n2).

/// Slurm refuses larger lists too (`MAX_RANGE`); a bound keeps a bad variable from exhausting memory.
const MAX_HOSTS: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{list}' is not a Slurm host list ({why}); expected names like gpu[001-004,010],cpu7")]
pub struct HostlistError {
    pub list: String,
    pub why: String,
}

/// Every host of `list`, in Slurm's order (duplicates kept, as Slurm keeps them).
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let err = |why: String| HostlistError { list: list.to_string(), why };
    let mut hosts = Vec::new();
    for entry in split_top_level(list).map_err(err)? {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        for part in parts(entry).map_err(err)? {
            let choices = match part {
                Part::Text(t) => vec![t.to_string()],
                Part::Group(g) => group(g).map_err(err)?,
            };
            if names.len().saturating_mul(choices.len()).saturating_add(hosts.len()) > MAX_HOSTS {
                return Err(err(format!("more than {MAX_HOSTS} hosts")));
            }
            names = names.iter().flat_map(|n| choices.iter().map(move |c| format!("{n}{c}"))).collect();
        }
        hosts.extend(names);
    }
    if hosts.is_empty() {
        return Err(err("no host in it".into()));
    }
    Ok(hosts)
}

/// The entries of a list: split at the commas outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err("a '[' inside brackets".into()),
            '[' => depth += 1,
            ']' if depth == 0 => return Err("a ']' without its '['".into()),
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err("a '[' without its ']'".into());
    }
    out.push(&list[start..]);
    Ok(out)
}

enum Part<'a> {
    Text(&'a str),
    /// The text between `[` and `]`.
    Group(&'a str),
}

/// An entry as text and bracket groups (brackets already known to be balanced and not nested).
fn parts(entry: &str) -> Result<Vec<Part<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find(']').map(|c| open + c).ok_or("a '[' without its ']'")?;
        if open > 0 {
            out.push(Part::Text(&rest[..open]));
        }
        out.push(Part::Group(&rest[open + 1..close]));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Part::Text(rest));
    }
    if entry.contains(char::is_whitespace) {
        return Err(format!("a space in '{entry}'"));
    }
    Ok(out)
}

/// `001-004,010` → 001 002 003 004 010.
fn group(g: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in g.split(',') {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let number = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("'[{g}]' has '{item}', not a number or a range N-M"));
            }
            s.parse::<u64>().map_err(|_| format!("'{s}' in '[{g}]' is too large"))
        };
        let (a, b) = (number(lo)?, number(hi)?);
        if a > b {
            return Err(format!("the range '{item}' in '[{g}]' goes down"));
        }
        if (b - a) as usize >= MAX_HOSTS {
            return Err(format!("more than {MAX_HOSTS} hosts"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_slurm_documents() {
        let cases: &[(&str, &[&str])] = &[
            ("cpu7", &["cpu7"]),
            ("tux0,tux1", &["tux0", "tux1"]),
            ("lx[10-13]", &["lx10", "lx11", "lx12", "lx13"]),
            ("gpu[001-004,010],cpu7", &["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "cpu7"]),
            ("lx[10,15,20-21]", &["lx10", "lx15", "lx20", "lx21"]),
            ("tux[0-1],snowflake", &["tux0", "tux1", "snowflake"]),
            // Leading zeros: the width of the first bound; numbers that outgrow it are not cut.
            ("n[08-11]", &["n08", "n09", "n10", "n11"]),
            ("n[8-10]", &["n8", "n9", "n10"]),
            ("n[098-101]", &["n098", "n099", "n100", "n101"]),
            ("n[0007]", &["n0007"]),
            // Suffixes after a group.
            ("node[1-2]-ib", &["node1-ib", "node2-ib"]),
            ("node[1-2].cluster.org", &["node1.cluster.org", "node2.cluster.org"]),
            // Several groups: the last varies fastest.
            ("rack[1-2]n[1-2]", &["rack1n1", "rack1n2", "rack2n1", "rack2n2"]),
            ("r[0-1]-c[08-09]-gpu", &["r0-c08-gpu", "r0-c09-gpu", "r1-c08-gpu", "r1-c09-gpu"]),
            ("[1-2]x", &["1x", "2x"]),
            // Mixed and edge spellings.
            ("a[1-2],b,c[5]", &["a1", "a2", "b", "c5"]),
            (" node1 , node2 ", &["node1", "node2"]),
            ("a,,b", &["a", "b"]),
            ("n1-ib,n2-ib", &["n1-ib", "n2-ib"]),
            ("10.0.0.1,10.0.0.2", &["10.0.0.1", "10.0.0.2"]),
        ];
        for (list, want) in cases {
            assert_eq!(expand(list).unwrap(), *want, "{list}");
        }
    }

    #[test]
    fn malformed_lists_say_what_is_wrong() {
        let cases = [
            ("", "no host"),
            ("n[1-2", "without its ']'"),
            ("n1-2]", "without its '['"),
            ("n[[1]]", "inside brackets"),
            ("n[]", "not a number"),
            ("n[a-b]", "not a number"),
            ("n[1-2-3]", "not a number"),
            ("n[3-1]", "goes down"),
            ("n[1,]", "not a number"),
            ("n[0-9999999]", "more than"),
            ("a[0-9999]b[0-9999]", "more than"),
            ("n[99999999999999999999]", "too large"),
            ("my host", "a space"),
        ];
        for (list, needle) in cases {
            let e = expand(list).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("Slurm host list"), "{list}: {e}");
        }
    }
}
