//! The async runtime, built in one place for the agent and every tool.

/// How many threads an async runtime has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// On the calling thread: a client that waits on one thing at a time.
    One,
    /// A worker per core: the agent, a server, or a benchmark of many simulated nodes.
    PerCore,
}

/// A runtime with timers and I/O enabled.
pub fn build(threads: Threads) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread(),
        Threads::PerCore => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}
