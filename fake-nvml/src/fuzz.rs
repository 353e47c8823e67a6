//! The configuration (JSON) and the events-file lines against random and mutated input: a test's typo
//! must come back as an error, never as a panic inside a process that loaded the fake library.
//! `MUSTER_FUZZ_CASES=100000 cargo test --release -p fake-nvml --lib fuzz` runs longer.

use std::path::Path;

use serde_json::{json, Value};

use crate::config::{Model, MAX_GPUS, MAX_LINKS};
use crate::incident;

/// SplitMix64, as muster's own fuzz tests use (this crate cannot share their test code).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a, T: ?Sized>(&mut self, items: &'a [&'a T]) -> &'a T {
        items[self.below(items.len() as u64) as usize]
    }
}

fn fuzz_cases(default: u64) -> u64 {
    std::env::var("MUSTER_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const SEEDS: &[&str] = &[
    include_str!("../../tests/fixtures/gpu/hgx-h100.json"),
    include_str!("../../tests/fixtures/gpu/pcie-8gpu.json"),
];

/// A JSON value of any kind, the strings taken from the config's own vocabulary.
fn random_value(rng: &mut Rng, depth: u32) -> Value {
    const WORDS: &[&str] =
        &["X", "NV18", "NV19", "NV0", "PIX", "SYS", "0x10", "0xzz", "xid", "hopper", "driver_not_loaded", "00000000:18:00.0", "", "é"];
    match rng.below(if depth > 2 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!(rng.next() >> rng.below(64)),
        3 => json!(-(rng.below(1000) as i64)),
        4 => json!(rng.pick(WORDS)),
        5 => Value::Array((0..rng.below(4)).map(|_| random_value(rng, depth + 1)).collect()),
        _ => Value::Object((0..rng.below(3)).map(|i| (format!("k{i}"), random_value(rng, depth + 1))).collect()),
    }
}

/// One structural edit somewhere in `v`: a value replaced, a key removed or added, an array shortened
/// or an element duplicated.
fn mutate(rng: &mut Rng, v: &mut Value) {
    match v {
        Value::Object(map) if !map.is_empty() && rng.below(4) != 0 => {
            let key = map.keys().nth(rng.below(map.len() as u64) as usize).cloned().unwrap_or_default();
            match rng.below(6) {
                0 => drop(map.remove(&key)),
                1 => drop(map.insert(key, random_value(rng, 0))),
                2 => drop(map.insert("typo".into(), json!(1))),
                _ => map.get_mut(&key).into_iter().for_each(|child| mutate(rng, child)),
            }
        }
        Value::Array(items) if !items.is_empty() && rng.below(4) != 0 => {
            let at = rng.below(items.len() as u64) as usize;
            match rng.below(5) {
                0 => drop(items.remove(at)),
                1 => {
                    let copy = items[at].clone();
                    items.push(copy);
                }
                _ => mutate(rng, &mut items[at]),
            }
        }
        other => *other = random_value(rng, 0),
    }
}

#[test]
fn mutated_configs_are_refused_or_modelled_never_a_panic() {
    let seeds: Vec<Value> = SEEDS.iter().map(|s| serde_json::from_str(s).expect("fixture is JSON")).collect();
    let mut rng = Rng(0xc0f);
    let mut accepted = 0;
    for _ in 0..fuzz_cases(2_000) {
        let mut config = seeds[rng.below(seeds.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut config);
        }
        let mut text = config.to_string();
        if rng.below(8) == 0 && !text.is_empty() {
            // Byte-level damage too: a truncated or garbled file.
            let at = rng.below(text.len() as u64) as usize;
            text = String::from_utf8_lossy(&text.as_bytes()[..at]).into_owned();
        }
        if let Ok(model) = Model::parse(&text, Path::new("/fixtures")) {
            accepted += 1;
            let n = model.gpus.len();
            assert!(n <= MAX_GPUS);
            assert!(model.cells.len() == n && model.cells.iter().all(|r| r.len() == n));
            assert!(model.levels.len() == n && model.levels.iter().all(|r| r.len() == n));
            for g in &model.gpus {
                assert!(g.links.as_ref().is_none_or(|l| l.len() <= MAX_LINKS as usize), "{text}");
            }
        }
    }
    assert!(accepted > 0, "the mutations leave some configs valid");
}

#[test]
fn random_event_lines_are_parsed_or_refused_never_a_panic() {
    const WORDS: &[&str] = &[
        "xid", "dbe", "sbe", "lost", "process", "noprocess", "recovery", "remap", "pending", "failure", "clear", "#",
        "0", "1", "7", "79", "-1", "18446744073709551616", "4294967296", "kill=-30", "kill=+5", "kill=", "kill=--1",
        "companion=48@20,63", "companion=@", "companion=,", "remap=pending", "remap=clear", "stall=100", "stall=x",
        "=", "==", "a=b=c", "é",
    ];
    let mut rng = Rng(0x1e7);
    for _ in 0..fuzz_cases(50_000) {
        let mut line: Vec<&str> = (0..rng.below(7)).map(|_| rng.pick(WORDS)).collect();
        if rng.below(2) == 0 {
            line.insert(0, rng.pick(&["xid", "dbe", "lost", "process", "recovery", "remap"][..]));
        }
        let sep = rng.pick(&[" ", "\t", "  "][..]);
        let gpus = rng.below(4) as usize;
        if let Ok(Some(parsed)) = incident::parse(&line.join(sep), gpus) {
            assert!(parsed.gpu < gpus, "{line:?}");
        }
    }
}
