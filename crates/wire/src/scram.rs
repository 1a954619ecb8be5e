//! Server side of SCRAM-SHA-256 (RFC 5802/7677 as PostgreSQL uses it), so pgmemo can check
//! client passwords from a userlist without ever holding them in clear text.
//!
//! Channel binding is not offered (pgmemo advertises plain `SCRAM-SHA-256`), so a client that
//! insists on it (`p=` in the GS2 header) is refused.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::md5::constant_time_eq;

type HmacSha256 = Hmac<Sha256>;

/// The mechanism name pgmemo offers.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// PostgreSQL's default iteration count for new secrets.
pub const DEFAULT_ITERATIONS: u32 = 4096;

/// Why a SCRAM exchange failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("channel binding is not supported")]
    ChannelBindingUnsupported,
    #[error("invalid SCRAM secret")]
    InvalidSecret,
    #[error("nonce mismatch")]
    NonceMismatch,
    #[error("password authentication failed")]
    WrongPassword,
}

/// A stored SCRAM verifier: `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramSecret {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// A salt for `user` that is the same at every attempt and that only a holder of `seed` can
/// compute (see [`ScramSecret::mock`]).
fn user_salt(user: &str, seed: &[u8]) -> [u8; 16] {
    let mac = hmac(seed, user.as_bytes());
    let mut salt = [0u8; 16];
    salt.copy_from_slice(&mac[..16]);
    salt
}

/// A password as SCRAM uses it (RFC 4013 SASLprep), or unchanged when SASLprep refuses it
/// (prohibited characters), as PostgreSQL's `pg_saslprep` and libpq fall back to the raw
/// bytes.
fn saslprep(password: &str) -> std::borrow::Cow<'_, str> {
    stringprep::saslprep(password).unwrap_or(std::borrow::Cow::Borrowed(password))
}

fn key32(bytes: &[u8]) -> Result<[u8; 32], ScramError> {
    bytes.try_into().map_err(|_| ScramError::InvalidSecret)
}

impl ScramSecret {
    /// Derives a verifier from a clear-text password, the way PostgreSQL does for
    /// `password_encryption = scram-sha-256`: of the password after SASLprep, as clients
    /// (libpq, postgres-protocol) prepare it before they prove it.
    pub fn from_password(password: &str, salt: &[u8], iterations: u32) -> ScramSecret {
        let prepared = saslprep(password);
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2::<HmacSha256>(prepared.as_bytes(), salt, iterations, &mut salted)
            .expect("HMAC accepts any key length");
        let client_key = hmac(&salted, b"Client Key");
        ScramSecret {
            iterations,
            salt: salt.to_vec(),
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    /// A verifier from a clear-text password with a fresh random salt.
    pub fn generate(password: &str) -> ScramSecret {
        let mut salt = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut salt);
        Self::from_password(password, &salt, DEFAULT_ITERATIONS)
    }

    /// The verifier of a plain-text `password`, salted as [`ScramSecret::mock`] salts an
    /// unknown user's: a salt stable per user and `seed`, so that the salt a client is shown
    /// neither changes from one attempt to the next (a fresh random salt would tell a known
    /// user from an unknown one) nor can be computed without the seed.
    pub fn from_password_for(password: &str, user: &str, seed: &[u8]) -> ScramSecret {
        Self::from_password(password, &user_salt(user, seed), DEFAULT_ITERATIONS)
    }

    /// A verifier nobody knows the password of, stable per user name and `seed` (keep the
    /// seed secret: a salt anyone can compute shows that the user does not exist), so that
    /// an unknown user goes through the same exchange as a known one and fails only at the
    /// end (PostgreSQL's "mock authentication": no hint whether a role exists).
    pub fn mock(user: &str, nonce_seed: &[u8]) -> ScramSecret {
        let salt = user_salt(user, nonce_seed);
        let mut stored_key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut stored_key);
        ScramSecret {
            iterations: DEFAULT_ITERATIONS,
            salt: salt.to_vec(),
            stored_key,
            server_key: stored_key,
        }
    }

