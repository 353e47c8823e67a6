//! The command line against random argv: real option strings, their prefixes, `=` and separate values, `--`,
//! script names and junk. Nothing panics, and every rejection is one line (main.rs prints it and exits 2);
//! `MUSTER_FUZZ_CASES=200000 cargo test --release --lib cli::fuzz` runs longer.

use clap::CommandFactory;

use crate::cli::{one_line, parse, Cli};
use crate::config::{Host, LaunchConfig};
use crate::store::tcp::frame::tests::{fuzz_cases, Rng};

/// Values that reach every kind of check, including the ones that echo the value back.
const VALUES: &[&str] = &[
    "0", "1", "2", "-1", "-0.5", "3:2", "1:4", "65536", "99999999999", "0x10", "gpu", "cpu", "auto", "", " ", "a b",
    "x=y", "join_timeout=5,is_host=1", "is_host=maybe", "=", ",", "SIGTERM,USR1", "SIGKILL", "0:1,1:3", "7",
    "[::1]:31005", "[::1:31005", "host:", ":", "localhost:29400", "static", "c10d", "etcd", "tcp", "drain",
    "13=ignore,79=drain", "79=x", "torch,os;rm", "torch.distributed", "bash", "zsh", "node", "exclusive", "é",
    "line\nbreak", "tab\there", "\u{7f}", "--", "-", "-x",
];

/// Scripts: a real executable, a missing file, a Python file and a bare program name.
const SCRIPTS: &[&str] = &["/bin/true", "/nonexistent/train.py", "train.py", "true", "-m", "pkg.mod"];

/// The `--log-dir` values the configuration is checked with (it creates the directory).
fn log_dirs(tmp: &std::path::Path) -> [String; 3] {
    [tmp.display().to_string(), "/dev/null".into(), String::new()]
}

/// Every option string of the real command line (`-r`, `--redirects`, `--nproc_per_node`, ...).
fn option_strings() -> Vec<String> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    for a in cmd.get_arguments() {
        out.extend(a.get_short().map(|s| format!("-{s}")));
        out.extend(a.get_long().map(|l| format!("--{l}")));
        out.extend(a.get_all_aliases().unwrap_or_default().into_iter().map(|x| format!("--{x}")));
    }
    out
}

fn pick<'a, T: ?Sized>(rng: &mut Rng, items: &'a [&'a T]) -> &'a T {
    items[rng.below(items.len() as u64) as usize]
}

/// One random argv (without the program name).
fn random_argv(rng: &mut Rng, options: &[String], log_dirs: &[String; 3]) -> Vec<String> {
    let mut argv = Vec::new();
    for _ in 0..rng.below(10) {
        let option = &options[rng.below(options.len() as u64) as usize];
        let value = if option.replace('_', "-") == "--log-dir" {
            log_dirs[rng.below(3) as usize].clone()
        } else {
            pick(rng, VALUES).to_string()
        };
        match rng.below(9) {
            0 | 1 => argv.push(option.clone()),
            2 | 3 => argv.extend([option.clone(), value]),
            4 => argv.push(format!("{option}={value}")),
            5 => {
                // A prefix of at least two characters: unique, ambiguous, or a short option with its value.
                let cut = 2 + rng.below(option.len().saturating_sub(1) as u64) as usize;
                let prefix: String = option.chars().take(cut).collect();
                argv.push(prefix);
            }
            6 => argv.push(pick(rng, SCRIPTS).to_string()),
            7 => argv.push("--".into()),
            _ => argv.push(junk(rng)),
        }
    }
    argv
}

/// A few random characters, `-` and `=` more often than chance would have them.
fn junk(rng: &mut Rng) -> String {
    (0..rng.below(6))
        .map(|_| match rng.below(4) {
            0 => '-',
            1 => '=',
            _ => char::from_u32(rng.below(0x800) as u32).unwrap_or('?'),
        })
        .collect()
}

#[test]
fn random_argv_never_panics_and_every_rejection_is_one_line() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let log_dirs = log_dirs(tmp.path());
    let options = option_strings();
    let mut rng = Rng::new(0xc11);
    let (mut rejected, mut accepted) = (0u64, 0u64);
    for _ in 0..fuzz_cases(1_500) {
        let argv = random_argv(&mut rng, &options, &log_dirs);
        let gpus = rng.below(3);
        let cli = match parse(&std::iter::once("muster".to_string()).chain(argv.iter().cloned()).collect::<Vec<_>>()) {
            Ok(cli) => cli,
            Err(e) if !e.use_stderr() => continue, // --help or --version: printed, exit 0
            Err(e) => {
                let line = one_line(&e);
                assert!(!line.is_empty() && !line.contains('\n'), "{argv:?}: {line:?}");
                rejected += 1;
                continue;
            }
        };
        if cli.print_completion.is_some() {
            continue;
        }
        // The configuration creates the log directory: only ever the test's own.
        if cli.log_dir.as_ref().is_some_and(|d| !log_dirs.contains(d)) {
            continue;
        }
        let path = std::env::var("PATH").ok();
        let env = |k: &str| (k == "PATH").then(|| path.clone()).flatten();
        let gpu_count = || match gpus {
            0 => Err("no driver".to_string()),
            n => Ok(n as u32 - 1),
        };
        let host = Host { env: &env, gpu_count: &gpu_count, cpu_count: 2, fqdn: &|| "node0".into() };
        match LaunchConfig::from_cli(&cli, &host) {
            Ok(_) => accepted += 1,
            Err(e) => {
                let line = e.to_string();
                assert!(!line.is_empty() && !line.contains('\n'), "{argv:?}: {line:?}");
                rejected += 1;
            }
        }
    }
    assert!(rejected > 0 && accepted > 0, "the generator reaches both ends: {rejected} rejected, {accepted} accepted");
}
