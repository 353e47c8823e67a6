//! Worker logs: `--tee` writes every line to the rank's files and to the console with its prefix, including
//! the last (unterminated) line a worker wrote before it crashed; a console that is behind gets a counted
//! drop notice instead of holding up the worker or its log file.

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;

fn find(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            found.extend(find(&p, name));
        } else if p.file_name().is_some_and(|n| n == name) {
            found.push(p);
        }
    }
    found.sort();
    found
}

#[test]
fn tee_keeps_every_line_including_the_last_before_a_crash() {
    let (dir, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = run(
        muster()
            .args(["--nproc-per-node=2", "--tee", "3", "--log-dir"])
            .arg(logs.path())
            .arg(fixture("worker.py"))
            .arg(dir.path())
            .arg("chatty:200"),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "rank 0 exits 7: {}", out.stderr);
    let stdout_files = find(logs.path(), "stdout.log");
    let stderr_files = find(logs.path(), "stderr.log");
    assert_eq!(stdout_files.len(), 2, "{stdout_files:?}");
    for rank in 0..2u32 {
        let file_out = std::fs::read_to_string(&stdout_files[rank as usize]).unwrap();
        let file_err = std::fs::read_to_string(&stderr_files[rank as usize]).unwrap();
        assert!(stdout_files[rank as usize].ends_with(format!("attempt_0/{rank}/stdout.log")));
        for i in 0..200 {
            assert!(file_out.contains(&format!("out {i} rank {rank}\n")), "rank {rank} line {i} missing in file");
            assert!(file_err.contains(&format!("err {i} rank {rank}\n")));
            assert!(out.stdout.contains(&format!("[default{rank}]:out {i} rank {rank}\n")), "console out {rank}/{i}");
            assert!(out.stderr.contains(&format!("[default{rank}]:err {i} rank {rank}\n")), "console err {rank}/{i}");
        }
        assert!(file_out.ends_with(&format!("last words rank {rank}")), "file tail: {file_out:?}");
        assert!(out.stdout.contains(&format!("[default{rank}]:last words rank {rank}\n")), "console tail");
    }
    assert!(!out.stdout.contains("[muster] dropped") && !out.stderr.contains("[muster] dropped"), "no drops");
}

#[test]
fn a_restart_never_wipes_an_attempt_directory_and_filters_apply() {
    let (dir, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = run(
        muster()
            .args(["--nproc-per-node=1", "--max-restarts=1", "--tee=1", "--local-ranks-filter=0"])
            .args(["--duplicate-stdout-filters", "out 1 ,,x,out 3 "])
            .args(["--log-line-prefix-template", "<$role_name-$rank@$local_rank>"])
            .arg("--log-dir")
            .arg(logs.path())
            .arg(fixture("worker.py"))
            .arg(dir.path())
            .arg("chatty:5"),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let files = find(logs.path(), "stdout.log");
    assert_eq!(files.len(), 2, "one per attempt, none wiped: {files:?}");
    assert!(files[0].ends_with("attempt_0/0/stdout.log") && files[1].ends_with("attempt_1/0/stdout.log"));
    assert!(out.stdout.contains("<default-0@0>out 4 rank 0\n"), "{}", out.stdout);
    let filtered = find(logs.path(), "filtered_stdout.log");
    assert_eq!(filtered.len(), 2);
    let f = std::fs::read_to_string(&filtered[0]).unwrap();
    assert_eq!(f, "<default-0@0>out 3 rank 0\n", "only lines with a filter substring");
}

/// Lines `tests/fixtures/flood.py` writes to stdout for `kib`: the numbered ones and its end line.
fn flood_lines(kib: u64) -> u64 {
    kib * 1024 / 100 + 1
}

/// Walks rank 0's console stdout from a flood: every numbered line shown comes in order, and each drop
/// notice stands exactly where its lines are missing. Returns the notices' counts.
fn walk_flood_console(stdout: &str, kib: u64) -> Vec<u64> {
    let lines = flood_lines(kib);
    let (mut next, mut notices) = (0u64, Vec::new());
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("[muster] dropped ") {
            let n = rest.strip_suffix(" console lines of rank 0; the log file has them");
            let n: u64 = n.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("notice: {line:?}"));
            assert!(n > 0, "{line:?}");
            notices.push(n);
            next += n;
        } else if let Some(rest) = line.strip_prefix("[default0]:") {
            let shown = if rest.starts_with("flood end") {
                lines - 1
            } else {
                rest.split(' ').nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("line: {line:?}"))
            };
            assert_eq!(shown, next, "console line out of order or lost without a notice: {line:?}");
            next += 1;
        }
    }
    assert_eq!(next, lines, "every line is either shown or counted in a notice");
    notices
}

