//! In place (`--in-place on`): workers that use the `muster_inplace` Python API (`python/`) keep their
//! processes, memory and step across a change of the job's membership. This is the agent's side of their
//! channel: an abstract Unix socket named in each worker's `MUSTER_INPLACE_SOCKET`, one connection per
//! worker, known by its peer credentials (the pid the kernel vouches for, not the one it claims), messages
//! as `wire.rs` frames them. The agent asks which of its workers can be kept, hands each kept worker its
//! new variables, and waits, bounded, for each to say it re-formed.

pub mod wire;

use std::collections::HashMap;
use std::path::PathBuf;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The variable naming the channel (`@` for the abstract namespace, as `ss` writes it).
pub const SOCKET_VAR: &str = "MUSTER_INPLACE_SOCKET";
/// The variable bounding how long a worker waits for its assignment after a collective failed.
pub const TIMEOUT_VAR: &str = "MUSTER_INPLACE_TIMEOUT";
/// Set (to `1`) for a worker started before its node joined: `run` waits for its ranks before anything else.
pub const JOINING_VAR: &str = "MUSTER_INPLACE_JOINING";
/// The Python API, embedded so that every worker can import it however muster was installed.
pub const PYTHON: &[(&str, &str)] = &[
    ("__init__.py", include_str!("python/muster_inplace/__init__.py")),
    ("_channel.py", include_str!("python/muster_inplace/_channel.py")),
    ("_groups.py", include_str!("python/muster_inplace/_groups.py")),
    ("_layout.py", include_str!("python/muster_inplace/_layout.py")),
    ("_plan.py", include_str!("python/muster_inplace/_plan.py")),
    ("_run.py", include_str!("python/muster_inplace/_run.py")),
    ("_sockets.py", include_str!("python/muster_inplace/_sockets.py")),
    ("_state.py", include_str!("python/muster_inplace/_state.py")),
    ("_transfer.py", include_str!("python/muster_inplace/_transfer.py")),
    ("_vote.py", include_str!("python/muster_inplace/_vote.py")),
    ("py.typed", ""),
];
/// A worker's line longer than this ends its connection (a hello is under 100 bytes).
const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum InPlaceError {
    #[error("cannot open the in-place channel {name}: {source}; start with --in-place off to run without it")]
    Listen { name: String, source: io::Error },
    #[error("cannot write the in-place Python API to {path}: {source}; point TMPDIR at a writable directory")]
    Module { path: String, source: io::Error },
}

/// A connected worker that said hello.
struct Conn {
    local_rank: u32,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    /// The newest round it said it took up, and the newest it said it re-formed in.
    taken: Option<u64>,
    reformed: Option<u64>,
    /// It said its state cannot be restored in place.
    lost: bool,
}

#[derive(Default)]
struct Shared {
    conns: Mutex<HashMap<i32, Conn>>,
    /// A worker said hello, re-formed or went away.
    changed: Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Conn>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `done` holds of the connections (looked at again each time one changes), or `deadline`.
    async fn wait_until(&self, deadline: Option<Instant>, done: impl Fn(&HashMap<i32, Conn>) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(&self.lock()) || deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            match deadline {
                Some(d) => tokio::select! {
                    () = changed => {}
                    () = tokio::time::sleep_until(d) => {}
                },
                None => changed.await,
            }
        }
    }
}

/// Whether worker `pid` said hello with local rank `rank` and is still connected.
fn said_hello(conns: &HashMap<i32, Conn>, (rank, pid): &(u32, i32)) -> bool {
    conns.get(pid).is_some_and(|c| c.local_rank == *rank)
}

/// The directory the Python API is importable from, written at set-up whether in place is on or not (a
/// script that uses the API runs as under torchrun with it off); removed with it.
pub struct ApiDir {
    dir: PathBuf,
}

