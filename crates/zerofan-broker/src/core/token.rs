//! Logins with a JSON Web Token in the password field (`auth_jwt`), the
//! second link of the login chain (password file, JWT, HTTP).
//!
//! The shell reads the key file and builds a [`JwtAuth`]; the core asks
//! it per CONNECT. The core has no wall clock: the shell gives the Unix
//! time of one `Instant` ([`JwtAuth::anchor`]), and the time of a login is
//! counted from there, so a test moving its `Instant` moves the token
//! clock too.

use super::auth::ListenerAuth;
use super::http_auth::HttpAnswer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerofan_auth::{Acl, JwtRefusal, JwtVerifier};
use zerofan_codec::ReasonCode;

/// `auth_jwt` ready for the core.
#[derive(Debug)]
pub struct JwtAuth {
    /// Keys and claim checks.
    pub verifier: JwtVerifier,
    /// Close the connection (DISCONNECT 0x87 under MQTT 5) when its
    /// token's `exp` (plus the leeway) passes.
    pub disconnect_on_expiry: bool,
    /// Seconds of clock difference tolerated (as in the verifier).
    pub leeway_s: u64,
    /// An instant and its Unix time in seconds.
    pub anchor: (Instant, u64),
}

/// What the token link of the chain decided.
#[derive(Debug)]
pub(crate) enum TokenDecision {
    /// Not a token: the next link decides.
    Pass,
    /// Accepted.
    Allow {
        /// When the connection must be closed, if it must.
        expires: Option<Instant>,
        /// The token's permissions, replacing the listener's ACL.
        acl: Option<Arc<Acl>>,
    },
    /// Refused with this code (0x86 forged or unreadable, 0x87 expired,
    /// not yet valid, another user's, bad ACL claim).
    Refuse(ReasonCode),
}

impl JwtAuth {
    fn unix(&self, now: Instant) -> u64 {
        let (at, unix) = self.anchor;
        match now.checked_duration_since(at) {
            Some(d) => unix.saturating_add(d.as_secs()),
            None => unix.saturating_sub(at.duration_since(now).as_secs()),
        }
    }

    fn instant(&self, unix: u64, now: Instant) -> Instant {
        let (at, at_unix) = self.anchor;
        // Far-future expiries (years) need no exact timer: clamp.
        let ahead = unix.saturating_sub(at_unix).min(10 * 365 * 86_400);
        (at + Duration::from_secs(ahead)).max(now)
    }

    /// Decide a login as `username` with `password`.
    pub(crate) fn check(
        &self,
        now: Instant,
        username: Option<&str>,
        password: Option<&[u8]>,
    ) -> TokenDecision {
        let Some(password) = password else {
            return TokenDecision::Pass;
        };
        match self.verifier.verify(password, username, self.unix(now)) {
            Ok(login) => TokenDecision::Allow {
                expires: login
                    .expires_at
                    .filter(|_| self.disconnect_on_expiry)
                    .map(|exp| self.instant(exp.saturating_add(self.leeway_s), now)),
                acl: login.acl.map(Arc::new),
            },
            Err(JwtRefusal::NotAToken) => TokenDecision::Pass,
            Err(r) if r.is_bad_credentials() => {
                TokenDecision::Refuse(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
            }
            Err(r) => {
                tracing::debug!(refusal = ?r, "token refused");
                TokenDecision::Refuse(ReasonCode::NOT_AUTHORIZED)
            }
        }
    }
}

/// What a successful login brings besides the username.
#[derive(Debug, Default)]
pub(crate) struct Grant {
    /// Close the connection then.
    pub expires: Option<Instant>,
    /// Permissions replacing the listener's ACL.
    pub acl: Option<Arc<Acl>>,
    /// No ACL applies (the HTTP service said so).
    pub superuser: bool,
}

/// The HTTP link as the chain sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum HttpLink {
    /// Not configured.
    Off,
    /// Configured, no answer yet: reaching it means asking.
    Ask,
    /// The service's answer, and whether a failure lets the login in.
    Answer(HttpAnswer, bool),
}

/// Why the chain stopped without a login.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Refused with this code.
    Refuse(ReasonCode),
    /// The HTTP service must be asked first.
    Ask,
}

/// The chain for a login with a username: the password file decides for
/// the users it lists (for every user when it is the only source), then
/// a token, then the HTTP service (allow, deny: 0x86, ignore: passes on,
/// failure: the `fail` policy, deny being 0x88); when nobody decided the
/// login is refused (0x86) if any source is configured, else allowed
/// only with `allow_anonymous` (as mosquitto 2.0).
pub(crate) fn login_chain(
    l: &ListenerAuth,
    jwt: Option<&JwtAuth>,
    http: HttpLink,
    now: Instant,
    user: &str,
    password: Option<&[u8]>,
) -> Result<Grant, Stop> {
    let refuse = |code| Err(Stop::Refuse(code));
    let more = jwt.is_some() || !matches!(http, HttpLink::Off);
    if let Some(file) = &l.passwords {
        if !more || file.contains(user) {
            return if file.verify(user, password.unwrap_or(&[])) {
                Ok(Grant::default())
            } else {
                refuse(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
            };
        }
    }
    if let Some(j) = jwt {
        match j.check(now, Some(user), password) {
            TokenDecision::Pass => {}
            TokenDecision::Allow { expires, acl } => {
                return Ok(Grant {
                    expires,
                    acl,
                    superuser: false,
                })
            }
            TokenDecision::Refuse(code) => return refuse(code),
        }
    }
    match http {
        HttpLink::Off => {}
        HttpLink::Ask => return Err(Stop::Ask),
        HttpLink::Answer(answer, fail_allow) => match answer {
            HttpAnswer::Allow { superuser } => {
                return Ok(Grant {
                    superuser,
                    ..Grant::default()
                })
            }
            HttpAnswer::Deny => return refuse(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
            HttpAnswer::Ignore => {}
            HttpAnswer::Failed | HttpAnswer::TimedOut if fail_allow => return Ok(Grant::default()),
            HttpAnswer::Failed | HttpAnswer::TimedOut => {
                return refuse(ReasonCode::SERVER_UNAVAILABLE)
            }
        },
    }
    if l.passwords.is_some() || more {
        refuse(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
    } else if l.allow_anonymous {
        Ok(Grant::default())
    } else {
        refuse(ReasonCode::NOT_AUTHORIZED)
    }
}
