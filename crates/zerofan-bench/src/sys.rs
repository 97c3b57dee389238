//! Operating-system helpers: the loopback guard, the file-descriptor limit
//! and the broker's memory from `/proc`.

use std::net::{IpAddr, SocketAddr};

/// True when `ip` is a loopback address (127.0.0.0/8, ::1, or an
/// IPv4-mapped loopback address).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Refuse to drive anything but this machine unless `allow_remote`.
pub fn check_target(addrs: &[SocketAddr], allow_remote: bool) -> Result<(), String> {
    if addrs.is_empty() {
        return Err("the host name resolved to no address".into());
    }
    if allow_remote {
        return Ok(());
    }
    match addrs.iter().find(|a| !is_loopback(a.ip())) {
        Some(bad) => Err(format!(
            "{} is not a loopback address; pass --allow-remote to load a broker on another machine",
            bad.ip()
        )),
        None => Ok(()),
    }
}

/// The source address of client `i` when connections are spread over
/// `sources` loopback addresses (127.1.0.1, 127.1.0.2, ...): each source
/// address has its own ephemeral port range (about 28,000 ports), so one
/// address runs out long before a million connections do. `None` (let the
/// kernel pick) when `sources` is 0 or the broker is not on IPv4 loopback,
/// where such a source could not reach it.
pub fn source_addr(target: SocketAddr, i: usize, sources: usize) -> Option<IpAddr> {
    match target.ip() {
        IpAddr::V4(v4) if v4.is_loopback() && sources > 0 => {
            // 254 hosts per third octet, skipping .0 and .255.
            let k = i % sources.min(254 * 256);
            let (hi, lo) = (k / 254, k % 254 + 1);
            Some(IpAddr::V4(std::net::Ipv4Addr::new(
                127, 1, hi as u8, lo as u8,
            )))
        }
        _ => None,
    }
}

/// Raise the soft RLIMIT_NOFILE towards the hard limit so that `wanted`
/// descriptors fit. Returns the soft limit in force afterwards.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
pub fn raise_nofile(wanted: u64) -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let cur = lim.rlim_cur as u64;
    if cur >= wanted {
        return Ok(cur);
    }
    let target = (wanted as libc::rlim_t).min(lim.rlim_max);
    lim.rlim_cur = target;
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(target as u64)
}

/// Memory figures of a process from `/proc/PID/status`, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Mem {
    /// Resident set size now (VmRSS).
    pub rss_kib: u64,
    /// Peak resident set size (VmHWM).
    pub hwm_kib: u64,
    /// The anonymous part of `rss_kib` (RssAnon): the heap and stacks,
    /// without the program's own pages the kernel maps in as its code
    /// runs (file-backed, shared, and no cost of the state it holds).
    /// `None` where the kernel does not report it.
    pub anon_kib: Option<u64>,
}

/// Read VmRSS and VmHWM of process `pid`.
pub fn read_mem(pid: u32) -> std::io::Result<Mem> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_status(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "no VmRSS in /proc/PID/status",
        )
    })
}

/// Parse the VmRSS, VmHWM and RssAnon lines of a `/proc/PID/status` text.
pub fn parse_status(text: &str) -> Option<Mem> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some(Mem {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:").unwrap_or(0),
        anon_kib: field("RssAnon:"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_are_recognised() {
        assert!(is_loopback("127.0.0.1".parse().unwrap()));
        assert!(is_loopback("127.8.9.10".parse().unwrap()));
        assert!(is_loopback("::1".parse().unwrap()));
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
        assert!(!is_loopback("192.168.1.1".parse().unwrap()));
        assert!(!is_loopback("::ffff:8.8.8.8".parse().unwrap()));
        assert!(!is_loopback("0.0.0.0".parse().unwrap()));
    }

    #[test]
    fn remote_targets_need_the_flag() {
        let local: SocketAddr = "127.0.0.1:1883".parse().unwrap();
        let remote: SocketAddr = "10.1.2.3:1883".parse().unwrap();
        assert!(check_target(&[local], false).is_ok());
        assert!(check_target(&[local, remote], false).is_err());
        assert!(check_target(&[remote], true).is_ok());
        assert!(check_target(&[], true).is_err());
    }

    #[test]
    fn sources_spread_over_loopback() {
        let lo: SocketAddr = "127.0.0.1:1883".parse().unwrap();
        let ip = |i, n| source_addr(lo, i, n).map(|a| a.to_string());
        assert_eq!(ip(0, 64).as_deref(), Some("127.1.0.1"));
        assert_eq!(ip(63, 64).as_deref(), Some("127.1.0.64"));
        assert_eq!(ip(64, 64).as_deref(), Some("127.1.0.1"));
        assert_eq!(ip(300, 1000).as_deref(), Some("127.1.1.47"));
        assert_eq!(ip(5, 0), None);
        let remote: SocketAddr = "10.0.0.1:1883".parse().unwrap();
        assert_eq!(source_addr(remote, 5, 64), None);
        let v6: SocketAddr = "[::1]:1883".parse().unwrap();
        assert_eq!(source_addr(v6, 5, 64), None);
    }

    #[test]
    fn status_is_parsed() {
        let text = "Name:\tmosquitto\nVmHWM:\t    9000 kB\nVmRSS:\t    7012 kB\nRssAnon:\t    5000 kB\nThreads:\t1\n";
        assert_eq!(
            parse_status(text),
            Some(Mem {
                rss_kib: 7012,
                hwm_kib: 9000,
                anon_kib: Some(5000),
            })
        );
        assert_eq!(parse_status("Name: x\n"), None);
    }

    #[test]
    fn own_memory_is_readable() {
        let m = read_mem(std::process::id()).unwrap();
        assert!(m.rss_kib > 0);
    }
}
