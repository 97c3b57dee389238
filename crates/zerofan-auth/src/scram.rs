//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side,
//! as a pure state machine for MQTT 5 enhanced authentication (the AUTH
//! exchange; Authentication Method `SCRAM-SHA-256` / `SCRAM-SHA-512`).
//!
//! ```text
//! client-first  (CONNECT Authentication Data) -> ScramServer::client_first -> username
//! (the broker looks the user up)              -> ScramServer::server_first -> AUTH 0x18
//! client-final  (AUTH 0x18)                   -> ScramServer::client_final -> CONNACK / AUTH 0x00
//! ```
//!
//! The server keeps only [`ScramCredentials`] (salt, iterations, StoredKey,
//! ServerKey), never the password. A mosquitto `$7$` entry is
//! PBKDF2-HMAC-SHA512 of the password, which is exactly SCRAM-SHA-512's
//! SaltedPassword: [`ScramCredentials::from_password_hash`] turns a
//! password file entry into SCRAM-SHA-512 credentials, so SCRAM works
//! against the same password files. SHA-256 needs its own credentials: a
//! `SCRAM-SHA-256$` entry (PostgreSQL's form, `zerofan passwd
//! --scram-sha-256`) holds them.
//!
//! Channel binding is not offered (`n,,` or `y,,`; `p=` is refused). The
//! server nonce comes in, so this stays sans-IO and testable.

use crate::passwd::PasswordHash;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// The hash of a SCRAM mechanism.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScramHash {
    /// `SCRAM-SHA-256`.
    Sha256,
    /// `SCRAM-SHA-512`.
    Sha512,
}

impl ScramHash {
    /// The mechanism for an MQTT Authentication Method, if it is one.
    pub fn from_method(method: &str) -> Option<ScramHash> {
        match method {
            "SCRAM-SHA-256" => Some(ScramHash::Sha256),
            "SCRAM-SHA-512" => Some(ScramHash::Sha512),
            _ => None,
        }
    }

    /// The MQTT Authentication Method naming this mechanism.
    pub fn method(self) -> &'static str {
        match self {
            ScramHash::Sha256 => "SCRAM-SHA-256",
            ScramHash::Sha512 => "SCRAM-SHA-512",
        }
    }

    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        macro_rules! mac {
            ($d:ty) => {{
                // HMAC takes keys of any length: this cannot fail.
                let Ok(mut m) = Hmac::<$d>::new_from_slice(key) else {
                    return Vec::new();
                };
                for p in parts {
                    m.update(p);
                }
                m.finalize().into_bytes().to_vec()
            }};
        }
        match self {
            ScramHash::Sha256 => mac!(Sha256),
            ScramHash::Sha512 => mac!(Sha512),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => Sha256::digest(data).to_vec(),
            ScramHash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramHash::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// What the server stores per user.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredentials {
    /// The mechanism these are for.
    pub hash: ScramHash,
    /// Salt.
    pub salt: Vec<u8>,
    /// PBKDF2 rounds.
    pub iterations: u32,
    /// H(HMAC(SaltedPassword, "Client Key")).
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key").
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredentials")
            .field("hash", &self.hash)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredentials {
    /// From SaltedPassword (Hi(password, salt, iterations)).
    pub fn from_salted(hash: ScramHash, salted: &[u8], salt: &[u8], iterations: u32) -> Self {
        let client_key = hash.hmac(salted, &[b"Client Key"]);
        ScramCredentials {
            hash,
            salt: salt.to_vec(),
            iterations,
            stored_key: hash.hash(&client_key),
            server_key: hash.hmac(salted, &[b"Server Key"]),
        }
    }

    /// From the password (costs `iterations` PBKDF2 rounds).
    pub fn from_password(hash: ScramHash, password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = hash.salted_password(password, salt, iterations);
        Self::from_salted(hash, &salted, salt, iterations)
    }

    /// The credentials a password file entry holds: SCRAM-SHA-512 from a
    /// mosquitto `$7$` entry (its digest is SaltedPassword), SCRAM-SHA-256
    /// from a `SCRAM-SHA-256$` entry; `None` for a `$6$` entry.
    pub fn from_password_hash(h: &PasswordHash) -> Option<Self> {
        match h {
            PasswordHash::Pbkdf2Sha512 {
                iterations,
                salt,
                digest,
            } => Some(Self::from_salted(
                ScramHash::Sha512,
                digest,
                salt,
                *iterations,
            )),
            PasswordHash::ScramSha256 {
                iterations,
                salt,
                stored_key,
                server_key,
            } => Some(ScramCredentials {
                hash: ScramHash::Sha256,
                salt: salt.clone(),
                iterations: *iterations,
                stored_key: stored_key.to_vec(),
                server_key: server_key.to_vec(),
            }),
            PasswordHash::Sha512 { .. } => None,
        }
    }
}

/// Why an exchange failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// A message does not follow the grammar, or comes out of turn.
    #[error("malformed SCRAM message")]
    Malformed,
    /// The client asks for channel binding, which is not offered.
    #[error("channel binding not supported")]
    ChannelBinding,
    /// The nonce or the channel binding data changed between messages.
    #[error("SCRAM nonce or binding mismatch")]
    Mismatch,
    /// The proof is wrong: bad password.
    #[error("SCRAM proof does not verify")]
    BadProof,
}

