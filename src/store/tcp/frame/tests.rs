//! Test vectors from `docs/tcpstore-protocol.md`, "Test vectors" (captured from torch 2.15.0, identical
//! for the libuv and legacy servers), plus decoder robustness against random input.

use super::*;

const MAX: usize = 64 << 20;

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("test vector is hex"))
        .collect()
}

/// Decodes `wire` whole and byte by byte, and re-encodes the request.
fn assert_request(wire: &str, expected: Request<'_>) {
    let wire = hex(wire);
    let (request, n) = RequestDecoder::new(MAX).decode(&wire).unwrap().unwrap();
    assert_eq!(request, expected);
    assert_eq!(n, wire.len());
    let mut out = Vec::new();
    expected.encode(&mut out);
    assert_eq!(out, wire, "encoding of {expected:?}");
    let mut decoder = RequestDecoder::new(MAX);
    for end in 0..wire.len() {
        assert_eq!(
            decoder.decode(&wire[..end]),
            Ok(None),
            "prefix of {end} bytes"
        );
    }
    assert_eq!(decoder.decode(&wire).unwrap().unwrap().0, expected);
}

fn assert_reply(shape: ReplyShape, wire: &str, expected: Reply<'_>) {
    let wire = hex(wire);
    let mut decoder = ReplyDecoder::new(shape, MAX);
    for end in 0..wire.len() {
        assert_eq!(
            decoder.decode(&wire[..end]),
            Ok(None),
            "prefix of {end} bytes"
        );
    }
    let (reply, n) = decoder.decode(&wire).unwrap().unwrap();
    assert_eq!(reply, expected);
    assert_eq!(n, wire.len());
    let mut out = Vec::new();
    expected.encode(&mut out);
    assert_eq!(out, wire, "encoding of {expected:?}");
}

#[test]
fn handshake() {
    assert_request(
        "00 ce f7 85 3c",
        Request::Validate {
            magic: VALIDATE_MAGIC,
        },
    );
    assert_request("0d ce 76 00 00", Request::Ping { nonce: 0x76ce });
    assert_reply(ReplyShape::Nonce, "ce 76 00 00", Reply::Nonce(0x76ce));
}

#[test]
fn set_get_add() {
    assert_request(
        "04 05 00 00 00 00 00 00 00 69 6e 69 74 2f 01 00 00 00 00 00 00 00",
        Request::Add {
            key: b"init/",
            delta: 1,
        },
    );
    assert_reply(ReplyShape::Int, "01 00 00 00 00 00 00 00", Reply::Int(1));
    assert_request(
        "01 02 00 00 00 00 00 00 00 2f 6b 02 00 00 00 00 00 00 00 76 31",
        Request::Set {
            key: b"/k",
            value: b"v1",
        },
    );
    assert_request(
        "06 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 6b",
        Request::Wait { keys: vec![b"/k"] },
    );
    assert_reply(ReplyShape::Byte, "00", Reply::Byte(STOP_WAITING));
    assert_request(
        "03 02 00 00 00 00 00 00 00 2f 6b",
        Request::Get { key: b"/k" },
    );
    assert_reply(
        ReplyShape::Value,
        "02 00 00 00 00 00 00 00 76 31",
        Reply::Value(b"v1"),
    );
    assert_request(
        "04 04 00 00 00 00 00 00 00 2f 63 6e 74 05 00 00 00 00 00 00 00",
        Request::Add {
            key: b"/cnt",
            delta: 5,
        },
    );
    assert_reply(ReplyShape::Int, "05 00 00 00 00 00 00 00", Reply::Int(5));
    assert_request(
        "04 04 00 00 00 00 00 00 00 2f 63 6e 74 fe ff ff ff ff ff ff ff",
        Request::Add {
            key: b"/cnt",
            delta: -2,
        },
    );
    assert_reply(ReplyShape::Int, "03 00 00 00 00 00 00 00", Reply::Int(3));
    assert_request(
        "03 04 00 00 00 00 00 00 00 2f 63 6e 74",
        Request::Get { key: b"/cnt" },
    );
    assert_reply(
        ReplyShape::Value,
        "01 00 00 00 00 00 00 00 33",
        Reply::Value(b"3"),
    );
}

