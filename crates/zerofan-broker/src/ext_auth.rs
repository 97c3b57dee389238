//! Authentication outside the password file: the `auth_jwt` settings and
//! reading their key files into the core's [`JwtAuth`].

use crate::core::JwtAuth;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};
use zerofan_auth::jwt::parse_algorithm;
use zerofan_auth::{JwtSettings, JwtVerifier, KeyMaterial};

/// `auth_jwt = { ... }`: a JSON Web Token in the password field. Exactly
/// one of `secret_file`, `public_key_file`, `jwks_file`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// HMAC secret (HS256/384/512), the file's bytes (a final line break
    /// is not part of it).
    pub secret_file: Option<PathBuf>,
    /// One PEM public key: RSA (RS*, PS*), EC (ES256/384) or Ed25519.
    pub public_key_file: Option<PathBuf>,
    /// A JSON Web Key Set; a token's `kid` picks its key.
    pub jwks_file: Option<PathBuf>,
    /// Accepted `alg` values (`["RS256"]`); empty: every algorithm the keys
    /// can verify.
    #[serde(default)]
    pub algorithms: Vec<String>,
    /// The claim that must equal the CONNECT username.
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// The claim carrying the client's permissions as EMQX writes them
    /// (`{"pub": [...], "sub": [...], "all": [...]}`); they replace the
    /// listener's ACL for that connection. Unset: the listener's ACL.
    pub acl_claims: Option<String>,
    /// Seconds of clock difference tolerated on `exp` and `nbf`.
    #[serde(default)]
    pub leeway_s: u64,
    /// Close the connection (DISCONNECT 0x87) when its token expires.
    #[serde(default = "yes")]
    pub disconnect_on_expiry: bool,
}

fn default_username_claim() -> String {
    "sub".into()
}

fn yes() -> bool {
    true
}

