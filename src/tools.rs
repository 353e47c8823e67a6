//! The tool subcommands, `muster NAME ARGS...`: reserved words, never taken as a training script.

/// A tool's entry: its arguments after NAME in, its exit code out.
type Tool = fn(&[String]) -> u8;

const TOOLS: &[(&str, Tool)] = &[
    ("store", crate::store::store_main),
    ("bench", crate::bench::bench_main),
    ("doctor", doctor),
    ("plan", crate::plan::plan_main),
    ("status", crate::status::status_main),
];

/// `muster doctor` logs what the GPU libraries report, at the agent's log level (the other tools set up their
/// own logging or print only).
fn doctor(args: &[String]) -> u8 {
    crate::telemetry::init();
    crate::doctor::doctor_main(args)
}

/// Runs the tool `name` with `args` and returns its exit code; None when `name` is not a tool.
pub fn dispatch(name: &str, args: &[String]) -> Option<u8> {
    TOOLS.iter().find(|(n, _)| *n == name).map(|(_, run)| run(args))
}

#[cfg(test)]
mod tests {
    #[test]
    fn other_words_are_not_tools() {
        assert_eq!(super::dispatch("train.py", &[]), None);
        assert_eq!(super::dispatch("--standalone", &[]), None);
    }
}