impl ApiDir {
    /// Writes the API to a directory of this agent's own. Blocking (a few small files): at set-up.
    pub fn write() -> Result<ApiDir, InPlaceError> {
        let dir = std::env::temp_dir().join(format!("muster-inplace-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
        write_module(&dir)?;
        Ok(ApiDir { dir })
    }

    /// PYTHONPATH for the workers: `parent` (the agent's own; a `muster_inplace` the user installed comes
    /// first), then this directory.
    pub fn python_path(&self, parent: Option<&str>) -> String {
        let dir = self.dir.display().to_string();
        match parent.filter(|p| !p.is_empty()) {
            Some(first) => format!("{first}:{dir}"),
            None => dir,
        }
    }
}

impl Drop for ApiDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!("cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// The agent's end of the channel; its tasks end with it.
pub struct Channel {
    name: String,
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
}

impl Channel {
    /// Listens on an abstract socket of this agent's own.
    pub fn open() -> Result<Channel, InPlaceError> {
        let name = format!("muster-inplace-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
        let listen = || -> io::Result<UnixListener> {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
            std_listener.set_nonblocking(true)?;
            UnixListener::from_std(std_listener)
        };
        let listener = listen().map_err(|source| InPlaceError::Listen { name: format!("@{name}"), source })?;
        let shared = Arc::new(Shared::default());
        let mut tasks = JoinSet::new();
        tasks.spawn(accept(listener, shared.clone()));
        Ok(Channel { name, shared, tasks })
    }

    /// What each worker's environment gets: the channel, and the bound on waiting for an assignment.
    pub fn worker_env(&self, bound: Duration) -> Vec<(String, String)> {
        vec![(SOCKET_VAR.into(), format!("@{}", self.name)), (TIMEOUT_VAR.into(), format!("{}", bound.as_secs_f64()))]
    }

    /// The pids among `workers` (local rank, pid) whose worker said hello with that local rank and is still
    /// connected: those that can be kept. None while any of them says the state is lost (every rank of the
    /// job says so at once: the whole group starts cold).
    pub fn keepable(&self, workers: &[(u32, i32)]) -> std::collections::HashSet<i32> {
        let conns = self.shared.lock();
        if workers.iter().any(|(_, pid)| conns.get(pid).is_some_and(|c| c.lost)) {
            return std::collections::HashSet::new();
        }
        workers.iter().filter(|w| said_hello(&conns, w)).map(|(_, pid)| *pid).collect()
    }

    /// Resolves once any worker has said hello; a future of its own (for a task that outlives a borrow).
    pub fn first_hello(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shared = self.shared.clone();
        async move { shared.wait_until(None, |conns| !conns.is_empty()).await }
    }

    /// Waits until each of `workers` (local rank, pid) can be kept (`keepable`), or `deadline`.
    pub async fn hellos(&self, workers: &[(u32, i32)], deadline: Instant) {
        self.shared.wait_until(Some(deadline), |conns| workers.iter().all(|w| said_hello(conns, w))).await;
    }

    /// Hands `reform` to worker `pid`; false when it is not connected.
    pub fn assign(&self, pid: i32, reform: &wire::Reform) -> bool {
        let conns = self.shared.lock();
        conns.get(&pid).is_some_and(|c| c.tx.send(wire::encode(reform)).is_ok())
    }

    /// Whether worker `pid` took up the re-formation of `round` (its main thread is at it, not stuck).
    pub fn taken(&self, pid: i32, round: u64) -> bool {
        self.shared.lock().get(&pid).is_some_and(|c| c.taken >= Some(round))
    }

    /// Waits until every worker of `pids` said it re-formed in `round`, or `deadline`, or until each of
    /// those left has gone away; returns those that did not say so.
    pub async fn unconfirmed(&self, pids: &[i32], round: u64, deadline: Instant) -> Vec<i32> {
        let missing = |conns: &HashMap<i32, Conn>| -> Vec<i32> {
            pids.iter().copied().filter(|p| conns.get(p).is_none_or(|c| c.reformed < Some(round))).collect()
        };
        // Done once none is missing, or none of those missing is still connected.
        let settled = |conns: &HashMap<i32, Conn>| missing(conns).iter().all(|p| !conns.contains_key(p));
        self.shared.wait_until(Some(deadline), settled).await;
        missing(&self.shared.lock())
    }

}

impl Drop for Channel {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

async fn accept(listener: UnixListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match stream.peer_cred().ok().and_then(|c| c.pid()) {
                    Some(pid) => {
                        conns.spawn(serve(stream, pid, shared.clone()));
                    }
                    None => tracing::debug!("an in-place connection without peer credentials; closed"),
                },
                Err(e) => {
                    tracing::warn!("the in-place channel stopped accepting: {e}");
                    return;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// One worker's connection: its lines read here, the agent's written by a task of its own.
async fn serve(stream: UnixStream, pid: i32, shared: Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if write.write_all(&line).await.is_err() {
                return;
            }
        }
    });
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE as u64).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) if !line.ends_with(b"\n") => {
                tracing::debug!(pid, "an in-place line over {MAX_LINE} bytes; connection closed");
                break;
            }
            Ok(_) => {}
        }
        match wire::decode(&line) {
            Ok(wire::FromWorker::Hello { local_rank, .. }) => {
                shared.lock().insert(pid, Conn { local_rank, tx: tx.clone(), taken: None, reformed: None, lost: false });
                shared.changed.notify_waiters();
            }
            Ok(wire::FromWorker::Taken { round }) => {
                if let Some(c) = shared.lock().get_mut(&pid) {
                    c.taken = Some(round);
                }
            }
            Ok(wire::FromWorker::Reformed { round, commit }) => {
                tracing::debug!(pid, round, commit, "worker re-formed in place");
                if let Some(c) = shared.lock().get_mut(&pid) {
                    c.reformed = Some(round);
                }
                shared.changed.notify_waiters();
            }
            Ok(wire::FromWorker::Lost { place }) => {
                tracing::warn!(pid, "worker's state cannot be restored in place ({place}); its group starts cold");
                if let Some(c) = shared.lock().get_mut(&pid) {
                    c.lost = true;
                }
                // Recorded before the worker exits: its death then keeps no worker.
                let _ = tx.send(wire::noted());
            }
            Err(e) => tracing::debug!(pid, "{e}"),
        }
    }
    shared.lock().remove(&pid);
    shared.changed.notify_waiters();
    writer.abort();
}