    /// Parses PostgreSQL's textual secret format.
    pub fn parse(s: &str) -> Result<ScramSecret, ScramError> {
        let rest = s
            .strip_prefix("SCRAM-SHA-256$")
            .ok_or(ScramError::InvalidSecret)?;
        let (iter_salt, keys) = rest.split_once('$').ok_or(ScramError::InvalidSecret)?;
        let (iter, salt) = iter_salt.split_once(':').ok_or(ScramError::InvalidSecret)?;
        let (stored, server) = keys.split_once(':').ok_or(ScramError::InvalidSecret)?;
        let decode = |v: &str| B64.decode(v).map_err(|_| ScramError::InvalidSecret);
        Ok(ScramSecret {
            iterations: iter.parse().map_err(|_| ScramError::InvalidSecret)?,
            salt: decode(salt)?,
            stored_key: key32(&decode(stored)?)?,
            server_key: key32(&decode(server)?)?,
        })
    }

    /// Formats the secret the way `pg_authid.rolpassword` stores it.
    pub fn to_text(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

/// One server-side SCRAM exchange. Call [`ScramServer::client_first`] with the data of the
/// SASLInitialResponse, send the returned server-first message, then
/// [`ScramServer::client_final`] with the SASLResponse and send its server-final message.
#[derive(Debug)]
pub struct ScramServer {
    secret: ScramSecret,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// What a successful exchange yields besides the server-final message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramOutcome {
    /// The `v=...` message for AuthenticationSASLFinal.
    pub server_final: String,
    /// The client's ClientKey, recovered from its proof: with it pgmemo can log in to a server
    /// that holds the same verifier, without knowing the password (as PgBouncer does).
    pub client_key: [u8; 32],
}

fn attr(part: Option<&str>, name: char) -> Result<&str, ScramError> {
    let part = part.ok_or(ScramError::Malformed("missing attribute"))?;
    let mut chars = part.chars();
    if chars.next() != Some(name) || chars.next() != Some('=') {
        return Err(ScramError::Malformed("unexpected attribute"));
    }
    Ok(&part[2..])
}

impl ScramServer {
    /// Handles client-first-message; returns the exchange and the server-first-message.
    pub fn client_first(secret: ScramSecret, data: &[u8]) -> Result<(Self, String), ScramError> {
        let msg = std::str::from_utf8(data).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (cbind, rest) = msg
            .split_once(',')
            .ok_or(ScramError::Malformed("missing GS2 header"))?;
        match cbind {
            "n" | "y" => {}
            c if c.starts_with("p=") => return Err(ScramError::ChannelBindingUnsupported),
            _ => return Err(ScramError::Malformed("invalid channel binding flag")),
        }
        let (_authzid, bare) = rest
            .split_once(',')
            .ok_or(ScramError::Malformed("missing GS2 header"))?;
        let mut parts = bare.split(',');
        let _user = attr(parts.next(), 'n')?;
        let client_nonce = attr(parts.next(), 'r')?;
        if client_nonce.is_empty()
            || !client_nonce
                .bytes()
                .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
        {
            return Err(ScramError::Malformed("invalid nonce"));
        }
        let mut raw = [0u8; 18];
        rand::thread_rng().fill_bytes(&mut raw);
        let nonce = format!("{client_nonce}{}", B64.encode(raw));
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&secret.salt),
            secret.iterations
        );
        Ok((
            ScramServer {
                secret,
                client_first_bare: bare.to_owned(),
                server_first: server_first.clone(),
                nonce,
            },
            server_first,
        ))
    }

    /// Handles client-final-message: checks the nonce and proof.
    pub fn client_final(self, data: &[u8]) -> Result<ScramOutcome, ScramError> {
        let msg = std::str::from_utf8(data).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof) = msg
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("missing proof"))?;
        let mut parts = without_proof.split(',');
        let cbind = attr(parts.next(), 'c')?;
        if cbind != "biws" && cbind != "eSws" {
            return Err(ScramError::ChannelBindingUnsupported);
        }
        let nonce = attr(parts.next(), 'r')?;
        if !constant_time_eq(nonce.as_bytes(), self.nonce.as_bytes()) {
            return Err(ScramError::NonceMismatch);
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("invalid proof encoding"))?;
        if proof.len() != 32 {
            return Err(ScramError::Malformed("invalid proof length"));
        }
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let client_signature = hmac(&self.secret.stored_key, auth_message.as_bytes());
        let mut client_key = [0u8; 32];
        for i in 0..32 {
            client_key[i] = proof[i] ^ client_signature[i];
        }
        let computed: [u8; 32] = Sha256::digest(client_key).into();
        if !constant_time_eq(&computed, &self.secret.stored_key) {
            return Err(ScramError::WrongPassword);
        }
        let server_signature = hmac(&self.secret.server_key, auth_message.as_bytes());
        Ok(ScramOutcome {
            server_final: format!("v={}", B64.encode(server_signature)),
            client_key,
        })
    }
}

