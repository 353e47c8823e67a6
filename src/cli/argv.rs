//! The command line as torchrun's argparse (Python 3.11) reads it, ahead of clap.
//!
//! argparse and clap disagree on the launcher's part of the command line (before the script): argparse takes
//! the last of a repeated option, names an unknown option (`unrecognized arguments: --frobnicate`) where clap,
//! with the script's arguments allowed to start with `-`, would take it for the script, reports an ambiguous
//! prefix with every option it could match, and drops one `--` right before or right after the script. So the
//! arguments are first read here, argparse's way, into an unambiguous form clap parses as is: every option as
//! `--long[=value]`, then `--`, the script and its arguments untouched. Values are still checked by clap.
//!
//! One deliberate difference: argparse also rejects an ambiguous prefix of its own options among the script's
//! arguments (`torchrun train.py --r` fails); muster passes everything after the script to the script.

use clap::Command;

/// A command line argparse would refuse, with argparse's wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgvError {
    #[error("ambiguous option: {given} could match {}", .matches.join(", "))]
    Ambiguous { given: String, matches: Vec<String> },
    #[error("unrecognized arguments: {}; `muster --help` lists the options", .0.join(" "))]
    Unrecognized(Vec<String>),
    #[error("argument {0}: expected one argument")]
    ExpectedOne(String),
    #[error("argument {option}: ignored explicit argument '{arg}'")]
    IgnoredExplicit { option: String, arg: String },
}

/// One option: its option strings (`-r`, `--redirects`, aliases) in declaration order.
struct Opt {
    strings: Vec<String>,
    long: String,
    takes_value: bool,
}

/// How argparse classifies one command-line string (`_parse_optional`).
enum Class {
    Positional,
    /// A known option: its index, the option string matched, and an `=value` (or, for `-rVALUE`, the rest).
    Known { opt: usize, string: String, explicit: Option<String> },
    Unknown,
}

struct Table(Vec<Opt>);

impl Table {
    /// Every option of a built `cmd` (so that `--help` and `--version` are among them).
    fn new(cmd: &Command) -> Table {
        let opts = cmd
            .get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                let mut strings: Vec<String> = a.get_short().map(|s| format!("-{s}")).into_iter().collect();
                strings.push(format!("--{long}"));
                strings.extend(a.get_all_aliases().unwrap_or_default().into_iter().map(|x| format!("--{x}")));
                Some(Opt { strings, long: long.to_string(), takes_value: a.get_action().takes_values() })
            })
            .collect();
        Table(opts)
    }

    fn strings(&self) -> impl Iterator<Item = (usize, &str)> {
        self.0.iter().enumerate().flat_map(|(i, o)| o.strings.iter().map(move |s| (i, s.as_str())))
    }

    fn exact(&self, s: &str) -> Option<usize> {
        self.strings().find(|(_, x)| *x == s).map(|(i, _)| i)
    }

    fn name(&self, opt: usize) -> String {
        self.0[opt].strings.join("/")
    }

    fn classify(&self, arg: &str) -> Result<Class, ArgvError> {
        let known = |opt, string: &str, explicit: Option<&str>| Class::Known {
            opt,
            string: string.to_string(),
            explicit: explicit.map(str::to_string),
        };
        if !arg.starts_with('-') {
            return Ok(Class::Positional);
        }
        if let Some(i) = self.exact(arg) {
            return Ok(known(i, arg, None));
        }
        if arg.len() == 1 {
            return Ok(Class::Positional);
        }
        if let Some((o, v)) = arg.split_once('=') {
            if let Some(i) = self.exact(o) {
                return Ok(known(i, o, Some(v)));
            }
        }
        let mut matches = self.prefix_matches(arg);
        if matches.len() > 1 {
            let matches = matches.into_iter().map(|(_, s, _)| s.to_string()).collect();
            return Err(ArgvError::Ambiguous { given: arg.to_string(), matches });
        }
        if let Some((i, s, explicit)) = matches.pop() {
            return Ok(known(i, s, explicit));
        }
        if is_negative_number(arg) || arg.contains(' ') {
            return Ok(Class::Positional);
        }
        Ok(Class::Unknown)
    }

    /// argparse's `_get_option_tuples`: `--pre[=v]` matches every option string starting with `--pre`;
    /// `-xREST` matches the short option `-x` with REST as its value.
    fn prefix_matches<'a>(&'a self, arg: &'a str) -> Vec<(usize, &'a str, Option<&'a str>)> {
        if let Some(rest) = arg.strip_prefix("--") {
            let (prefix, explicit) = match rest.split_once('=') {
                Some((p, v)) => (&arg[..p.len() + 2], Some(v)),
                None => (arg, None),
            };
            return self.strings().filter(|(_, s)| s.starts_with(prefix)).map(|(i, s)| (i, s, explicit)).collect();
        }
        let split = arg.char_indices().nth(2).map_or(arg.len(), |(at, _)| at);
        let (short, rest) = arg.split_at(split);
        self.strings()
            .filter_map(|(i, s)| match s {
                s if s == short => Some((i, s, Some(rest))),
                s if s.starts_with(arg) => Some((i, s, None)),
                _ => None,
            })
            .collect()
    }
}

