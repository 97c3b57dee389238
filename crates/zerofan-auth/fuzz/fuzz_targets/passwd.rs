//! Arbitrary bytes as a password file: parsing never panics; an accepted
//! file writes back to text that parses to the same entries; verifying
//! never panics (only cheap entries are verified, so a fuzzed iteration
//! count cannot stall the run).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerofan_auth::passwd::{PasswordFile, PasswordHash};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let file = match PasswordFile::parse(&text) {
        Ok(f) => f,
        Err(e) => {
            assert!(e.line >= 1 && e.line <= text.split('\n').count());
            return;
        }
    };
    let again = PasswordFile::parse(&file.to_string()).expect("our own output parses");
    assert_eq!(file.len(), again.len());
    for user in file.users() {
        let hash = file.get(user).expect("listed user has a hash");
        assert_eq!(Some(hash), again.get(user), "round trip of {user:?}");
        let cheap = match hash {
            PasswordHash::Sha512 { .. } => true,
            PasswordHash::Pbkdf2Sha512 { iterations, .. } => *iterations <= 8,
        };
        if cheap {
            assert!(!file.verify(user, b"\xffnot the password"));
        }
    }
});
