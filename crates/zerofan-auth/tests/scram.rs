//! SCRAM server exchanges: the RFC 7677 SCRAM-SHA-256 example message for
//! message, SCRAM-SHA-512 against a mosquitto `$7$` entry with a client
//! written here, and the refusals.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha512};
use zerofan_auth::scram::{ScramCredentials, ScramError, ScramHash, ScramServer};
use zerofan_auth::PasswordFile;

/// RFC 7677 section 3: user "user", password "pencil".
#[test]
fn rfc7677_sha256_example() {
    let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    let creds = ScramCredentials::from_password(ScramHash::Sha256, b"pencil", &salt, 4096);
    let mut s = ScramServer::new(ScramHash::from_method("SCRAM-SHA-256").unwrap());
    assert_eq!(
        s.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap(),
        "user"
    );
    let first = s
        .server_first(&creds, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
        .unwrap();
    assert_eq!(
        first,
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    );
    let last = s
        .client_final(
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
              p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        )
        .unwrap();
    assert_eq!(last, "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
}

/// The RFC 7677 user stored as a PostgreSQL-style `SCRAM-SHA-256$` entry
/// (keys computed independently with Python's hashlib): the entry verifies
/// the plain password, gives the same credentials as the password, and the
/// RFC's exchange succeeds against it.
const RFC_ENTRY: &str = "user:SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";

#[test]
fn scram_sha256_entry_holds_the_rfc_credentials() {
    let file = PasswordFile::parse(RFC_ENTRY).unwrap();
    assert!(file.verify("user", b"pencil"));
    assert!(!file.verify("user", b"pencil!"));
    assert_eq!(file.to_string().trim_end(), RFC_ENTRY);
    let creds = ScramCredentials::from_password_hash(file.get("user").unwrap()).unwrap();
    let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    assert_eq!(
        creds,
        ScramCredentials::from_password(ScramHash::Sha256, b"pencil", &salt, 4096)
    );
    let mut s = ScramServer::new(ScramHash::Sha256);
    s.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
    s.server_first(&creds, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
        .unwrap();
    let last = s
        .client_final(
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
              p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        )
        .unwrap();
    assert_eq!(last, "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    // A fresh entry round-trips through the file format.
    let mut f = PasswordFile::new();
    f.set_scram_sha256("bob", b"secret", 64).unwrap();
    let again = PasswordFile::parse(&f.to_string()).unwrap();
    assert!(again.verify("bob", b"secret"));
    assert_eq!(
        ScramCredentials::from_password_hash(again.get("bob").unwrap())
            .unwrap()
            .hash,
        ScramHash::Sha256
    );
}

#[test]
fn bad_scram_sha256_entries_say_what_is_wrong() {
    for (entry, want) in [
        ("u:SCRAM-SHA-256$4096:c2FsdHNhbHQ=", "has the form"),
        (
            "u:SCRAM-SHA-256$x:c2FsdHNhbHQ=$AA==:AA==",
            "iteration count",
        ),
        ("u:SCRAM-SHA-256$4096:c2Fs$AA==:AA==", "expected 8 to 64"),
        ("u:SCRAM-SHA-256$4096:c2FsdHNhbHQ=$AA==:AA==", "expected 32"),
        (
            "u:SCRAM-SHA-256$4096:c2FsdHNhbHQ=$!!:AA==",
            "not valid base64",
        ),
    ] {
        let e = PasswordFile::parse(entry).unwrap_err();
        assert!(e.message.contains(want), "{entry}: {}", e.message);
    }
}

fn hmac512(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha512>::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// A SCRAM-SHA-512 client: the client-final message for `password`.
fn client_final(password: &[u8], client_first_bare: &str, server_first: &str) -> String {
    let mut parts = server_first.split(',');
    let nonce = &parts.next().unwrap()[2..];
    let salt = B64.decode(&parts.next().unwrap()[2..]).unwrap();
    let iterations: u32 = parts.next().unwrap()[2..].parse().unwrap();
    let mut salted = [0u8; 64];
    pbkdf2::pbkdf2_hmac::<Sha512>(password, &salt, iterations, &mut salted);
    let client_key = hmac512(&salted, b"Client Key");
    let stored = Sha512::digest(&client_key);
    let without = format!("c=biws,r={nonce}");
    let auth = format!("{client_first_bare},{server_first},{without}");
    let sig = hmac512(&stored, auth.as_bytes());
    let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
    format!("{without},p={}", B64.encode(proof))
}

#[test]
fn sha512_against_a_mosquitto_password_entry() {
    let mut f = PasswordFile::new();
    f.set_with_iterations("alice", b"wonderland", 100).unwrap();
    let f = PasswordFile::parse(&f.to_string()).unwrap();
    let creds = ScramCredentials::from_password_hash(f.get("alice").unwrap()).unwrap();
    for (password, want_ok) in [(&b"wonderland"[..], true), (&b"wrong"[..], false)] {
        let mut s = ScramServer::new(ScramHash::Sha512);
        assert_eq!(s.client_first(b"n,,n=alice,r=abc").unwrap(), "alice");
        let first = s.server_first(&creds, "XYZ").unwrap();
        let fin = client_final(password, "n=alice,r=abc", &first);
        let r = s.client_final(fin.as_bytes());
        assert_eq!(r.is_ok(), want_ok, "{r:?}");
        if !want_ok {
            assert_eq!(r.unwrap_err(), ScramError::BadProof);
        }
    }
}

#[test]
fn refusals() {
    let creds = ScramCredentials::from_password(ScramHash::Sha512, b"pw", b"salt", 10);
    let first = |msg: &[u8]| {
        ScramServer::new(ScramHash::Sha512)
            .client_first(msg)
            .map(str::to_string)
    };
    assert_eq!(
        first(b"p=tls-unique,,n=u,r=a"),
        Err(ScramError::ChannelBinding)
    );
    assert_eq!(first(b"x,,n=u,r=a"), Err(ScramError::Malformed));
    assert_eq!(first(b"n,,n=u"), Err(ScramError::Malformed));
    assert_eq!(first(b"n,,n=a=2Cb=3Dc,r=x").as_deref(), Ok("a,b=c"));
    assert_eq!(first(b"n,,n=a=ZZ,r=x"), Err(ScramError::Malformed));
    assert_eq!(first(b"n,,n=,r=x"), Err(ScramError::Malformed));
    // Nonce changed by the client, or binding data changed.
    let mut s = ScramServer::new(ScramHash::Sha512);
    s.client_first(b"n,,n=u,r=abc").unwrap();
    let sf = s.server_first(&creds, "XYZ").unwrap();
    let fin = client_final(b"pw", "n=u,r=abc", &sf).replace("r=abcXYZ", "r=abcXYQ");
    assert_eq!(s.client_final(fin.as_bytes()), Err(ScramError::Mismatch));
    let mut s = ScramServer::new(ScramHash::Sha512);
    s.client_first(b"y,,n=u,r=abc").unwrap();
    let sf = s.server_first(&creds, "XYZ").unwrap();
    // The client says "n,," (biws) after "y,,": mismatch.
    let fin = client_final(b"pw", "n=u,r=abc", &sf);
    assert_eq!(s.client_final(fin.as_bytes()), Err(ScramError::Mismatch));
    // Out of turn.
    let mut s = ScramServer::new(ScramHash::Sha512);
    assert_eq!(
        s.client_final(b"c=biws,r=x,p=AA=="),
        Err(ScramError::Malformed)
    );
    // Credentials of the other hash.
    let mut s = ScramServer::new(ScramHash::Sha256);
    s.client_first(b"n,,n=u,r=abc").unwrap();
    assert_eq!(s.server_first(&creds, "XYZ"), Err(ScramError::Malformed));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
    /// Whatever a client sends, the exchange refuses or goes on; it never
    /// panics, and never accepts a proof it did not compute.
    #[test]
    fn arbitrary_messages_never_panic(
        first in "[nyp]?[=,a-z0-9]{0,6},[a=]{0,3},(n=[a-z=2CD]{0,6},r=[!-~]{0,8})?[,a-z=]{0,8}",
        last in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120),
    ) {
        let creds = ScramCredentials::from_password(ScramHash::Sha256, b"pw", b"salt", 2);
        let mut s = ScramServer::new(ScramHash::Sha256);
        if s.client_first(first.as_bytes()).is_ok() {
            let sf = s.server_first(&creds, "srv").unwrap();
            assert!(sf.contains("srv"));
            assert!(s.client_final(&last).is_err());
        }
    }
}
