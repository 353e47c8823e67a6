//! The tool subcommands, `muster NAME ARGS...`: reserved words, never taken as a training script.
//!
//! Each tool returns `Result<u8, ToolError>`: its exit code (from `crate::exit`) or what went wrong; one
//! printer here writes the line, so every tool's failure reads `muster NAME: ...` and exits with its code.

pub mod bench;
pub mod doctor;
pub mod plan;
pub mod status;
pub mod store;

pub use crate::runtime::Threads;

/// How a tool failed, with the code it exits with.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Bad input, nothing done: `muster NAME: error: MSG`, exit 2.
    #[error("error: {0}")]
    Usage(String),
    /// The tool ran and could not do its job: `muster NAME: MSG`, exit 1.
    #[error("{0}")]
    Failed(String),
    /// A failure with a code of its own (`muster status`: 3 when the store is unreachable):
    /// `muster NAME: error: MSG`.
    #[error("error: {message}")]
    Coded { code: u8, message: String },
    /// clap answered the command line itself, in its own words (`--help`: 0; a bad flag: 2).
    #[error("the command line was answered")]
    Answered(u8),
}

impl ToolError {
    pub fn code(&self) -> u8 {
        match self {
            ToolError::Usage(_) => crate::exit::USAGE,
            ToolError::Failed(_) => crate::exit::FAILED,
            ToolError::Coded { code, .. } | ToolError::Answered(code) => *code,
        }
    }

    /// The async runtime could not start (threads, descriptors): the same line for every tool.
    fn runtime(e: std::io::Error) -> ToolError {
        ToolError::Failed(format!("cannot start the async runtime: {e}"))
    }
}

/// A tool's entry: its arguments after NAME in, its exit code or failure out.
type Tool = fn(&[String]) -> Result<u8, ToolError>;

const TOOLS: &[(&str, Tool)] = &[
    ("store", store::main),
    ("bench", bench::main),
    ("doctor", doctor::main),
    ("plan", plan::main),
    ("status", status::main),
];

/// Runs the tool `name` with `args` and returns its exit code, having said how it failed; None when `name`
/// is not a tool.
pub fn dispatch(name: &str, args: &[String]) -> Option<u8> {
    let (_, run) = TOOLS.iter().find(|(n, _)| *n == name)?;
    Some(finish(&format!("muster {name}"), run(args)))
}

/// The one printer: says how a command failed, as `WHO: ...` (`muster`, `muster store`), and gives the
/// exit code either way.
pub fn finish(who: &str, result: Result<u8, ToolError>) -> u8 {
    match result {
        Ok(code) | Err(ToolError::Answered(code)) => code,
        Err(e) => {
            crate::errln!("{who}: {e}");
            e.code()
        }
    }
}

/// The tool's command line; what clap refuses (or `--help`) it has already answered.
pub fn parse<T: clap::Parser>(name: &str, args: &[String]) -> Result<T, ToolError> {
    crate::cli::parse_subcommand(name, args).map_err(ToolError::Answered)
}

/// [`crate::runtime::build`] for a tool, its failure as the tool's.
fn tool_runtime(threads: Threads) -> Result<tokio::runtime::Runtime, ToolError> {
    crate::runtime::build(threads).map_err(ToolError::runtime)
}

#[cfg(test)]
mod tests {
    use super::ToolError;

    #[test]
    fn other_words_are_not_tools() {
        assert_eq!(super::dispatch("train.py", &[]), None);
        assert_eq!(super::dispatch("--standalone", &[]), None);
    }

    #[test]
    fn each_failure_exits_with_its_code() {
        let table = [
            (ToolError::Usage("x".into()), 2, "error: x"),
            (ToolError::Failed("cannot bind".into()), 1, "cannot bind"),
            (ToolError::Coded { code: 3, message: "unreachable".into() }, 3, "error: unreachable"),
            (ToolError::Answered(0), 0, "the command line was answered"),
        ];
        for (e, code, line) in table {
            assert_eq!((e.code(), e.to_string().as_str()), (code, line));
        }
    }
}
