//! Worker logs: `--tee` writes every line to the rank's files and to the console with its prefix, including
//! the last (unterminated) line a worker wrote before it crashed.

mod common;

use std::path::{Path, PathBuf};
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
