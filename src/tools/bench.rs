//! `muster bench`: benchmarks of muster's own parts ([`crate::bench`]).

use super::ToolError;
use crate::bench::{bench_rendezvous, BenchArgs, BenchCommand, BenchError};

/// Entry point of `muster bench ARGS...` (`args` after the subcommand).
pub fn main(args: &[String]) -> Result<u8, ToolError> {
    let args: BenchArgs = super::parse("bench", args)?;
    // Errors only by default: one line per simulated node (a slow heartbeat under load, a spare waiting)
    // would drown the summary; RUST_LOG=warn shows them.
    crate::telemetry::init_with("error");
    match args.command {
        BenchCommand::Rendezvous(args) => {
            let report = bench_rendezvous(&args).map_err(|e| match e {
                BenchError::Usage(_) => ToolError::Usage(e.to_string()),
                e => ToolError::Failed(format!("rendezvous: {e}")),
            })?;
            if args.json {
                let line = serde_json::to_string(&report)
                    .map_err(|e| ToolError::Failed(format!("cannot encode the report: {e}")))?;
                crate::outln!("{line}");
            } else {
                crate::outln!("{}", report.summary());
            }
            Ok(if report.problems.is_empty() { crate::exit::SUCCESS } else { crate::exit::FAILED })
        }
    }
}