/// Writes the Python API under `dir` (`dir/muster_inplace/`), for the workers' PYTHONPATH.
fn write_module(dir: &std::path::Path) -> Result<(), InPlaceError> {
    let pkg = dir.join("muster_inplace");
    let err = |source| InPlaceError::Module { path: pkg.display().to_string(), source };
    std::fs::create_dir_all(&pkg).map_err(err)?;
    for (name, text) in PYTHON {
        std::fs::write(pkg.join(name), text).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process as a worker: hello, handed a round, says it re-formed; then gone.
    #[tokio::test]
    async fn a_worker_says_hello_is_handed_a_round_and_confirms() {
        let channel = Channel::open().expect("open");
        let env = channel.worker_env(Duration::from_secs(5));
        let name = env[0].1.strip_prefix('@').expect("abstract").to_string();
        let api = ApiDir::write().expect("api");
        assert!(api.dir.join("muster_inplace/_run.py").is_file());
        assert_eq!(api.python_path(Some("/site")), format!("/site:{}", api.dir.display()));
        let dir = api.dir.clone();
        drop(api);
        assert!(!dir.exists(), "removed with the agent");
        let me = std::process::id() as i32;
        let addr = {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name")
        };
        let std_stream = std::os::unix::net::UnixStream::connect_addr(&addr).expect("connect");
        std_stream.set_nonblocking(true).expect("nonblocking");
        let stream = UnixStream::from_std(std_stream).expect("tokio stream");
        let (read, mut write) = stream.into_split();
        write.write_all(format!("{{\"hello\": {{\"pid\": {me}, \"local_rank\": 1}}}}\n").as_bytes()).await.expect("hello");
        let keepable = || channel.keepable(&[(1, me), (0, me + 1)]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while keepable().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(keepable(), [me].into(), "kept by its credentials' pid, with the local rank it said");
        assert!(channel.keepable(&[(0, me)]).is_empty(), "not with another local rank");
        let reform = wire::Reform { round: 4, env: [("RANK".to_string(), "3".to_string())].into(), evicted: vec![] };
        assert!(channel.assign(me, &reform));
        let mut lines = BufReader::new(read).lines();
        assert_eq!(lines.next_line().await.expect("read"), Some(String::from_utf8(wire::encode(&reform)).expect("utf-8").trim_end().to_string()));
        write.write_all(b"{\"reformed\": {\"round\": 4, \"commit\": 12}}\n").await.expect("reformed");
        assert!(channel.unconfirmed(&[me], 4, Instant::now() + Duration::from_secs(5)).await.is_empty());
        write.write_all(b"{\"lost\": {\"place\": \"mesh shard 1 of 4\"}}\n").await.expect("lost");
        assert_eq!(lines.next_line().await.expect("read").as_deref(), Some("{\"noted\":{}}"), "noted before it exits");
        assert!(keepable().is_empty(), "a group one of whose workers lost its state keeps none");
        drop(write);
        drop(lines);
        // Gone: not confirmed for a later round, and not waited for until the deadline.
        let started = Instant::now();
        assert_eq!(channel.unconfirmed(&[me], 5, Instant::now() + Duration::from_secs(30)).await, [me]);
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
