//! `zerofan passwd [-c] [-D] [-b PASSWORD] [--scram-sha-256] FILE USER`:
//! add, change or delete an entry of a mosquitto password file, as
//! `mosquitto_passwd` does. The password is read twice from the terminal (not echoed), or
//! once from standard input when that is not a terminal, or taken from
//! `-b` (batch mode; visible in the process list, as with mosquitto).

use clap::Args as ClapArgs;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zerofan_auth::PasswordFile;

/// Arguments of `zerofan passwd`.
#[derive(ClapArgs, Debug)]
pub struct PasswdArgs {
    /// Create the file (overwriting an existing one).
    #[arg(short = 'c')]
    pub create: bool,
    /// Delete USER instead of setting a password.
    #[arg(short = 'D', conflicts_with = "batch")]
    pub delete: bool,
    /// The password, on the command line (batch mode).
    #[arg(short = 'b', value_name = "PASSWORD")]
    pub batch: Option<String>,
    /// Store SCRAM-SHA-256 credentials (`SCRAM-SHA-256$…`, PostgreSQL's
    /// form) instead of mosquitto's `$7$`: the user can then log in with
    /// MQTT 5 SCRAM-SHA-256 (and with the plain password), but mosquitto
    /// cannot read the entry.
    #[arg(long = "scram-sha-256", conflicts_with = "delete")]
    pub scram_sha256: bool,
    /// The password file.
    pub file: PathBuf,
    /// The username.
    pub user: String,
}

/// Run `zerofan passwd`.
pub fn run(args: &PasswdArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerofan passwd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: &PasswdArgs) -> Result<(), String> {
    zerofan_auth::passwd::validate_username(&args.user).map_err(|e| e.to_string())?;
    let mut file = if args.create {
        PasswordFile::new()
    } else {
        match std::fs::read_to_string(&args.file) {
            Ok(text) => PasswordFile::parse(&text)
                .map_err(|e| format!("{}:{}: {}", args.file.display(), e.line, e.message))?,
            Err(e) => {
                return Err(format!(
                    "cannot read {}: {e} (use -c to create it)",
                    args.file.display()
                ))
            }
        }
    };
    if args.delete {
        if !file.remove(&args.user) {
            return Err(format!("user {} not found", args.user));
        }
    } else {
        let password = match &args.batch {
            Some(p) => p.clone(),
            None => read_password()?,
        };
        if args.scram_sha256 {
            file.set_scram_sha256(
                &args.user,
                password.as_bytes(),
                zerofan_auth::passwd::SCRAM_SHA256_ITERATIONS,
            )
        } else {
            file.set(&args.user, password.as_bytes())
        }
        .map_err(|e| e.to_string())?;
    }
    write_file(&args.file, &file.to_string())
}

/// Write through a temporary file and rename, readable by the owner only.
fn write_file(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("zerofan-tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let res = (|| {
        let mut f = opts.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

fn read_password() -> Result<String, String> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        let mut line = String::new();
        stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("cannot read the password: {e}"))?;
        let p = line.trim_end_matches(['\n', '\r']).to_string();
        if p.is_empty() {
            return Err("empty password".into());
        }
        return Ok(p);
    }
    let first = prompt("Password: ")?;
    let second = prompt("Reenter password: ")?;
    if first != second {
        return Err("passwords do not match".into());
    }
    if first.is_empty() {
        return Err("empty password".into());
    }
    Ok(first)
}

/// Prompt on stderr and read a line with echo turned off (`stty -echo`).
fn prompt(text: &str) -> Result<String, String> {
    eprint!("{text}");
    let _ = std::io::stderr().flush();
    let echo_off = std::process::Command::new("stty")
        .arg("-echo")
        .stdin(std::process::Stdio::inherit())
        .status()
        .is_ok_and(|s| s.success());
    let mut line = String::new();
    let r = std::io::stdin().lock().read_line(&mut line);
    if echo_off {
        let _ = std::process::Command::new("stty")
            .arg("echo")
            .stdin(std::process::Stdio::inherit())
            .status();
    }
    eprintln!();
    r.map_err(|e| format!("cannot read the password: {e}"))?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}