/// argparse's `^-\d+$|^-\d*\.\d+$`.
fn is_negative_number(arg: &str) -> bool {
    let Some(n) = arg.strip_prefix('-') else { return false };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    match n.split_once('.') {
        None => !n.is_empty() && digits(n),
        Some((int, frac)) => digits(int) && !frac.is_empty() && digits(frac),
    }
}

/// `args` (without the program name) rewritten for clap: `--long` / `--long=value` for each option in order
/// (clap keeps the last of a repeated one), then `--`, the script and its arguments.
pub fn normalize(cmd: &Command, args: &[String]) -> Result<Vec<String>, ArgvError> {
    let table = Table::new(cmd);
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    let mut i = 0;
    // The script's index, and whether a `--` came right before it.
    let script = loop {
        let Some(arg) = args.get(i) else { break None };
        if arg == "--" {
            // Everything after the first `--` is positional; the script's own pattern swallows this one.
            break Some((i + 1, true)).filter(|(s, _)| *s < args.len());
        }
        match table.classify(arg)? {
            Class::Positional => break Some((i, false)),
            Class::Unknown => {
                unknown.push(arg.clone());
                i += 1;
            }
            Class::Known { opt, string, explicit } => {
                i = consume(&table, args, i, (opt, string, explicit), &mut out)?;
            }
        }
    };
    if !unknown.is_empty() {
        return Err(ArgvError::Unrecognized(unknown));
    }
    if let Some((s, dashes_before)) = script {
        out.push("--".to_string());
        out.push(args[s].clone());
        // With no `--` before the script, the script's pattern takes one `--` right after it.
        let rest = &args[s + 1..];
        let rest = match rest.split_first() {
            Some((first, tail)) if first == "--" && !dashes_before => tail,
            _ => rest,
        };
        out.extend(rest.iter().cloned());
    }
    Ok(out)
}