#[test]
fn compare_set() {
    assert_request(
        "02 02 00 00 00 00 00 00 00 2f 6b 02 00 00 00 00 00 00 00 76 31 02 00 00 00 00 00 00 00 76 32",
        Request::CompareSet { key: b"/k", expected: b"v1", desired: b"v2" },
    );
    assert_reply(
        ReplyShape::Value,
        "02 00 00 00 00 00 00 00 76 32",
        Reply::Value(b"v2"),
    );
    assert_request(
        "02 02 00 00 00 00 00 00 00 2f 6b 02 00 00 00 00 00 00 00 7a 7a 02 00 00 00 00 00 00 00 76 33",
        Request::CompareSet { key: b"/k", expected: b"zz", desired: b"v3" },
    );
    assert_request(
        "02 04 00 00 00 00 00 00 00 2f 6e 65 77 00 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 6e 31",
        Request::CompareSet { key: b"/new", expected: b"", desired: b"n1" },
    );
    assert_reply(
        ReplyShape::Value,
        "02 00 00 00 00 00 00 00 6e 31",
        Reply::Value(b"n1"),
    );
    assert_request(
        "02 09 00 00 00 00 00 00 00 2f 6d 69 73 73 69 6e 67 32 01 00 00 00 00 00 00 00 78 01 00 00 00 00 00 00 00 79",
        Request::CompareSet { key: b"/missing2", expected: b"x", desired: b"y" },
    );
    assert_reply(
        ReplyShape::Value,
        "01 00 00 00 00 00 00 00 78",
        Reply::Value(b"x"),
    );
}

#[test]
fn check_wait_cancel() {
    assert_request(
        "05 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 6b",
        Request::Check { keys: vec![b"/k"] },
    );
    assert_reply(ReplyShape::Byte, "00", Reply::Byte(CHECK_READY));
    assert_request(
        "05 02 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 6b 05 00 00 00 00 00 00 00 2f 6e 6f 70 65",
        Request::Check { keys: vec![b"/k", b"/nope"] },
    );
    assert_reply(ReplyShape::Byte, "01", Reply::Byte(CHECK_NOT_READY));
    assert_request(
        "06 01 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 2f 6e 6f 70 65",
        Request::Wait {
            keys: vec![b"/nope"],
        },
    );
    assert_request("0c", Request::CancelWait);
    assert_reply(ReplyShape::Byte, "01", Reply::Byte(WAIT_CANCELED));
}

#[test]
fn num_keys_delete_append() {
    assert_request("07", Request::GetNumKeys);
    assert_reply(ReplyShape::Int, "03 00 00 00 00 00 00 00", Reply::Int(3));
    assert_request(
        "08 02 00 00 00 00 00 00 00 2f 6b",
        Request::DeleteKey { key: b"/k" },
    );
    assert_reply(ReplyShape::Int, "01 00 00 00 00 00 00 00", Reply::Int(1));
    assert_reply(ReplyShape::Int, "00 00 00 00 00 00 00 00", Reply::Int(0));
    assert_request(
        "09 03 00 00 00 00 00 00 00 2f 61 70 02 00 00 00 00 00 00 00 61 62",
        Request::Append {
            key: b"/ap",
            value: b"ab",
        },
    );
}

#[test]
fn multi_get_multi_set_list_keys() {
    assert_request(
        "06 02 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 2f 61 70 04 00 00 00 00 00 00 00 2f 63 6e 74",
        Request::Wait { keys: vec![b"/ap", b"/cnt"] },
    );
    assert_request(
        "0a 02 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 2f 61 70 04 00 00 00 00 00 00 00 2f 63 6e 74",
        Request::MultiGet { keys: vec![b"/ap", b"/cnt"] },
    );
    assert_reply(
        ReplyShape::Values(2),
        "04 00 00 00 00 00 00 00 61 62 63 64 01 00 00 00 00 00 00 00 33",
        Reply::Values(vec![b"abcd", b"3"]),
    );
    assert_request(
        "0b 02 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 2f 6d 31 01 00 00 00 00 00 00 00 78 03 00 00 00 00 00 00 00 2f 6d 32 02 00 00 00 00 00 00 00 79 79",
        Request::MultiSet { pairs: vec![(b"/m1", b"x"), (b"/m2", b"yy")] },
    );
    assert_request("11", Request::ListKeys);
    assert_reply(
        ReplyShape::Keys,
        "05 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 2f 6d 32 03 00 00 00 00 00 00 00 2f 6d 31 03 00 00 00 00 00 00 00 2f 61 70 04 00 00 00 00 00 00 00 2f 6e 65 77 04 00 00 00 00 00 00 00 2f 63 6e 74",
        Reply::Keys(vec![b"/m2", b"/m1", b"/ap", b"/new", b"/cnt"]),
    );
}

