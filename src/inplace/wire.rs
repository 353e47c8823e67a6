//! The channel's messages, pure: one JSON object per line, as `muster_inplace/_channel.py` writes and reads
//! them. A worker says `hello` once, `taken` when its main thread takes up a re-formation and `reformed` when
//! it is done, or `lost` when the state cannot be restored in place; the agent sends `reform`, and `noted`
//! once it has recorded a `lost`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a worker says.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FromWorker {
    /// It uses the API and is connected: it can be re-formed in place. `pid` as it says it (the agent
    /// trusts the socket's peer credentials instead).
    Hello { pid: i32, local_rank: u32 },
    /// Its main thread took up the re-formation of `round` (a worker stuck in C code never says so).
    Taken { round: u64 },
    /// It joined the process group of `round` and holds the state of commit `commit`.
    Reformed { round: u64, commit: i64 },
    /// The state cannot be restored in place (a part no survivor holds): no worker of this group may be
    /// kept; the worker exits once the agent says it `noted` this.
    Lost { place: String },
}

/// A re-formation, as the agent hands it to a worker it keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reform {
    pub round: u64,
    /// Every torchrun variable whose value changes from one start of the group to the next.
    pub env: BTreeMap<String, String>,
    /// The addresses of the nodes that left: the worker shuts down its sockets to them.
    pub evicted: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum ToWorker<'a> {
    Reform(&'a Reform),
    Noted {},
}

/// Why a worker's line was not understood.
#[derive(Debug, thiserror::Error)]
#[error("a worker's in-place message is not understood ({0}); it is ignored")]
pub struct BadMessage(String);

pub fn decode(line: &[u8]) -> Result<FromWorker, BadMessage> {
    serde_json::from_slice(line).map_err(|e| BadMessage(e.to_string()))
}

/// The line (newline included) that hands `reform` to a worker.
pub fn encode(reform: &Reform) -> Vec<u8> {
    line(&ToWorker::Reform(reform))
}

/// The line that tells a worker its `lost` was recorded.
pub fn noted() -> Vec<u8> {
    line(&ToWorker::Noted {})
}

fn line(message: &ToWorker<'_>) -> Vec<u8> {
    // Strings and integers always serialise.
    let mut line = serde_json::to_vec(message).unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_the_python_side_writes_and_reads_them() {
        let hello = br#"{"hello": {"pid": 4242, "local_rank": 1}}"#;
        assert_eq!(decode(hello).expect("hello"), FromWorker::Hello { pid: 4242, local_rank: 1 });
        assert_eq!(decode(br#"{"taken": {"round": 7}}"#).expect("taken"), FromWorker::Taken { round: 7 });
        let done = br#"{"reformed": {"round": 7, "commit": -1}}"#;
        assert_eq!(decode(done).expect("reformed"), FromWorker::Reformed { round: 7, commit: -1 });
        let lost = br#"{"lost": {"place": "mesh shard 1 of 4"}}"#;
        assert_eq!(decode(lost).expect("lost"), FromWorker::Lost { place: "mesh shard 1 of 4".into() });
        assert_eq!(noted(), b"{\"noted\":{}}\n");
        for bad in [&b"{}"[..], b"{\"hello\": {}}", b"not json", b"{\"reform\": {\"round\": 1}}"] {
            assert!(decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let reform = Reform {
            round: 3,
            env: BTreeMap::from([("RANK".into(), "2".into()), ("WORLD_SIZE".into(), "4".into())]),
            evicted: vec!["10.0.0.2".into()],
        };
        assert_eq!(
            String::from_utf8(encode(&reform)).expect("utf-8"),
            "{\"reform\":{\"round\":3,\"env\":{\"RANK\":\"2\",\"WORLD_SIZE\":\"4\"},\"evicted\":[\"10.0.0.2\"]}}\n"
        );
    }
}
