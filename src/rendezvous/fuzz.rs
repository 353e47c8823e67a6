//! The stored records (`wire.rs`) against random and mutated bytes: anyone who can write to the store can
//! write them. Decoding never panics, and whatever decodes re-encodes to a record that decodes the same;
//! `MUSTER_FUZZ_CASES=2000000 cargo test --release --lib rendezvous::fuzz` runs longer.

use super::wire::{parse_round, Fingerprint, Record, RoundInfo, Seal};
use super::NodeInfo;
use crate::store::tcp::frame::tests::{fuzz_cases, Rng};

/// A node as agents write it (addresses and ids carry no whitespace), with odd but legal characters.
fn node(rng: &mut Rng) -> NodeInfo {
    const PARTS: &[&str] = &["node", "10.0.0.7", "[::1]", "fe80::1%eth0", "h_1", "é", "-", "0", "x.y-z"];
    let mut word = || (0..1 + rng.below(3)).map(|_| PARTS[rng.below(PARTS.len() as u64) as usize]).collect::<String>();
    let addr = word();
    let id = format!("{addr}_{}_{}", word(), rng.below(4));
    NodeInfo { id, addr, nproc: rng.next() as u32 }
}

fn round_info(rng: &mut Rng) -> RoundInfo {
    RoundInfo {
        round: 0,
        group_rank: rng.next() as u32,
        group_world_size: rng.next() as u32,
        base_global_rank: rng.next() as u32,
        world_size: rng.next() as u32,
        neighbours: (0..rng.below(3)).map(|_| node(rng)).collect(),
    }
}

/// `bytes` with a few random edits: flipped, inserted, deleted or duplicated bytes, or a bit of
/// whitespace, which the line formats care about most.
fn mutate(rng: &mut Rng, mut bytes: Vec<u8>) -> Vec<u8> {
    const SPECIAL: &[u8] = b" \n\r\t/:-+0{}\"[],";
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() as u64 + 1) as usize;
        match rng.below(5) {
            0 if at < bytes.len() => bytes[at] ^= 1 << rng.below(8),
            1 => bytes.insert(at, SPECIAL[rng.below(SPECIAL.len() as u64) as usize]),
            2 => bytes.insert(at, rng.next() as u8),
            3 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => {
                let end = (at + rng.below(8) as usize).min(bytes.len());
                let copy = bytes[at..end].to_vec();
                bytes.splice(at..at, copy);
            }
        }
    }
    bytes
}

/// Random bytes, a mutated valid encoding, or a valid encoding.
fn input(rng: &mut Rng, valid: Vec<u8>) -> Vec<u8> {
    match rng.below(4) {
        0 => (0..rng.below(40)).map(|_| rng.next() as u8).collect(),
        1 => valid,
        _ => mutate(rng, valid),
    }
}

#[test]
fn seals_and_assignments_decode_without_panics_and_re_encode_the_same() {
    let mut rng = Rng::new(0x5ea1);
    for _ in 0..fuzz_cases(20_000) {
        let members: Vec<NodeInfo> = (0..rng.below(4)).map(|_| node(&mut rng)).collect();
        let seal = Seal { members: members.clone() };
        assert_eq!(Seal::decode(&seal.encode()).map(|s| s.members).ok(), Some(members), "valid seal");
        let bytes = input(&mut rng, seal.encode());
        if let Ok(decoded) = Seal::decode(&bytes) {
            let again = Seal::decode(&decoded.encode()).map(|s| s.members).ok();
            assert_eq!(again.as_ref(), Some(&decoded.members), "seal {:?}", String::from_utf8_lossy(&bytes));
        }

        let info = round_info(&mut rng);
        assert_eq!(RoundInfo::decode(0, &info.encode()).ok().as_ref(), Some(&info), "valid assignment");
        let bytes = input(&mut rng, info.encode());
        if let Ok(decoded) = RoundInfo::decode(0, &bytes) {
            let again = RoundInfo::decode(0, &decoded.encode()).ok();
            assert_eq!(again.as_ref(), Some(&decoded), "assignment {:?}", String::from_utf8_lossy(&bytes));
        }
    }
}

#[test]
fn json_records_and_the_round_counter_decode_without_panics_and_re_encode_the_same() {
    let mut rng = Rng::new(0x7ec0);
    for _ in 0..fuzz_cases(20_000) {
        let record = Record {
            node: node(&mut rng),
            slot: rng.next() as i64,
            prev_rank: (rng.below(2) == 0).then(|| rng.next() as u32),
            prev_round: (rng.below(2) == 0).then(|| rng.next()),
            pref_rank: (rng.below(2) == 0).then(|| rng.next() as u32),
            restarts: (rng.below(2) == 0).then(|| rng.next() as u32),
            in_place: (rng.below(2) == 0).then(|| rng.next() as u32),
        };
        let valid = serde_json::to_vec(&record).unwrap_or_default();
        if let Ok(decoded) = serde_json::from_slice::<Record>(&input(&mut rng, valid)) {
            let again: Option<Record> = serde_json::to_vec(&decoded).ok().and_then(|b| serde_json::from_slice(&b).ok());
            let same = again.is_some_and(|a| {
                (a.node, a.slot, a.prev_rank, a.prev_round, a.pref_rank, a.restarts)
                    == (decoded.node, decoded.slot, decoded.prev_rank, decoded.prev_round, decoded.pref_rank, decoded.restarts)
            });
            assert!(same, "record");
        }

        let fingerprint = Fingerprint {
            entrypoint: node(&mut rng).id,
            args: (0..rng.below(3)).map(|_| node(&mut rng).addr).collect(),
            nproc_spec: ["1", "gpu", "auto"][rng.below(3) as usize].into(),
            nnodes: format!("{}:{}", rng.below(4), rng.below(4)),
            restart_budget: ["", "2", "10/1h"][rng.below(3) as usize].into(),
            exclude_after: ["", "2/1h"][rng.below(2) as usize].into(),
        };
        let valid = serde_json::to_vec(&fingerprint).unwrap_or_default();
        if let Ok(decoded) = serde_json::from_slice::<Fingerprint>(&input(&mut rng, valid)) {
            let again: Option<Fingerprint> = serde_json::to_vec(&decoded).ok().and_then(|b| serde_json::from_slice(&b).ok());
            assert_eq!(again.as_ref(), Some(&decoded), "fingerprint");
            let _ = decoded.differences(&fingerprint);
        }

        // The counter is written as `R` or `R/expected`.
        let counter = match rng.below(2) {
            0 => rng.next().to_string(),
            _ => format!("{}/{}", rng.next(), rng.next() as u32),
        };
        let (round, expected) = parse_round(&input(&mut rng, counter.into_bytes()));
        let text = match expected {
            Some(e) => format!("{round}/{e}"),
            None => round.to_string(),
        };
        assert_eq!(parse_round(text.as_bytes()), (round, expected), "round counter {text}");
    }
}

#[test]
fn a_field_ending_in_a_carriage_return_survives_a_round_trip() {
    // Found by the long fuzz run: `lines()` took the '\r' of "id\r\n" for part of the line ending.
    let decoded = Seal::decode(b"2 addr id\r").map(|s| s.members).ok();
    let node = NodeInfo { id: "id\r".into(), addr: "addr".into(), nproc: 2 };
    assert_eq!(decoded.as_deref(), Some(&[node.clone()][..]));
    assert_eq!(Seal::decode(&Seal { members: vec![node.clone()] }.encode()).map(|s| s.members).ok(), Some(vec![node]));
}