#[test]
fn queues_and_barrier() {
    assert_request(
        "0e 02 00 00 00 00 00 00 00 2f 71 05 00 00 00 00 00 00 00 69 74 65 6d 31",
        Request::QueuePush {
            key: b"/q",
            value: b"item1",
        },
    );
    assert_request(
        "10 02 00 00 00 00 00 00 00 2f 71",
        Request::QueueLen { key: b"/q" },
    );
    assert_reply(ReplyShape::Int, "01 00 00 00 00 00 00 00", Reply::Int(1));
    assert_request(
        "0f 02 00 00 00 00 00 00 00 2f 71",
        Request::QueuePop { key: b"/q" },
    );
    assert_reply(
        ReplyShape::QueueItem,
        "01 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 69 74 65 6d 31",
        Reply::QueueItem {
            len_before: 1,
            value: Some(b"item1"),
        },
    );
    assert_reply(
        ReplyShape::QueueItem,
        "00 00 00 00 00 00 00 00",
        Reply::QueueItem {
            len_before: 0,
            value: None,
        },
    );
    assert_request(
        "12 04 00 00 00 00 00 00 00 2f 62 61 72 01 00 00 00 00 00 00 00",
        Request::Barrier {
            key: b"/bar",
            world_size: 1,
        },
    );
}

#[test]
fn extensions() {
    assert_request(
        "f0 02 00 00 00 00 00 00 00 2f 61 01 00 00 00 00 00 00 00 31",
        Request::SetSession {
            key: b"/a",
            value: b"1",
        },
    );
    assert_request(
        "f1 01 03 00 00 00 00 00 00 00 2f 72 2f",
        Request::Watch {
            mode: WatchMode::Prefix,
            pattern: b"/r/",
        },
    );
    assert_reply(
        ReplyShape::Event,
        "02 03 00 00 00 00 00 00 00 2f 72 2f",
        Reply::Event {
            kind: EventKind::Deleted,
            key: b"/r/",
        },
    );
    assert_eq!(
        RequestDecoder::new(MAX).decode(&hex("f1 02 00 00 00 00 00 00 00 00")),
        Err(FrameError::Malformed("unknown WATCH mode"))
    );
    assert_request(
        "f2 01 00 00 00 03 00 00 00 00 00 00 00 61 62 63",
        Request::Hello {
            version: 1,
            token: b"abc",
        },
    );
    assert_request(
        "f3 00 02 00 00 00 00 00 00 00 2f 6b",
        Request::Unwatch {
            mode: WatchMode::Key,
            pattern: b"/k",
        },
    );
}

#[test]
fn empty_lists() {
    assert_request(
        "05 00 00 00 00 00 00 00 00",
        Request::Check { keys: vec![] },
    );
    assert_request("06 00 00 00 00 00 00 00 00", Request::Wait { keys: vec![] });
    assert_reply(ReplyShape::Values(0), "", Reply::Values(vec![]));
}

#[test]
fn pipelined_requests_decode_one_at_a_time() {
    let wire = hex("07 0c 11");
    let mut decoder = RequestDecoder::new(MAX);
    let mut at = 0;
    let mut seen = Vec::new();
    while let Some((request, n)) = decoder.decode(&wire[at..]).unwrap() {
        seen.push(request.query());
        at += n;
    }
    assert_eq!(
        seen,
        [Query::GetNumKeys, Query::CancelWait, Query::ListKeys]
    );
}

#[test]
fn unknown_query_is_refused() {
    assert_eq!(
        RequestDecoder::new(MAX).decode(&[0x7f]),
        Err(FrameError::UnknownQuery(0x7f))
    );
    assert_eq!(
        RequestDecoder::new(MAX).decode(&[0x13]),
        Err(FrameError::UnknownQuery(0x13))
    );
}

