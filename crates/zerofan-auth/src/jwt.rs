//! JSON Web Tokens in the password field (the common convention of MQTT
//! brokers that take tokens).
//!
//! [`JwtVerifier`] holds the keys (an HMAC secret, a PEM public key, or a
//! JWKS document, passed in as text: this crate reads no file) and checks
//! a token with [`JwtVerifier::verify`]: the signature with one of the
//! configured algorithms (`jsonwebtoken`, which does the cryptography with
//! `ring`), `exp` and `nbf` against the time passed in (with a leeway),
//! and that the username claim (default `sub`) equals the CONNECT
//! username. The time comes in as Unix seconds, so this stays sans-IO and
//! a test can move the clock.
//!
//! A password that is not shaped like a JWT is [`JwtRefusal::NotAToken`]:
//! the broker's chain passes it on to the next source instead of refusing.
//!
//! Optionally a claim (`acl_claim`, EMQX's `acl`) carries the client's
//! permissions as `{"pub": [filters], "sub": [filters], "all": [filters]}`;
//! `${username}` and `${clientid}` in a filter stand for the client's. It
//! becomes an [`Acl`] of `pattern` rules that replaces the listener's ACL
//! for that connection.

use crate::acl::Acl;
use crate::topic::validate_filter;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use std::fmt::Write;
use std::str::FromStr;

/// Most keys a JWKS document may hold (each token tries the keys of its
/// algorithm family, so this bounds the work per login).
pub const MAX_KEYS: usize = 64;
/// Most topic filters the ACL claim may carry.
pub const MAX_ACL_FILTERS: usize = 256;

/// Where the keys come from (the content of the configured file).
#[derive(Clone, Copy, Debug)]
pub enum KeyMaterial<'a> {
    /// `secret_file`: the HMAC secret, its bytes as they are (a trailing
    /// line break, as editors leave one, is not part of it).
    Secret(&'a [u8]),
    /// `public_key_file`: one PEM public key (RSA, EC or Ed25519).
    PublicKeyPem(&'a [u8]),
    /// `jwks_file`: a JSON Web Key Set.
    Jwks(&'a str),
}

/// How tokens are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtSettings {
    /// Accepted `alg` values; empty: every algorithm the keys can verify.
    pub algorithms: Vec<Algorithm>,
    /// The claim that must equal the CONNECT username.
    pub username_claim: String,
    /// The claim carrying the client's permissions, if any.
    pub acl_claim: Option<String>,
    /// Seconds of clock difference tolerated on `exp` and `nbf`.
    pub leeway_s: u64,
}

impl Default for JwtSettings {
    fn default() -> Self {
        JwtSettings {
            algorithms: Vec::new(),
            username_claim: "sub".into(),
            acl_claim: None,
            leeway_s: 0,
        }
    }
}

/// The keys or settings cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwtError {
    /// An algorithm name that is not one of `HS256` … `EdDSA`.
    #[error("unknown JWT algorithm {0:?}")]
    UnknownAlgorithm(String),
    /// The key material is not what it claims to be.
    #[error("bad key: {0}")]
    BadKey(String),
    /// No key can verify any configured algorithm.
    #[error("no key for the configured algorithms")]
    NoUsableKey,
}

/// Parse an algorithm name as `alg` spells it (`RS256`).
pub fn parse_algorithm(name: &str) -> Result<Algorithm, JwtError> {
    Algorithm::from_str(name).map_err(|_| JwtError::UnknownAlgorithm(name.into()))
}

/// Why a token is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwtRefusal {
    /// Not shaped like a JWT: not this source's to decide.
    NotAToken,
    /// JWT-shaped, but its parts or claims cannot be read.
    Malformed,
    /// Its `alg` is not accepted, or no key of its family is configured.
    WrongAlgorithm,
    /// No key verifies its signature.
    BadSignature,
    /// `exp` has passed.
    Expired,
    /// `nbf` has not come yet.
    NotYetValid,
    /// The username claim is missing or differs from the CONNECT username.
    WrongUser,
    /// The ACL claim is not a valid permission set.
    BadAcl,
}

impl JwtRefusal {
    /// True when the token itself is not genuine (MQTT 5 CONNACK 0x86, bad
    /// username or password); false when it is genuine but not good for
    /// this login now (0x87, not authorized).
    pub fn is_bad_credentials(&self) -> bool {
        matches!(
            self,
            JwtRefusal::NotAToken
                | JwtRefusal::Malformed
                | JwtRefusal::WrongAlgorithm
                | JwtRefusal::BadSignature
        )
    }
}

