//! This host's identity, as torch sees it: `socket.gethostname()` and `socket.getfqdn()`.
//!
//! torchrun exports the FQDN as `MASTER_ADDR` in standalone and c10d mode and prints it in failure summaries;
//! muster computes it the way Python does so both launchers hand workers the same value.

use std::ffi::{CStr, CString};

/// `socket.gethostname()`.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// `socket.getfqdn()`: the first of the reverse-lookup name and its aliases that contains a dot, else the
/// reverse-lookup name, else the hostname when the lookup fails.
pub fn fqdn() -> String {
    let name = hostname();
    reverse_lookup(&name)
        .map(|(canonical, aliases)| {
            std::iter::once(&canonical)
                .chain(aliases.iter())
                .find(|n| n.contains('.'))
                .cloned()
                .unwrap_or(canonical)
        })
        .unwrap_or(name)
}

/// `gethostbyaddr(gethostbyname(name))` through libc, as CPython's `socket.gethostbyaddr` does.
fn reverse_lookup(name: &str) -> Option<(String, Vec<String>)> {
    let cname = CString::new(name).ok()?;
    // SAFETY: getaddrinfo/freeaddrinfo and gethostbyaddr_r are called with valid pointers and buffers sized
    // as passed; every pointer read back is checked for null and points into `buf` or the addrinfo list.
    unsafe {
        let mut hints: libc::addrinfo = std::mem::zeroed();
        hints.ai_family = libc::AF_INET;
        let mut res: *mut libc::addrinfo = std::ptr::null_mut();
        if libc::getaddrinfo(cname.as_ptr(), std::ptr::null(), &hints, &mut res) != 0 || res.is_null() {
            return None;
        }
        let sin = (*res).ai_addr as *const libc::sockaddr_in;
        let addr = (*sin).sin_addr;
        libc::freeaddrinfo(res);

        let mut host: libc::hostent = std::mem::zeroed();
        let mut result: *mut libc::hostent = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut herr = 0;
        let rc = gethostbyaddr_r(
            &addr as *const libc::in_addr as *const libc::c_void,
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
            libc::AF_INET,
            &mut host,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
            &mut herr,
        );
        if rc != 0 || result.is_null() || host.h_name.is_null() {
            return None;
        }
        let canonical = CStr::from_ptr(host.h_name).to_string_lossy().into_owned();
        let mut aliases = Vec::new();
        let mut p = host.h_aliases;
        while !p.is_null() && !(*p).is_null() {
            aliases.push(CStr::from_ptr(*p).to_string_lossy().into_owned());
            p = p.add(1);
        }
        Some((canonical, aliases))
    }
}

extern "C" {
    // glibc's reentrant reverse lookup; the libc crate does not bind it.
    fn gethostbyaddr_r(
        addr: *const libc::c_void,
        len: libc::socklen_t,
        family: libc::c_int,
        ret: *mut libc::hostent,
        buf: *mut libc::c_char,
        buflen: libc::size_t,
        result: *mut *mut libc::hostent,
        h_errnop: *mut libc::c_int,
    ) -> libc::c_int;
}