impl JwtConfig {
    /// What `--test-config` and loading reject before reading files.
    pub fn validate(&self) -> Result<(), &'static str> {
        let files = [
            self.secret_file.is_some(),
            self.public_key_file.is_some(),
            self.jwks_file.is_some(),
        ];
        if files.iter().filter(|&&f| f).count() != 1 {
            return Err("needs exactly one of secret_file, public_key_file, jwks_file");
        }
        if self.algorithms.iter().any(|a| parse_algorithm(a).is_err()) {
            return Err("algorithms: each must be one of HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA");
        }
        if self.username_claim.is_empty() {
            return Err("username_claim must not be empty");
        }
        Ok(())
    }

    /// Read the key file and build the verifier; the error names the file.
    pub fn load(&self) -> Result<JwtAuth, String> {
        self.validate().map_err(|e| format!("auth_jwt: {e}"))?;
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| format!("auth_jwt: cannot read {}: {e}", p.display()))
        };
        let (path, bytes) = match (&self.secret_file, &self.public_key_file, &self.jwks_file) {
            (Some(p), _, _) | (_, Some(p), _) | (_, _, Some(p)) => (p, read(p)?),
            _ => return Err("auth_jwt: no key file".into()),
        };
        let material = if self.secret_file.is_some() {
            KeyMaterial::Secret(&bytes)
        } else if self.public_key_file.is_some() {
            KeyMaterial::PublicKeyPem(&bytes)
        } else {
            KeyMaterial::Jwks(
                std::str::from_utf8(&bytes)
                    .map_err(|_| format!("auth_jwt: {}: not UTF-8", path.display()))?,
            )
        };
        let settings = JwtSettings {
            algorithms: self
                .algorithms
                .iter()
                .filter_map(|a| parse_algorithm(a).ok())
                .collect(),
            username_claim: self.username_claim.clone(),
            acl_claim: self.acl_claims.clone(),
            leeway_s: self.leeway_s,
        };
        let verifier = JwtVerifier::new(settings, material)
            .map_err(|e| format!("auth_jwt: {}: {e}", path.display()))?;
        let unix = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(JwtAuth {
            verifier,
            disconnect_on_expiry: self.disconnect_on_expiry,
            leeway_s: self.leeway_s,
            anchor: (Instant::now(), unix),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn auth_jwt_settings_are_checked() {
        let c = Config::from_toml("auth_jwt = { secret_file = \"s\" }\n", "x").unwrap();
        let j = c.auth_jwt.unwrap();
        assert_eq!(j.username_claim, "sub");
        assert!(j.disconnect_on_expiry);
        for bad in [
            "auth_jwt = { }\n",
            "auth_jwt = { secret_file = \"s\", jwks_file = \"j\" }\n",
            "auth_jwt = { secret_file = \"s\", algorithms = [\"XS1\"] }\n",
            "auth_jwt = { secret_file = \"s\", username_claim = \"\" }\n",
            "auth_jwt = { secret_file = \"s\", secret = \"inline\" }\n",
        ] {
            let e = Config::from_toml(bad, "x").unwrap_err().to_string();
            assert!(e.contains("auth_jwt") || e.contains("secret"), "{bad}: {e}");
        }
    }

    #[test]
    fn unreadable_or_bad_keys_are_named() {
        let dir = std::env::temp_dir().join(format!("zerofan-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = dir.join("k.pem");
        std::fs::write(&pem, "not a key").unwrap();
        let text = format!("auth_jwt = {{ public_key_file = {:?} }}\n", pem);
        let c = Config::from_toml(&text, "x").unwrap();
        let e = crate::security::load(&c).unwrap_err().to_string();
        assert!(e.contains("k.pem") && e.contains("bad key"), "{e}");
        let missing = dir.join("missing.json");
        let text = format!("auth_jwt = {{ jwks_file = {:?} }}\n", missing);
        let c = Config::from_toml(&text, "x").unwrap();
        let e = crate::security::load(&c).unwrap_err().to_string();
        assert!(e.contains("missing.json"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// What a failed HTTP call (time-out, status other than 200, unreadable
/// answer) does to the login.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum FailPolicy {
    /// Refuse it (0x88 server unavailable, 3.1.1: 3).
    #[default]
    Deny,
    /// Let it in.
    Allow,
}

/// `auth_http = { url = "http://...", ... }`: logins decided by the site's
/// HTTP service with EMQX's conventions (see `core::http_auth`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpAuthConfig {
    /// `POST` here with `{"username", "password", "clientid", "address",
    /// "listener"}`; `http://` only.
    pub url: String,
    /// `POST` here per PUBLISH and SUBSCRIBE filter the ACL file allows,
    /// with `{"username", "clientid", "address", "topic", "action"}`.
    pub acl_url: Option<String>,
    /// Milliseconds to wait for an answer.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Seconds an answer is reused (0: never cached).
    #[serde(default = "default_cache_ttl_s")]
    pub cache_ttl_s: u64,
    /// Most answers cached (0: none).
    #[serde(default = "default_cache_size")]
    pub cache_size: usize,
    /// What a failed call does.
    #[serde(default)]
    pub fail: FailPolicy,
    /// Most CONNECTs waiting for an answer at once; more are handled as
    /// failed calls.
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
}

fn default_timeout_ms() -> u64 {
    5000
}
fn default_cache_ttl_s() -> u64 {
    60
}
fn default_cache_size() -> usize {
    10_000
}
fn default_max_pending() -> usize {
    1024
}

impl HttpAuthConfig {
    /// What `--test-config` and loading reject.
    pub fn validate(&self) -> Result<(), &'static str> {
        let uri: hyper::Uri = self.url.parse().map_err(|_| "url is not a valid URL")?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err("url must be http://HOST[:PORT]/PATH (https is not supported yet)");
        }
        if let Some(acl) = &self.acl_url {
            let uri: hyper::Uri = acl.parse().map_err(|_| "acl_url is not a valid URL")?;
            if uri.scheme_str() != Some("http") || uri.host().is_none() {
                return Err("acl_url must be http://HOST[:PORT]/PATH");
            }
        }
        if self.timeout_ms == 0 {
            return Err("timeout_ms must be at least 1");
        }
        if self.max_pending == 0 {
            return Err("max_pending must be at least 1");
        }
        Ok(())
    }

    /// The core's view.
    pub fn settings(&self) -> crate::core::HttpAuthSettings {
        crate::core::HttpAuthSettings {
            url: self.url.as_str().into(),
            acl_url: self.acl_url.as_deref().map(Into::into),
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            cache_ttl: std::time::Duration::from_secs(self.cache_ttl_s),
            cache_size: self.cache_size,
            fail_allow: self.fail == FailPolicy::Allow,
            max_pending: self.max_pending,
        }
    }
}

#[cfg(test)]
mod http_tests {
    use crate::config::Config;

    #[test]
    fn auth_http_settings_are_checked() {
        let c =
            Config::from_toml("auth_http = { url = \"http://127.0.0.1:8080/a\" }\n", "x").unwrap();
        let h = c.auth_http.unwrap();
        assert_eq!(
            (h.timeout_ms, h.cache_ttl_s, h.cache_size),
            (5000, 60, 10_000)
        );
        assert_eq!(h.fail, super::FailPolicy::Deny);
        assert!(!h.settings().fail_allow);
        for bad in [
            "auth_http = { }\n",
            "auth_http = { url = \"https://a/b\" }\n",
            "auth_http = { url = \"not a url\" }\n",
            "auth_http = { url = \"http://a/b\", acl_url = \"ftp://a/c\" }\n",
            "auth_http = { url = \"http://a/b\", timeout_ms = 0 }\n",
            "auth_http = { url = \"http://a/b\", fail = \"maybe\" }\n",
            "auth_http = { url = \"http://a/b\", cache = 1 }\n",
        ] {
            assert!(Config::from_toml(bad, "x").is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod fuzz_seeds {
    use crate::config::Config;

    /// The `toml_config` fuzz seeds for these settings keep parsing (or
    /// failing) as they did.
    #[test]
    fn toml_config_seeds() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/toml_config");
        let good = std::fs::read_to_string(dir.join("auth-jwt-http")).unwrap();
        let c = Config::from_toml(&good, "seed").unwrap();
        assert_eq!(c.auth_jwt.unwrap().leeway_s, 30);
        assert_eq!(c.auth_http.unwrap().max_pending, 16);
        let bad = std::fs::read_to_string(dir.join("bad-auth")).unwrap();
        assert!(Config::from_toml(&bad, "seed").is_err());
    }
}