/// A token that was accepted.
#[derive(Debug)]
pub struct JwtLogin {
    /// `exp` (Unix seconds), when the token has one.
    pub expires_at: Option<u64>,
    /// The permissions from the ACL claim, when configured and present.
    pub acl: Option<Acl>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Hmac,
    Rsa,
    Ec,
    Ed,
}

fn family(alg: Algorithm) -> Family {
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => Family::Hmac,
        Algorithm::ES256 | Algorithm::ES384 => Family::Ec,
        Algorithm::EdDSA => Family::Ed,
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => Family::Rsa,
    }
}

const ALL: [Algorithm; 12] = [
    Algorithm::HS256,
    Algorithm::HS384,
    Algorithm::HS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::EdDSA,
];

struct Key {
    kid: Option<String>,
    family: Family,
    key: DecodingKey,
}

/// Checks tokens against configured keys (see the module documentation).
pub struct JwtVerifier {
    keys: Vec<Key>,
    algorithms: Vec<Algorithm>,
    settings: JwtSettings,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are secrets (HMAC) or at least not worth printing.
        f.debug_struct("JwtVerifier")
            .field("keys", &self.keys.len())
            .field("algorithms", &self.algorithms)
            .field("settings", &self.settings)
            .finish()
    }
}

fn pem_key(pem: &[u8]) -> Result<(Family, DecodingKey), JwtError> {
    if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
        return Ok((Family::Rsa, k));
    }
    if let Ok(k) = DecodingKey::from_ec_pem(pem) {
        return Ok((Family::Ec, k));
    }
    if let Ok(k) = DecodingKey::from_ed_pem(pem) {
        return Ok((Family::Ed, k));
    }
    Err(JwtError::BadKey(
        "not a PEM RSA, EC or Ed25519 public key".into(),
    ))
}

fn jwks_keys(text: &str) -> Result<Vec<Key>, JwtError> {
    let set: JwkSet = serde_json::from_str(text)
        .map_err(|e| JwtError::BadKey(format!("not a JWKS document: {e}")))?;
    if set.keys.len() > MAX_KEYS {
        return Err(JwtError::BadKey(format!("more than {MAX_KEYS} keys")));
    }
    let mut keys = Vec::with_capacity(set.keys.len());
    for jwk in &set.keys {
        let family = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Family::Rsa,
            AlgorithmParameters::EllipticCurve(_) => Family::Ec,
            AlgorithmParameters::OctetKey(_) => Family::Hmac,
            AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| {
            JwtError::BadKey(format!(
                "key {}: {e}",
                jwk.common.key_id.as_deref().unwrap_or("(no kid)")
            ))
        })?;
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            family,
            key,
        });
    }
    Ok(keys)
}

impl JwtVerifier {
    /// Keys from `material`, checked with `settings`.
    pub fn new(settings: JwtSettings, material: KeyMaterial<'_>) -> Result<Self, JwtError> {
        let keys = match material {
            KeyMaterial::Secret(s) => {
                let s = s.strip_suffix(b"\n").unwrap_or(s);
                let s = s.strip_suffix(b"\r").unwrap_or(s);
                if s.is_empty() {
                    return Err(JwtError::BadKey("empty secret".into()));
                }
                vec![Key {
                    kid: None,
                    family: Family::Hmac,
                    key: DecodingKey::from_secret(s),
                }]
            }
            KeyMaterial::PublicKeyPem(pem) => {
                let (family, key) = pem_key(pem)?;
                vec![Key {
                    kid: None,
                    family,
                    key,
                }]
            }
            KeyMaterial::Jwks(text) => jwks_keys(text)?,
        };
        let usable = |a: &Algorithm| keys.iter().any(|k| k.family == family(*a));
        let algorithms: Vec<Algorithm> = if settings.algorithms.is_empty() {
            ALL.iter().copied().filter(usable).collect()
        } else {
            settings.algorithms.clone()
        };
        if !algorithms.iter().any(usable) {
            return Err(JwtError::NoUsableKey);
        }
        Ok(JwtVerifier {
            keys,
            algorithms,
            settings,
        })
    }

