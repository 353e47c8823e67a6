//! Several "hosts" on one machine for tests of real network faults: a bridge namespace and N host
//! namespaces, each host with a veth pair into the bridge and an address of its own, 198.18.0.(i+1)/24 (the
//! RFC 2544 benchmarking range; the addresses exist only inside these namespaces). Faults are nftables
//! rules in the bridge namespace, so a cut host's packets are dropped silently: no FIN, no RST, no ICMP, as
//! when a host loses power or a switch port dies. `scripts/netns.sh` is the same recipe by hand.
//!
//! Everything a `Net` creates is removed when it is dropped (a panicking test's unwinding too): first every
//! process inside its namespaces is killed by PID (found by its network namespace, so only ours), then the
//! namespaces go, and with them the veths, the bridge and the fault table. A watchdog process (in a session
//! of its own) does the same if the test process dies without unwinding (SIGKILL, Ctrl-C), and each new
//! `Net` removes what a dead test process of this harness left (its pid is in the names).
//!
//! Processes run in a host through `setns(CLONE_NEWNET)` in the child before exec, not `ip netns exec`:
//! that one also unmounts /sys in a mount namespace of its own, taking /sys/fs/cgroup (and so muster's job
//! cgroup) away from the program. The network is the only thing that differs between hosts; the hostname
//! (which /etc/hosts maps to loopback), the file system, the clock and the PID namespace are shared, so give
//! each agent `--local-addr <its address>` and compare timestamps across hosts as they are.
//!
//! A test that uses a `Net` fails (never skips) when not run as root or when `ip` or `nft` is missing.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The names of one test process's nets: `mu<pid>x<n>`.
const NAME_PREFIX: &str = "mu";
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// One fault, as the rules it adds to the bridge's filter chain (or a port it takes down).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    Cut(usize),
    CutInbound(usize),
    Loss(usize, u32),
}

impl Fault {
    fn rules(&self) -> Vec<String> {
        match *self {
            Fault::Cut(i) => vec![format!("iifname \"vb{i}\" drop"), format!("oifname \"vb{i}\" drop")],
            Fault::CutInbound(i) => vec![format!("oifname \"vb{i}\" drop")],
            // Every packet at the port counted first (no verdict: it goes on to the drop rules).
            Fault::Loss(i, k) => vec![
                format!("iifname \"vb{i}\" counter"),
                format!("oifname \"vb{i}\" counter"),
                format!("iifname \"vb{i}\" numgen random mod {k} == 0 counter drop"),
                format!("oifname \"vb{i}\" numgen random mod {k} == 0 counter drop"),
            ],
        }
    }
}

/// Packets at the lossy ports: every one that arrived, and those the loss rules dropped.
#[derive(Debug, Default, Clone, Copy)]
pub struct LossCounts {
    pub crossed: u64,
    pub dropped: u64,
}

pub struct Net {
    prefix: String,
    /// Open handles of the bridge namespace (first) and each host's, for `setns`; closed before removal.
    fds: Vec<File>,
    /// How many host namespaces exist (set-up may have failed midway).
    hosts: usize,
    bridge: bool,
    faults: Mutex<Vec<Fault>>,
    links_down: Mutex<BTreeSet<usize>>,
    watchdog: Option<Child>,
}

/// One host of a [`Net`].
#[derive(Clone, Copy)]
pub struct Host<'a> {
    net: &'a Net,
    index: usize,
}

/// Fails the test with one line when this machine cannot run a `Net`.
fn require_root_and_tools() {
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let has = |tool: &str| {
        Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
            || Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
    };
    let mut missing = Vec::new();
    if !root {
        missing.push("root (network namespaces and nftables need CAP_NET_ADMIN and CAP_SYS_ADMIN)".to_string());
    }
    if !has("ip") {
        missing.push("ip (iproute2)".to_string());
    }
    if !has("nft") {
        missing.push("nft (nftables: `source scripts/lib.sh; ensure_nftables`, which scripts/test.sh runs)".to_string());
    }
    assert!(
        missing.is_empty(),
        "the network-namespace tests cannot run here: missing {}; run them as root through scripts/test.sh",
        missing.join(", ")
    );
}

/// Runs a command to completion; the test fails with its stderr if it fails.
fn sh(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) -> String {
    sh(Command::new("ip").args(args))
}

/// The network namespaces named in /run/netns.
fn netns_names() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// The inode that identifies a named network namespace (what /proc/PID/ns/net links to).
fn netns_inode(name: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/run/netns/{name}")).ok().map(|m| m.ino())
}

