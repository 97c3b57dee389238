//! The systemd readiness protocol (`Type=notify`, `sd_notify(3)`) and the
//! pid file: what a service manager learns about a running broker.
//!
//! systemd passes a datagram socket in `NOTIFY_SOCKET` (a path, or an
//! abstract name when it starts with `@`); each state change is one
//! datagram of `KEY=VALUE` lines. Without the variable nothing is sent.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

/// Send `state` (e.g. `READY=1`) to `NOTIFY_SOCKET`, if set. Errors are
/// logged at debug level and otherwise ignored: the broker serves the same
/// with or without a service manager listening.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(Path::new(&target), state) {
        tracing::debug!(error = %e, socket = ?target, "sd_notify failed");
    }
}

fn send(target: &Path, state: &str) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let bytes = target.as_os_str().as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
            return Ok(());
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "abstract sockets need Linux",
            ));
        }
    }
    sock.send_to(state.as_bytes(), target)?;
    Ok(())
}

/// A written pid file, removed when dropped (a clean exit).
#[derive(Debug)]
pub struct PidFile(PathBuf);

impl PidFile {
    /// Write this process's id (and a newline) to `path`, replacing what
    /// was there (a stale file from a killed broker).
    pub fn create(path: &Path) -> io::Result<PidFile> {
        std::fs::write(path, format!("{}\n", std::process::id())).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot write pid file {}: {e}", path.display()),
            )
        })?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("zerofan-sdn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        send(&path, "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        assert!(send(&dir.join("absent"), "READY=1").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pid_file_is_written_and_removed() {
        let path = std::env::temp_dir().join(format!("zerofan-pid-{}", std::process::id()));
        let pid = PidFile::create(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}\n", std::process::id()));
        drop(pid);
        assert!(!path.exists());
        let bad = PidFile::create(Path::new("/nonexistent-dir/zerofan.pid")).unwrap_err();
        assert!(
            bad.to_string().contains("/nonexistent-dir/zerofan.pid"),
            "{bad}"
        );
    }
}