    /// The algorithms accepted.
    pub fn algorithms(&self) -> &[Algorithm] {
        &self.algorithms
    }

    /// Check the token in `password` for a login as `username` at
    /// `now_unix` (seconds since the Unix epoch).
    pub fn verify(
        &self,
        password: &[u8],
        username: Option<&str>,
        now_unix: u64,
    ) -> Result<JwtLogin, JwtRefusal> {
        let token = std::str::from_utf8(password).map_err(|_| JwtRefusal::NotAToken)?;
        if token.bytes().filter(|&b| b == b'.').count() != 2 {
            return Err(JwtRefusal::NotAToken);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| JwtRefusal::NotAToken)?;
        if !self.algorithms.contains(&header.alg) {
            return Err(JwtRefusal::WrongAlgorithm);
        }
        let fam = family(header.alg);
        let mut validation = Validation::new(header.alg);
        // Time and audience are checked here, with the time passed in.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let mut any_key = false;
        let mut claims: Option<Map<String, Value>> = None;
        for k in self.keys.iter().filter(|k| k.family == fam) {
            if let (Some(want), Some(have)) = (&header.kid, &k.kid) {
                if want != have {
                    continue;
                }
            }
            any_key = true;
            match jsonwebtoken::decode::<Map<String, Value>>(token, &k.key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) => match e.kind() {
                    jsonwebtoken::errors::ErrorKind::InvalidSignature => {}
                    _ => return Err(JwtRefusal::Malformed),
                },
            }
        }
        if !any_key {
            return Err(JwtRefusal::BadSignature);
        }
        let claims = claims.ok_or(JwtRefusal::BadSignature)?;
        let leeway = self.settings.leeway_s;
        let time = |name: &str| -> Result<Option<u64>, JwtRefusal> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => match (v.as_u64(), v.as_f64()) {
                    (Some(n), _) => Ok(Some(n)),
                    // Fractional or negative: round toward the past.
                    (None, Some(f)) if f.is_finite() => Ok(Some(f.max(0.0) as u64)),
                    _ => Err(JwtRefusal::Malformed),
                },
            }
        };
        let exp = time("exp")?;
        if let Some(exp) = exp {
            if now_unix > exp.saturating_add(leeway) {
                return Err(JwtRefusal::Expired);
            }
        }
        if let Some(nbf) = time("nbf")? {
            if now_unix.saturating_add(leeway) < nbf {
                return Err(JwtRefusal::NotYetValid);
            }
        }
        let claimed = claims
            .get(&self.settings.username_claim)
            .and_then(Value::as_str);
        match (claimed, username) {
            (Some(c), Some(u)) if c == u => {}
            _ => return Err(JwtRefusal::WrongUser),
        }
        let acl = match self
            .settings
            .acl_claim
            .as_ref()
            .and_then(|name| claims.get(name))
        {
            Some(v) => Some(acl_from_claim(v)?),
            None => None,
        };
        Ok(JwtLogin {
            expires_at: exp,
            acl,
        })
    }
}

/// EMQX's `{"pub": [...], "sub": [...], "all": [...]}` as an [`Acl`] of
/// `pattern` rules (which apply to every client, `%u` / `%c` substituted).
pub fn acl_from_claim(v: &Value) -> Result<Acl, JwtRefusal> {
    let obj = v.as_object().ok_or(JwtRefusal::BadAcl)?;
    let mut text = String::new();
    let mut n = 0usize;
    for (key, access) in [("pub", "write"), ("sub", "read"), ("all", "readwrite")] {
        let Some(list) = obj.get(key) else { continue };
        let list = list.as_array().ok_or(JwtRefusal::BadAcl)?;
        for f in list {
            n += 1;
            if n > MAX_ACL_FILTERS {
                return Err(JwtRefusal::BadAcl);
            }
            let f = f.as_str().ok_or(JwtRefusal::BadAcl)?;
            // `%` would be read as a placeholder; line breaks as new rules.
            if f.contains(['\n', '\r', '\0', '%']) || f.trim() != f {
                return Err(JwtRefusal::BadAcl);
            }
            let f = f.replace("${username}", "%u").replace("${clientid}", "%c");
            if validate_filter(&f).is_err() {
                return Err(JwtRefusal::BadAcl);
            }
            let _ = writeln!(text, "pattern {access} {f}");
        }
    }
    Acl::parse(&text).map_err(|_| JwtRefusal::BadAcl)
}