#[test]
fn lengths_over_the_limit_are_refused_before_the_bytes_arrive() {
    // SET with a declared 1 TiB key: refused from the 9-byte header alone.
    let huge = hex("01 00 00 00 00 00 01 00 00");
    assert_eq!(
        RequestDecoder::new(MAX).decode(&huge),
        Err(FrameError::TooLarge { limit: MAX })
    );
    // WAIT declaring u64::MAX keys: refused without allocating.
    let many = hex("06 ff ff ff ff ff ff ff ff");
    assert_eq!(
        RequestDecoder::new(MAX).decode(&many),
        Err(FrameError::TooLarge { limit: MAX })
    );
    // MULTI_SET whose pair count overflows when doubled.
    let pairs = hex("0b 00 00 00 00 00 00 00 80");
    assert!(RequestDecoder::new(MAX).decode(&pairs).is_err());
    // A frame exactly at the limit passes, one byte more does not.
    let mut set = Vec::new();
    Request::Set {
        key: b"k",
        value: &[7; 100],
    }
    .encode(&mut set);
    assert!(RequestDecoder::new(set.len())
        .decode(&set)
        .unwrap()
        .is_some());
    assert_eq!(
        RequestDecoder::new(set.len() - 1).decode(&set),
        Err(FrameError::TooLarge {
            limit: set.len() - 1
        })
    );
    let reply = hex("ff ff ff ff ff ff ff 7f");
    assert!(ReplyDecoder::new(ReplyShape::Keys, MAX)
        .decode(&reply)
        .is_err());
    assert!(ReplyDecoder::new(ReplyShape::Values(u64::MAX), MAX)
        .decode(&[])
        .is_err());
}

/// Small deterministic generator (SplitMix64), so the fuzz cases are reproducible.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A random frame that is mostly well formed: a valid or nearby query byte, then fields with
/// lengths that are sometimes right, sometimes huge, sometimes off by a little.
pub(crate) fn random_frame(rng: &mut Rng) -> Vec<u8> {
    const QUERIES: [u8; 25] = [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 0xf0, 0xf1, 0xf2, 0xf3,
        0x13, 0xff,
    ];
    let mut out = vec![QUERIES[rng.below(QUERIES.len() as u64) as usize]];
    for _ in 0..rng.below(6) {
        match rng.below(5) {
            0 => out.push(rng.next() as u8),
            1 => out.extend_from_slice(&rng.next().to_le_bytes()),
            2 => out.extend_from_slice(&rng.below(4).to_le_bytes()),
            _ => {
                let len = rng.below(12);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend((0..len).map(|_| rng.next() as u8));
            }
        }
    }
    out
}

/// Number of random cases; `MUSTER_FUZZ_CASES=1000000 cargo test --lib store` runs longer.
pub(crate) fn fuzz_cases(default: u64) -> u64 {
    std::env::var("MUSTER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_input_never_panics_and_splitting_changes_nothing() {
    let mut rng = Rng::new(0x5eed);
    for _ in 0..fuzz_cases(20_000) {
        let frame = random_frame(&mut rng);
        let max = if rng.below(2) == 0 { 64 } else { MAX };
        let whole = RequestDecoder::new(max).decode(&frame);
        // Feeding the same bytes in random pieces must give the same answer.
        let mut decoder = RequestDecoder::new(max);
        let mut end = 0;
        let split = loop {
            end = (end + 1 + rng.below(4) as usize).min(frame.len());
            let result = decoder.decode(&frame[..end]);
            if end == frame.len() || !matches!(result, Ok(None)) {
                break result;
            }
        };
        assert_eq!(whole, split, "frame {frame:02x?}");
        if let Ok(Some((request, n))) = whole {
            let mut again = Vec::new();
            request.encode(&mut again);
            assert_eq!(again, frame[..n], "re-encoding {request:?}");
        }
        for shape in [
            ReplyShape::Byte,
            ReplyShape::Value,
            ReplyShape::Values(rng.below(3)),
            ReplyShape::QueueItem,
            ReplyShape::Keys,
            ReplyShape::Event,
        ] {
            let _ = ReplyDecoder::new(shape, max).decode(&frame);
        }
    }
}
