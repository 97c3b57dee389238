//! MQTT 5 enhanced authentication with SCRAM-SHA-512 / SCRAM-SHA-256
//! against the listener's password file (see [`zerofan_auth::scram`]).
//!
//! CONNECT with Authentication Method `SCRAM-SHA-*` and the client-first
//! message as Authentication Data → AUTH 0x18 with the server-first
//! message → the client's AUTH 0x18 with the client-final message → the
//! CONNECT is handled as a login of the SCRAM user, its CONNACK carrying
//! the server-final message. A wrong proof is CONNACK 0x86 (counted and
//! throttled like a wrong password); another method 0x8C. The exchange
//! happens while the connection awaits its CONNECT, so `connect_timeout`
//! bounds it. Both are offered on listeners with a password file:
//! SCRAM-SHA-512 with credentials from its `$7$` entries (mosquitto's),
//! SCRAM-SHA-256 from its `SCRAM-SHA-256$` entries (`zerofan passwd
//! --scram-sha-256`). An unknown user, or one without credentials for the
//! method, gets made-up credentials (the exchange fails at the proof, as for
//! a wrong password). Re-authentication (AUTH 0x19) uses the method of the
//! CONNECT.

use zerofan_auth::scram::{ScramCredentials, ScramHash, ScramServer};
use zerofan_codec::{Connect, MqttStr};

/// An exchange in progress, with its CONNECT.
pub(crate) struct ScramPending {
    pub(crate) server: ScramServer,
    /// The CONNECT to handle after the exchange; `None` when a connected
    /// client re-authenticates.
    pub(crate) connect: Option<Box<Connect>>,
    pub(crate) method: MqttStr,
}

impl std::fmt::Debug for ScramPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramPending")
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

/// Random printable bytes (base64 alphabet without `,`).
pub(crate) fn nonce() -> String {
    use base64::Engine;
    let mut bits = [0u8; 18];
    // No OS randomness (never seen on Linux): a fixed nonce still works,
    // it only loses replay protection across exchanges.
    let _ = getrandom::fill(&mut bits);
    base64::engine::general_purpose::STANDARD.encode(bits)
}

/// Credentials to run an exchange for a user without real ones: the proof
/// can never match.
pub(crate) fn made_up(hash: ScramHash) -> ScramCredentials {
    let mut salted = [0u8; 64];
    let mut salt = [0u8; 16];
    let _ = getrandom::fill(&mut salted);
    let _ = getrandom::fill(&mut salt);
    ScramCredentials::from_salted(hash, &salted, &salt, 4096)
}