fn assert_flood_log_is_complete(logs: &Path, kib: u64) {
    let file = find(logs, "stdout.log");
    assert_eq!(file.len(), 1, "{file:?}");
    let content = std::fs::read(&file[0]).unwrap();
    let end = format!("flood end rank 0 lines {}\n", flood_lines(kib) - 1);
    assert_eq!(content.len() as u64, (flood_lines(kib) - 1) * 100 + end.len() as u64, "log file size");
    assert!(content.ends_with(end.as_bytes()), "log file tail");
    let err = std::fs::read_to_string(&find(logs, "stderr.log")[0]).unwrap();
    assert!(err.ends_with("err 9 rank 0\n"), "{err:?}");
}

fn flood(logs: &Path, dir: &Path, kib: u64) -> std::process::Command {
    let mut cmd = muster();
    cmd.args(["--nproc-per-node=1", "--tee", "3", "--log-dir"]).arg(logs).arg(fixture("flood.py")).arg(dir);
    cmd.arg(kib.to_string());
    cmd
}

#[test]
fn a_console_nobody_reads_holds_up_neither_the_worker_nor_its_log_file() {
    let (dir, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let kib = 50 * 1024;
    let mut cmd = flood(logs.path(), dir.path(), kib);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut agent = Guard::spawn(&mut cmd);
    // Nothing reads the agent's stdout or stderr yet: if the console were in the file's way, the worker would
    // block on its pipe after a few hundred KiB and never get here.
    let flooded = wait_for_lines(&dir.path().join("0.flooded"), 1, Duration::from_secs(300));
    let pid: i32 = flooded.split_whitespace().next().and_then(|p| p.parse().ok()).expect("pid in 0.flooded");
    assert!(eventually(Duration::from_secs(60), || !alive(pid)), "the worker exits while its console is unread");
    let (mut out, mut err) = (agent.0.stdout.take().unwrap(), agent.0.stderr.take().unwrap());
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    let stderr = stderr.join().unwrap();
    let status = agent.wait_timeout(Duration::from_secs(60)).expect("muster exits once its console is read");
    assert!(status.success(), "{status:?}: {stderr}");
    assert_flood_log_is_complete(logs.path(), kib);
    let notices = walk_flood_console(&stdout, kib);
    assert!(!notices.is_empty(), "a console that fell behind gets a drop notice");
    for i in 0..10 {
        assert!(stderr.contains(&format!("[default0]:err {i} rank 0\n")), "stderr line {i}: {stderr}");
    }
}

#[test]
fn a_console_that_keeps_up_gets_every_line_and_no_notice() {
    let (dir, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Within the console's buffer (4 MiB), however the test's reader is scheduled.
    let kib = 512;
    let out = run(&mut flood(logs.path(), dir.path(), kib), Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);
    assert_flood_log_is_complete(logs.path(), kib);
    assert_eq!(walk_flood_console(&out.stdout, kib), Vec::<u64>::new(), "no drops");
    assert!(!out.stderr.contains("[muster] dropped"), "{}", out.stderr);
}