#[derive(Debug)]
enum State {
    Start,
    GotClientFirst {
        gs2_header: String,
        client_first_bare: String,
        client_nonce: String,
    },
    SentServerFirst {
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
        stored_key: Vec<u8>,
        server_key: Vec<u8>,
    },
    Done,
}

/// One server-side SCRAM exchange.
#[derive(Debug)]
pub struct ScramServer {
    hash: ScramHash,
    state: State,
    username: String,
}

fn attr(part: &str, name: char) -> Result<&str, ScramError> {
    let mut it = part.chars();
    match (it.next(), it.next()) {
        (Some(n), Some('=')) if n == name => Ok(&part[2..]),
        _ => Err(ScramError::Malformed),
    }
}

/// `saslname`: `=2C` is `,`, `=3D` is `=`; any other `=` is malformed.
fn unescape(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn printable_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

impl ScramServer {
    /// A new exchange for `hash`.
    pub fn new(hash: ScramHash) -> Self {
        ScramServer {
            hash,
            state: State::Start,
            username: String::new(),
        }
    }

    /// The username of the client-first message (empty before it).
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The mechanism.
    pub fn hash(&self) -> ScramHash {
        self.hash
    }

    /// The client-first message: returns the username to look up.
    pub fn client_first(&mut self, msg: &[u8]) -> Result<&str, ScramError> {
        if !matches!(self.state, State::Start) {
            return Err(ScramError::Malformed);
        }
        let msg = std::str::from_utf8(msg).map_err(|_| ScramError::Malformed)?;
        let mut parts = msg.splitn(3, ',');
        let (Some(cbind), Some(authzid), Some(bare)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(ScramError::Malformed);
        };
        match cbind {
            "n" | "y" => {}
            c if c.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed),
        }
        if !authzid.is_empty() {
            attr(authzid, 'a')?;
        }
        let mut fields = bare.split(',');
        let user = attr(fields.next().ok_or(ScramError::Malformed)?, 'n')?;
        let nonce = attr(fields.next().ok_or(ScramError::Malformed)?, 'r')?;
        if !printable_nonce(nonce) {
            return Err(ScramError::Malformed);
        }
        self.username = unescape(user)?;
        if self.username.is_empty() {
            return Err(ScramError::Malformed);
        }
        self.state = State::GotClientFirst {
            gs2_header: format!("{cbind},{authzid},"),
            client_first_bare: bare.to_string(),
            client_nonce: nonce.to_string(),
        };
        Ok(&self.username)
    }

    /// The server-first message for the user's credentials (for an
    /// unknown user pass made-up credentials: the exchange then fails at
    /// the proof, as for a wrong password). `server_nonce`: random,
    /// printable, no comma.
    pub fn server_first(
        &mut self,
        creds: &ScramCredentials,
        server_nonce: &str,
    ) -> Result<String, ScramError> {
        let State::GotClientFirst {
            gs2_header,
            client_first_bare,
            client_nonce,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(ScramError::Malformed);
        };
        if creds.hash != self.hash || !printable_nonce(server_nonce) {
            return Err(ScramError::Malformed);
        }
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&creds.salt),
            creds.iterations
        );
        self.state = State::SentServerFirst {
            gs2_header,
            client_first_bare,
            server_first: server_first.clone(),
            nonce,
            stored_key: creds.stored_key.clone(),
            server_key: creds.server_key.clone(),
        };
        Ok(server_first)
    }

    /// The client-final message: on success the server-final message
    /// (`v=...`) to send with the CONNACK / AUTH 0x00.
    pub fn client_final(&mut self, msg: &[u8]) -> Result<String, ScramError> {
        let State::SentServerFirst {
            gs2_header,
            client_first_bare,
            server_first,
            nonce,
            stored_key,
            server_key,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(ScramError::Malformed);
        };
        let msg = std::str::from_utf8(msg).map_err(|_| ScramError::Malformed)?;
        let (without_proof, proof) = msg.rsplit_once(",p=").ok_or(ScramError::Malformed)?;
        let mut fields = without_proof.split(',');
        let binding = attr(fields.next().ok_or(ScramError::Malformed)?, 'c')?;
        let their_nonce = attr(fields.next().ok_or(ScramError::Malformed)?, 'r')?;
        if B64.decode(binding).ok().as_deref() != Some(gs2_header.as_bytes()) {
            return Err(ScramError::Mismatch);
        }
        if their_nonce != nonce {
            return Err(ScramError::Mismatch);
        }
        let proof = B64.decode(proof).map_err(|_| ScramError::Malformed)?;
        if proof.len() != stored_key.len() {
            return Err(ScramError::BadProof);
        }
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = self.hash.hmac(&stored_key, &[auth_message.as_bytes()]);
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let ok: bool = self.hash.hash(&client_key).ct_eq(&stored_key).into();
        if !ok {
            return Err(ScramError::BadProof);
        }
        let server_signature = self.hash.hmac(&server_key, &[auth_message.as_bytes()]);
        Ok(format!("v={}", B64.encode(server_signature)))
    }
}