/// The two keys a SCRAM verifier is made of on the client side: enough to log in to a server
/// that stores the same verifier, without the password. pgmemo recovers the ClientKey from a
/// client's proof (see [`ScramOutcome::client_key`]) and takes the ServerKey from its userlist.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramKeys {
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl std::fmt::Debug for ScramKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScramKeys(..)")
    }
}

/// Client side of SCRAM-SHA-256 driven by [`ScramKeys`] instead of a password. Call
/// [`ScramKeyClient::new`] for the client-first message, [`ScramKeyClient::server_first`] for
/// the client-final message, then [`ScramKeyClient::server_final`] to check the server.
#[derive(Debug)]
pub struct ScramKeyClient {
    keys: ScramKeys,
    client_first_bare: String,
    auth_message: Option<String>,
}

impl ScramKeyClient {
    /// Starts an exchange; returns the client-first message (without channel binding).
    pub fn new(keys: ScramKeys) -> (ScramKeyClient, String) {
        let mut raw = [0u8; 18];
        rand::thread_rng().fill_bytes(&mut raw);
        let client_first_bare = format!("n=,r={}", B64.encode(raw));
        let first = format!("n,,{client_first_bare}");
        (
            ScramKeyClient {
                keys,
                client_first_bare,
                auth_message: None,
            },
            first,
        )
    }

