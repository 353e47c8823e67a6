//! `muster status`: the job as its rendezvous store holds it ([`crate::status`]).

use super::{Threads, ToolError};
use crate::status::{connect_and_show, target, Snapshot, StatusArgs};

/// Entry point of `muster status ARGS...`; the exit codes are [`crate::status::StatusError::exit_code`]'s.
pub fn main(args: &[String]) -> Result<u8, ToolError> {
    let args: StatusArgs = super::parse("status", args)?;
    let target = target(&args, &|name| std::env::var(name).ok()).map_err(ToolError::Usage)?;
    let runtime = super::tool_runtime(Threads::One)?;
    let snapshot = runtime
        .block_on(connect_and_show(&target))
        .map_err(|e| ToolError::Coded { code: e.exit_code(), message: e.to_string() })?;
    print_snapshot(&snapshot, args.format == "json")
}

fn print_snapshot(snapshot: &Snapshot, json: bool) -> Result<u8, ToolError> {
    if !json {
        crate::out!("{}", snapshot.table());
        return Ok(crate::exit::SUCCESS);
    }
    let text = snapshot.json().map_err(|e| ToolError::Failed(format!("cannot encode the status as JSON: {e}")))?;
    crate::outln!("{text}");
    Ok(crate::exit::SUCCESS)
}
