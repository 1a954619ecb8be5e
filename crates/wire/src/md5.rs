//! MD5 password authentication (`AuthenticationMD5Password`), for clients that still use it and
//! userlists that hold `md5...` secrets.

use md5::{Digest, Md5};

fn hex_md5(parts: &[&[u8]]) -> String {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    let digest = h.finalize();
    let mut s = String::with_capacity(32);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The stored form PostgreSQL keeps for md5 passwords: `"md5" + md5(password || user)`.
pub fn md5_secret(user: &str, password: &str) -> String {
    format!("md5{}", hex_md5(&[password.as_bytes(), user.as_bytes()]))
}

/// What a client answers to a salt, given the stored secret `md5...`:
/// `"md5" + md5(hex(md5(password || user)) || salt)`.
pub fn md5_response_from_secret(secret: &str, salt: [u8; 4]) -> Option<String> {
    let inner = secret.strip_prefix("md5")?;
    if inner.len() != 32 {
        return None;
    }
    Some(format!("md5{}", hex_md5(&[inner.as_bytes(), &salt])))
}

/// Checks a client's md5 response in constant time with respect to its content.
pub fn verify_md5_response(secret: &str, salt: [u8; 4], response: &str) -> bool {
    match md5_response_from_secret(secret, salt) {
        Some(expected) => constant_time_eq(expected.as_bytes(), response.as_bytes()),
        None => false,
    }
}

/// Compares two byte strings without an early exit on the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_secret() {
        // SELECT 'md5' || md5('secret' || 'alice')
        assert_eq!(
            md5_secret("alice", "secret"),
            "md54a0a68b43b6cd5cf266fa02f196e2371"
        );
        let secret = md5_secret("alice", "secret");
        let resp = md5_response_from_secret(&secret, [1, 2, 3, 4]).unwrap();
        assert!(verify_md5_response(&secret, [1, 2, 3, 4], &resp));
        assert!(!verify_md5_response(&secret, [1, 2, 3, 5], &resp));
    }
}