/// One option occurrence at `args[at]` (argparse's `consume_optional`), written to `out`; returns the index
/// of the next unread argument. Short flags chain: `-mt3` is `-m -t 3`.
fn consume(
    table: &Table,
    args: &[String],
    at: usize,
    (mut opt, mut string, mut explicit): (usize, String, Option<String>),
    out: &mut Vec<String>,
) -> Result<usize, ArgvError> {
    loop {
        let long = &table.0[opt].long;
        if table.0[opt].takes_value {
            return match explicit {
                Some(v) => {
                    out.push(format!("--{long}={v}"));
                    Ok(at + 1)
                }
                None => match args.get(at + 1) {
                    Some(v) if v != "--" && matches!(table.classify(v)?, Class::Positional) => {
                        out.push(format!("--{long}={v}"));
                        Ok(at + 2)
                    }
                    _ => Err(ArgvError::ExpectedOne(table.name(opt))),
                },
            };
        }
        out.push(format!("--{long}"));
        let Some(arg) = explicit else { return Ok(at + 1) };
        let option = table.name(opt);
        let ignored = || ArgvError::IgnoredExplicit { option: option.clone(), arg: arg.clone() };
        let mut chars = arg.chars();
        let (Some(next), false) = (chars.next(), string.starts_with("--")) else { return Err(ignored()) };
        let next_string = format!("-{next}");
        let rest = chars.as_str();
        opt = table.exact(&next_string).ok_or_else(ignored)?;
        string = next_string;
        explicit = (!rest.is_empty()).then(|| rest.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    fn norm(args: &[&str]) -> Result<Vec<String>, ArgvError> {
        let mut cmd = Cli::command();
        cmd.build();
        normalize(&cmd, &args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn ok(args: &[&str]) -> Vec<String> {
        norm(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn options_are_spelled_out_and_the_script_follows_a_double_dash() {
        assert_eq!(
            ok(&["--nproc_per_node", "2", "--stand", "-r3", "-t", "1", "--rdzv-id=", "x.py", "--lr", "1"]),
            ["--nproc-per-node=2", "--standalone", "--redirects=3", "--tee=1", "--rdzv-id=", "--", "x.py", "--lr", "1"]
        );
        assert_eq!(ok(&["-mt3", "pkg.mod"]), ["--module", "--tee=3", "--", "pkg.mod"]);
        assert_eq!(ok(&["-r=3", "x.py"]), ["--redirects=3", "--", "x.py"]);
        assert_eq!(ok(&["--max-restarts", "-1", "x.py"]), ["--max-restarts=-1", "--", "x.py"]);
        assert_eq!(ok(&["--nnodes", "2"]), ["--nnodes=2"]);
    }

    /// What real torchrun 2.15 (argparse, Python 3.11) gives the script, checked in the venv.
    #[test]
    fn one_double_dash_at_the_script_is_dropped_as_argparse_does() {
        let cases: &[(&[&str], &[&str])] = &[
            (&["x.py", "--", "a"], &["x.py", "a"]),
            (&["x.py", "a", "--", "b"], &["x.py", "a", "--", "b"]),
            (&["x.py", "--", "--", "a"], &["x.py", "--", "a"]),
            (&["-m", "pkg.mod", "--", "--depth=24"], &["pkg.mod", "--depth=24"]),
            (&["-m", "pkg.mod", "--", "--", "x"], &["pkg.mod", "--", "x"]),
            (&["--no-python", "echo", "--", "x"], &["echo", "x"]),
            (&["--", "x.py", "a"], &["x.py", "a"]),
            (&["--", "x.py", "--", "a"], &["x.py", "--", "a"]),
            (&["--", "--standalone", "a"], &["--standalone", "a"]),
            (&["x.py", "--r", "--frobnicate"], &["x.py", "--r", "--frobnicate"]),
        ];
        for (args, script) in cases {
            let out = ok(args);
            let at = out.iter().position(|a| a == "--").expect("a script");
            assert_eq!(&out[at + 1..], *script, "{args:?}");
        }
        assert_eq!(ok(&["--standalone", "--"]), ["--standalone"], "no script: clap reports it");
    }

    #[test]
    fn bad_launcher_arguments_are_named_as_argparse_names_them() {
        let e = |args: &[&str]| norm(args).unwrap_err().to_string();
        assert!(e(&["--frobnicate", "x.py"]).starts_with("unrecognized arguments: --frobnicate;"));
        assert!(e(&["--frobnicate=3", "--bogus", "3", "x.py"]).starts_with("unrecognized arguments: --frobnicate=3 --bogus;"));
        assert!(e(&["-x", "x.py"]).starts_with("unrecognized arguments: -x;"));
        let r = e(&["--r", "x.py"]);
        assert!(
            r.starts_with("ambiguous option: --r could match --rdzv-backend, --rdzv_backend, --rdzv-endpoint")
                && r.ends_with("--role, --run-path, --run_path, --redirects"),
            "{r}"
        );
        assert_eq!(e(&["--nproc=2", "x.py"]), "ambiguous option: --nproc=2 could match --nproc-per-node, --nproc_per_node");
        assert_eq!(e(&["--rdzv-id", "--standalone", "x.py"]), "argument --rdzv-id/--rdzv_id: expected one argument");
        assert_eq!(e(&["--rdzv-id", "--", "x.py"]), "argument --rdzv-id/--rdzv_id: expected one argument");
        assert_eq!(e(&["-r"]), "argument -r/--redirects: expected one argument");
        assert_eq!(e(&["--standalone=1", "x.py"]), "argument --standalone: ignored explicit argument '1'");
        assert_eq!(e(&["-mz", "x.py"]), "argument -m/--module: ignored explicit argument 'z'");
    }

    #[test]
    fn negative_numbers_and_spaces_are_values() {
        for n in ["-1", "-0.5", "-.5", "-10"] {
            assert!(is_negative_number(n), "{n}");
        }
        for n in ["-", "-1.", "-a", "--1", "-1e3"] {
            assert!(!is_negative_number(n), "{n}");
        }
        assert_eq!(ok(&["-a b", "c"]), ["--", "-a b", "c"]);
    }
}