/// PIDs of the live processes whose network namespace is one of `inodes` (never this process).
fn pids_in(inodes: &[u64]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .ok()
                .and_then(|l| l.to_str().and_then(|s| s.strip_prefix("net:[")?.strip_suffix(']')?.parse::<u64>().ok()))
                .is_some_and(|ino| inodes.contains(&ino))
        })
        .collect()
}

/// Kills (SIGKILL, by PID) every process in the named namespaces and removes them. Best effort: what fails
/// is said on stderr, never a panic (this runs in Drop, maybe while unwinding).
fn remove_namespaces(names: &[String]) {
    let inodes: Vec<u64> = names.iter().filter_map(|n| netns_inode(n)).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = pids_in(&inodes);
        if pids.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!("netns: processes still in {names:?} after 10 s: {pids:?}");
            break;
        }
        for pid in pids {
            // SAFETY: kill(2) of a process inside a namespace this harness created.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for name in names {
        let out = Command::new("ip").args(["netns", "del", name]).stdin(Stdio::null()).output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("netns: ip netns del {name}: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => eprintln!("netns: ip netns del {name}: {e}"),
        }
    }
}

/// Removes the namespaces of this harness whose test process is gone (`mu<pid>x<n>-…` with no such pid).
fn sweep_stale() {
    let stale: Vec<String> = netns_names()
        .into_iter()
        .filter(|n| {
            let Some(rest) = n.strip_prefix(NAME_PREFIX) else { return false };
            let Some((pid, tail)) = rest.split_once('x') else { return false };
            let ours = tail.split_once('-').is_some_and(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
            ours && pid.parse::<u32>().is_ok_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        })
        .collect();
    if !stale.is_empty() {
        eprintln!("netns: removing namespaces left by a test process that is gone: {stale:?}");
        remove_namespaces(&stale);
    }
}

impl Net {
    /// A bridge and `hosts` hosts, every link up, no fault.
    pub fn new(hosts: usize) -> Net {
        assert!((1..=250).contains(&hosts), "a Net has 1 to 250 hosts, not {hosts}");
        require_root_and_tools();
        sweep_stale();
        let prefix = format!("{NAME_PREFIX}{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        // From here on a panic drops `net`, which removes whatever was made so far.
        let mut net = Net {
            prefix,
            fds: Vec::new(),
            hosts: 0,
            bridge: false,
            faults: Mutex::new(Vec::new()),
            links_down: Mutex::new(BTreeSet::new()),
            watchdog: None,
        };
        net.watchdog = Some(net.start_watchdog(hosts));
        let br = net.bridge_ns();
        ip(&["netns", "add", &br]);
        net.bridge = true;
        net.fds.push(File::open(format!("/run/netns/{br}")).expect("open the bridge namespace"));
        ip(&["-n", &br, "link", "set", "lo", "up"]);
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &br, "link", "set", "br0", "up"]);
        for i in 0..hosts {
            let h = net.host_ns(i);
            ip(&["netns", "add", &h]);
            net.hosts = i + 1;
            net.fds.push(File::open(format!("/run/netns/{h}")).expect("open a host namespace"));
            let (vh, vb) = (format!("vh{i}"), format!("vb{i}"));
            ip(&["link", "add", &vh, "netns", &h, "type", "veth", "peer", "name", &vb, "netns", &br]);
            ip(&["-n", &br, "link", "set", &vb, "master", "br0"]);
            ip(&["-n", &br, "link", "set", &vb, "up"]);
            ip(&["-n", &h, "addr", "add", &format!("{}/24", net.host(i).addr()), "dev", &vh]);
            ip(&["-n", &h, "link", "set", &vh, "up"]);
            ip(&["-n", &h, "link", "set", "lo", "up"]);
        }
        net
    }

    /// A process in a session of its own that waits for this test process to end and then removes this
    /// net: the clean-up for a test process killed without unwinding. Drop kills it (by PID) first.
    fn start_watchdog(&self, hosts: usize) -> Child {
        let mut names = vec![self.bridge_ns()];
        names.extend((0..hosts).map(|i| self.host_ns(i)));
        let names = names.join(" ");
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             for ns in {names}; do for p in $(ip netns pids $ns 2>/dev/null); do kill -KILL $p; done; done; \
             sleep 0.2; for ns in {names}; do ip netns del $ns 2>/dev/null; done",
            pid = std::process::id()
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: setsid(2) is async-signal-safe; the watchdog must survive a Ctrl-C to the test's group.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        cmd.spawn().expect("start the netns watchdog")
    }

    /// `mu<pid>x<n>`: this net's prefix (its nft table's name, and its namespaces' names start with it).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn bridge_ns(&self) -> String {
        format!("{}-br", self.prefix)
    }

    fn host_ns(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }

    pub fn len(&self) -> usize {
        self.hosts
    }

    pub fn host(&self, index: usize) -> Host<'_> {
        assert!(index < self.hosts, "host {index} of a net of {}", self.hosts);
        Host { net: self, index }
    }

    pub fn hosts(&self) -> impl Iterator<Item = Host<'_>> {
        (0..self.hosts).map(|i| self.host(i))
    }

    /// Host `i` silently cut off, both ways. Returns when the rule is in force.
    pub fn cut(&self, i: usize) -> SystemTime {
        self.add_fault(Fault::Cut(i))
    }

    /// Only the packets to host `i` are dropped: it still sends, and hears nothing.
    pub fn cut_inbound(&self, i: usize) -> SystemTime {
        self.add_fault(Fault::CutInbound(i))
    }

    /// One packet in `k` dropped at random, each way, for host `i` (a counter per rule: [`Net::dropped`]).
    pub fn loss(&self, i: usize, k: u32) -> SystemTime {
        assert!(k >= 2, "loss of 1 in {k}: k must be at least 2 (use cut for all)");
        self.add_fault(Fault::Loss(i, k))
    }

    /// Host `i`'s bridge port down: its veth loses carrier (a cable pulled, a switch port dead).
    pub fn link_down(&self, i: usize) -> SystemTime {
        self.host(i);
        ip(&["-n", &self.bridge_ns(), "link", "set", &format!("vb{i}"), "down"]);
        self.links_down.lock().unwrap_or_else(|e| e.into_inner()).insert(i);
        SystemTime::now()
    }

    /// Every fault removed: the table deleted, every port up.
    pub fn heal(&self) -> SystemTime {
        let had = std::mem::take(&mut *self.faults.lock().unwrap_or_else(|e| e.into_inner()));
        if !had.is_empty() {
            self.nft(&format!("delete table bridge {}\n", self.prefix));
        }
        let down = std::mem::take(&mut *self.links_down.lock().unwrap_or_else(|e| e.into_inner()));
        for i in down {
            ip(&["-n", &self.bridge_ns(), "link", "set", &format!("vb{i}"), "up"]);
        }
        SystemTime::now()
    }

    /// Packets the loss rules dropped so far.
    pub fn dropped(&self) -> u64 {
        self.loss_counts().dropped
    }

    /// What crossed the lossy ports so far and what the loss rules dropped of it (the fault table's
    /// counters: a rule ending in `drop` counts drops, any other counts every packet).
    pub fn loss_counts(&self) -> LossCounts {
        let mut counts = LossCounts::default();
        if self.faults.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return counts;
        }
        let listing = sh(Command::new("ip").args(["netns", "exec", &self.bridge_ns(), "nft", "list", "table", "bridge", &self.prefix]));
        for line in listing.lines() {
            let words: Vec<_> = line.split_whitespace().collect();
            let Some(n) = words.windows(2).find(|w| w[0] == "packets").and_then(|w| w[1].parse::<u64>().ok()) else { continue };
            match words.last() == Some(&"drop") {
                true => counts.dropped += n,
                false => counts.crossed += n,
            }
        }
        counts
    }

    /// The fault table as nft lists it (for a failing test's message).
    pub fn ruleset(&self) -> String {
        let out = Command::new("ip").args(["netns", "exec", &self.bridge_ns(), "nft", "list", "ruleset"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    fn add_fault(&self, fault: Fault) -> SystemTime {
        let i = match fault {
            Fault::Cut(i) | Fault::CutInbound(i) | Fault::Loss(i, _) => i,
        };
        self.host(i);
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        faults.push(fault);
        // The table replaced in one transaction (add + delete + define: no moment without the old rules).
        // One rule per line: nft refuses a one-line `{ ...; }` chain body with these rules.
        let mut text = format!("add table bridge {p}\ndelete table bridge {p}\ntable bridge {p} {{\n", p = self.prefix);
        text.push_str("    chain faults {\n        type filter hook forward priority 0; policy accept;\n");
        for rule in faults.iter().flat_map(Fault::rules) {
            text.push_str(&format!("        {rule}\n"));
        }
        text.push_str("    }\n}\n");
        self.nft(&text);
        SystemTime::now()
    }

    /// `nft -f -` in the bridge namespace with `text` on stdin.
    fn nft(&self, text: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.bridge_ns(), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run nft");
        child.stdin.take().expect("nft stdin").write_all(text.as_bytes()).expect("write the nft rules");
        let out = child.wait_with_output().expect("wait for nft");
        assert!(out.status.success(), "nft -f - failed: {}\nrules:\n{text}", String::from_utf8_lossy(&out.stderr).trim());
    }

    /// The PIDs of the processes now running in any of this net's namespaces.
    pub fn pids(&self) -> Vec<i32> {
        let mut names = vec![self.bridge_ns()];
        names.extend((0..self.hosts).map(|i| self.host_ns(i)));
        let inodes: Vec<u64> = names.iter().filter_map(|n| netns_inode(n)).collect();
        pids_in(&inodes)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("netns {}: fault table at the failure:\n{}", self.prefix, self.ruleset());
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        // Our own handles keep the namespaces alive: closed first.
        self.fds.clear();
        let mut names = Vec::new();
        if self.bridge {
            names.push(self.bridge_ns());
        }
        names.extend((0..self.hosts).map(|i| self.host_ns(i)));
        remove_namespaces(&names);
        let left: Vec<String> = netns_names().into_iter().filter(|n| names.contains(n)).collect();
        if !left.is_empty() {
            eprintln!("netns {}: could not remove {left:?}", self.prefix);
        }
    }
}

impl<'a> Host<'a> {
    pub fn index(&self) -> usize {
        self.index
    }

    /// `198.18.0.(i+1)`.
    pub fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, self.index as u8 + 1)
    }

    /// The address as text, for `--local-addr` and endpoints.
    pub fn addr(&self) -> String {
        self.ip().to_string()
    }

    pub fn socket(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip()), port)
    }

    /// The namespace's name (`ip netns exec NAME …` by hand).
    pub fn ns(&self) -> String {
        self.net.host_ns(self.index)
    }

    fn fd(&self) -> RawFd {
        self.net.fds[self.index + 1].as_raw_fd()
    }

    /// `program` to run in this host.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        self.wrap(&mut cmd);
        cmd
    }

    /// Makes `cmd` run in this host: its child joins the host's network namespace before exec (the
    /// namespace's handle stays open in this process while the net lives; the child's copy closes at exec).
    pub fn wrap<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        let fd = self.fd();
        // SAFETY: setns(2) is a plain system call, async-signal-safe; `fd` is open (held by the Net).
        unsafe {
            cmd.pre_exec(move || match libc::setns(fd, libc::CLONE_NEWNET) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            })
        }
    }

    /// Runs `f` on a thread of its own inside this host's network namespace (sockets it opens are this
    /// host's) and returns its result; a panic in `f` fails the caller.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let fd = self.fd();
        let ns = self.ns();
        std::thread::spawn(move || {
            // SAFETY: setns(2) on this thread only (a network namespace may be entered by one thread of a
            // multi-threaded process); the thread ends with `f`.
            let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns into {ns}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// A TCP connection from this host to `to`, within `timeout`.
    pub fn connect(&self, to: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
        self.run(move || TcpStream::connect_timeout(&to, timeout))
    }

    /// A TCP listener of this host on `port` (0: any).
    pub fn listen(&self, port: u16) -> std::net::TcpListener {
        let addr = self.socket(port);
        self.run(move || std::net::TcpListener::bind(addr)).unwrap_or_else(|e| panic!("listen on {addr}: {e}"))
    }

    /// One HTTP/1.0 POST from this host (no client library: etcd's JSON gateway needs no more); the body of
    /// a 2xx answer, or why there is none.
    pub fn http_post(&self, to: SocketAddr, path: &str, body: &str, timeout: Duration) -> Result<String, String> {
        let request = format!(
            "POST {path} HTTP/1.0\r\nHost: {to}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.run(move || {
            use std::io::Read;
            let mut s = TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect {to}: {e}"))?;
            s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
            s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
            s.write_all(request.as_bytes()).map_err(|e| format!("send to {to}: {e}"))?;
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).map_err(|e| format!("read from {to}: {e}"))?;
            let answer = String::from_utf8_lossy(&answer).into_owned();
            let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| format!("no HTTP answer from {to}: {answer:?}"))?;
            let status = head.split_whitespace().nth(1).unwrap_or_default();
            match status.starts_with('2') {
                true => Ok(body.to_string()),
                false => Err(format!("{to}: HTTP {status}: {body}")),
            }
        })
    }
}
