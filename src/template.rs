//! Python's `string.Template(s).safe_substitute(...)`, which torchrun applies to worker arguments
//! (`$local_rank`, `${local_rank}`, `$$` → `$`) and to the tee line prefix template.

/// Replaces `$name` and `${name}` for the given names, turns `$$` into `$`, and leaves everything else
/// (unknown names, a lone `$`) as it is — exactly what `safe_substitute` does.
pub fn safe_substitute(s: &str, vars: &[(&str, &str)]) -> String {
    let is_start = |c: char| c == '_' || c.is_ascii_alphabetic();
    let is_cont = |c: char| c == '_' || c.is_ascii_alphanumeric();
    let lookup = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '$' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        match chars.get(i + 1) {
            Some('$') => {
                out.push('$');
                i += 2;
            }
            Some('{') => {
                let start = i + 2;
                let mut end = start;
                while end < chars.len() && is_cont(chars[end]) {
                    end += 1;
                }
                let name: String = chars[start..end].iter().collect();
                match (chars.get(start).copied().map(is_start), chars.get(end), lookup(&name)) {
                    (Some(true), Some('}'), Some(v)) => {
                        out.push_str(v);
                        i = end + 1;
                    }
                    _ => {
                        out.push('$');
                        i += 1;
                    }
                }
            }
            Some(&c) if is_start(c) => {
                let start = i + 1;
                let mut end = start;
                while end < chars.len() && is_cont(chars[end]) {
                    end += 1;
                }
                let name: String = chars[start..end].iter().collect();
                match lookup(&name) {
                    Some(v) => out.push_str(v),
                    None => out.extend(&chars[i..end]),
                }
                i = end;
            }
            _ => {
                out.push('$');
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::safe_substitute;

    fn lr(s: &str) -> String {
        safe_substitute(s, &[("local_rank", "3")])
    }

    #[test]
    fn matches_python_safe_substitute() {
        assert_eq!(lr("--local-rank=$local_rank"), "--local-rank=3");
        assert_eq!(lr("${local_rank}x"), "3x");
        assert_eq!(lr("cost$$"), "cost$");
        assert_eq!(lr("$$local_rank"), "$local_rank");
        assert_eq!(lr("$local_rankx"), "$local_rankx");
        assert_eq!(lr("$other ${other} $ ${ $1"), "$other ${other} $ ${ $1");
        assert_eq!(lr("${local_rank"), "${local_rank");
        assert_eq!(lr("100%$"), "100%$");
    }
}