    /// Answers the server-first message with the client-final message.
    pub fn server_first(&mut self, data: &[u8]) -> Result<String, ScramError> {
        let msg = std::str::from_utf8(data).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let mut parts = msg.split(',');
        let nonce = attr(parts.next(), 'r')?;
        let client_nonce = &self.client_first_bare[5..];
        if !nonce.starts_with(client_nonce) || nonce.len() == client_nonce.len() {
            return Err(ScramError::NonceMismatch);
        }
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{msg},{without_proof}", self.client_first_bare);
        let stored_key: [u8; 32] = Sha256::digest(self.keys.client_key).into();
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = self
            .keys
            .client_key
            .iter()
            .zip(signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.auth_message = Some(auth_message);
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server's signature in the server-final message.
    pub fn server_final(self, data: &[u8]) -> Result<(), ScramError> {
        let msg = std::str::from_utf8(data).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let auth_message = self
            .auth_message
            .ok_or(ScramError::Malformed("server-final before server-first"))?;
        let verifier = attr(Some(msg), 'v')?;
        let expected = hmac(&self.keys.server_key, auth_message.as_bytes());
        let got = B64
            .decode(verifier)
            .map_err(|_| ScramError::Malformed("invalid server signature"))?;
        if constant_time_eq(&got, &expected) {
            Ok(())
        } else {
            Err(ScramError::WrongPassword)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays the client side by hand, as libpq would.
    fn client_final_for(password: &str, client_first_bare: &str, server_first: &str) -> String {
        let mut it = server_first.split(',');
        let nonce = &it.next().unwrap()[2..];
        let salt = B64.decode(&it.next().unwrap()[2..]).unwrap();
        let iters: u32 = it.next().unwrap()[2..].parse().unwrap();
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2::<HmacSha256>(password.as_bytes(), &salt, iters, &mut salted).unwrap();
        let client_key = hmac(&salted, b"Client Key");
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = hmac(&stored, auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(sig).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", B64.encode(proof))
    }

    #[test]
    fn full_exchange_accepts_right_and_refuses_wrong_password() {
        let secret = ScramSecret::generate("pencil");
        let parsed = ScramSecret::parse(&secret.to_text()).unwrap();
        assert_eq!(parsed, secret);
        for (pw, ok) in [("pencil", true), ("crayon", false)] {
            let (server, first) =
                ScramServer::client_first(secret.clone(), b"n,,n=,r=rOprNGfwEbeRWgbNEkqO").unwrap();
            let fin = client_final_for(pw, "n=,r=rOprNGfwEbeRWgbNEkqO", &first);
            let result = server.client_final(fin.as_bytes());
            assert_eq!(result.is_ok(), ok, "{pw}");
        }
    }

    #[test]
    fn postgres_secret_verifies_its_password() {
        // pg_authid.rolpassword written by PostgreSQL 15 for the password 'secret'.
        let s = "SCRAM-SHA-256$4096:Bh1wrA4D+7iyHwNi799cWg==$hKGfbmI6GiCRkcf8xxz/9Vx4EN0DRWQjXm4kKtk871M=:3gEBr7FbMIhJihT72DlDP2MwJ5G+8xJNsnH/x4rqrig=";
        let parsed = ScramSecret::parse(s).unwrap();
        assert_eq!(parsed.iterations, 4096);
        assert_eq!(parsed.to_text(), s);
        assert_eq!(
            ScramSecret::from_password("secret", &parsed.salt, 4096),
            parsed
        );
        assert!(ScramSecret::parse("md5abc").is_err());
    }

    #[test]
    fn passwords_are_prepared_with_saslprep_as_postgresql_does() {
        // Written by PostgreSQL 15 for E'pass\u00a0word': SASLprep maps the no-break space to
        // a space, so both spellings (libpq prepares what the user types) match it.
        let s = "SCRAM-SHA-256$4096:ROEE4dp44V/uq89GI1TwDg==$1VCFK/zhMom7CkCVSp3XBM26ZD8YMvtthpwjtlpbT8w=:F04EYMYbis6qYKin9Pzy4Xo5P+iQ8pnb/903RpHX2aE=";
        let parsed = ScramSecret::parse(s).unwrap();
        for password in ["pass\u{a0}word", "pass word"] {
            assert_eq!(
                ScramSecret::from_password(password, &parsed.salt, 4096),
                parsed,
                "{password:?}"
            );
        }
        // A password SASLprep refuses (a prohibited control character) is used as it is.
        let raw = ScramSecret::from_password("a\u{7}b", &parsed.salt, 1);
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2::<HmacSha256>(b"a\x07b", &parsed.salt, 1, &mut salted).unwrap();
        assert_eq!(raw.server_key, hmac(&salted, b"Server Key"));
    }

    #[test]
    fn keys_recovered_from_a_client_log_in_to_a_server_with_the_same_verifier() {
        let secret = ScramSecret::generate("pencil");
        // A client logs in to pgmemo with the password; pgmemo recovers its ClientKey.
        let (server, first) =
            ScramServer::client_first(secret.clone(), b"n,,n=,r=abcdefghijkl").unwrap();
        let fin = client_final_for("pencil", "n=,r=abcdefghijkl", &first);
        let outcome = server.client_final(fin.as_bytes()).unwrap();
        let keys = ScramKeys {
            client_key: outcome.client_key,
            server_key: secret.server_key,
        };
        // pgmemo logs in to a server holding the same verifier with those keys.
        let (mut client, client_first) = ScramKeyClient::new(keys.clone());
        let (upstream, server_first) =
            ScramServer::client_first(secret.clone(), client_first.as_bytes()).unwrap();
        let client_final = client.server_first(server_first.as_bytes()).unwrap();
        let done = upstream.client_final(client_final.as_bytes()).unwrap();
        client.server_final(done.server_final.as_bytes()).unwrap();
        // A server with another verifier refuses them.
        let other = ScramSecret::generate("crayon");
        let (mut client, client_first) = ScramKeyClient::new(keys);
        let (upstream, server_first) =
            ScramServer::client_first(other, client_first.as_bytes()).unwrap();
        let client_final = client.server_first(server_first.as_bytes()).unwrap();
        assert_eq!(
            upstream.client_final(client_final.as_bytes()).unwrap_err(),
            ScramError::WrongPassword
        );
    }

    #[test]
    fn channel_binding_is_refused() {
        let secret = ScramSecret::generate("x");
        assert_eq!(
            ScramServer::client_first(secret, b"p=tls-server-end-point,,n=,r=abc").unwrap_err(),
            ScramError::ChannelBindingUnsupported
        );
    }
}
