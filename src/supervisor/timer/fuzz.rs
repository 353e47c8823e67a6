//! The file timer's FIFO against random writers (anyone on the host may write to it): bytes in random
//! pieces, lines that are requests, nearly requests or junk, far-past and far-future expiry times. Splitting,
//! parsing, the table and the sleep computation never panic; `MUSTER_FUZZ_CASES=1000000 cargo test --release
//! --lib timer::fuzz` runs longer.

use super::*;
use crate::store::tcp::frame::tests::{fuzz_cases, Rng};

const TIMES: &[&str] = &["-1", "0", "1700000000.5", "1e300", "-1e300", "1.7976931348623157e308", "1e400", "NaN", "\"x\""];

fn request_line(rng: &mut Rng) -> Vec<u8> {
    let mut line = format!(
        r#"{{"version": 1, "pid": {}, "scope_id": "s{}", "expiration_time": {}, "signal": {}}}"#,
        rng.below(4) as i64 - 1,
        rng.below(3),
        TIMES[rng.below(TIMES.len() as u64) as usize],
        rng.below(70) as i64 - 3,
    )
    .into_bytes();
    // Nearly a request: a byte dropped or changed.
    if rng.below(3) == 0 && !line.is_empty() {
        let at = rng.below(line.len() as u64) as usize;
        match rng.below(2) {
            0 => line[at] = rng.next() as u8,
            _ => drop(line.remove(at)),
        }
    }
    line
}

#[test]
fn random_fifo_input_never_panics() {
    let mut rng = Rng::new(0x71e);
    for _ in 0..fuzz_cases(3_000) {
        let mut bytes = Vec::new();
        for _ in 0..rng.below(6) {
            match rng.below(5) {
                0 => bytes.extend((0..rng.below(30)).map(|_| rng.next() as u8)),
                1 => bytes.resize(bytes.len() + MAX_LINE + rng.below(3) as usize - 1, b'x'),
                _ => bytes.extend(request_line(&mut rng)),
            }
            if rng.below(4) != 0 {
                bytes.push(b'\n');
            }
        }
        let (mut lines, mut timers) = (Lines::default(), Timers::default());
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (piece, tail) = rest.split_at((1 + rng.below(4096) as usize).min(rest.len()));
            rest = tail;
            for line in lines.push(piece) {
                assert!(line.len() <= MAX_LINE + 1, "a line longer than MAX_LINE is dropped");
                if let Ok(request) = serde_json::from_slice::<TimerRequest>(&line) {
                    timers.register(request);
                }
            }
            let now = [0.0, 1.7e9, f64::MAX][rng.below(3) as usize];
            if let Some(at) = timers.next_expiry() {
                assert!(sleep_until(at, now) <= MAX_SLEEP);
            }
            for reap in timers.take_expired(now) {
                assert!(!reap.scopes.is_empty());
            }
        }
    }
}

#[test]
fn a_far_future_expiry_sleeps_the_longest_sleep() {
    // Found by the fuzz: `Duration::from_secs_f64(1e300)` panicked and took the timer task down.
    assert_eq!(sleep_until(1e300, 1.7e9), MAX_SLEEP);
    assert_eq!(sleep_until(-1e300, 1.7e9), Duration::ZERO);
}
