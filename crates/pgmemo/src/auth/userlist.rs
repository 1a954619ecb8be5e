//! `userlist.txt`: one `"user" "secret"` pair per line, as PgBouncer reads it. A secret is a
//! plain-text password, an md5 secret (`md5` + 32 hex digits) or a SCRAM verifier.

use std::collections::HashMap;
use std::path::Path;

use wire::scram::ScramSecret;

use crate::config::{AuthType, Config};

/// A stored credential for one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Secret {
    /// A clear-text password: works for every method and lets pgmemo log in upstream.
    Plain(String),
    /// `md5...`: works for md5 only.
    Md5(String),
    /// A SCRAM-SHA-256 verifier: works for scram-sha-256 only.
    Scram(ScramSecret),
}

impl Secret {
    /// Reads a secret. Text shaped like an md5 secret or a SCRAM verifier that is not a valid
    /// one is an error rather than a plain-text password: that would make the mistyped hash
    /// itself the password, and the password pgmemo logs in upstream with.
    fn parse(s: &str) -> Result<Secret, &'static str> {
        if s.starts_with("SCRAM-SHA-256$") {
            return ScramSecret::parse(s)
                .map(Secret::Scram)
                .map_err(|_| "malformed SCRAM-SHA-256 secret");
        }
        if s.len() == 35 && s.starts_with("md5") {
            if !s[3..].bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err("malformed md5 secret (md5 and 32 hexadecimal digits)");
            }
            // PostgreSQL writes and compares md5 digests in lower case.
            return Ok(Secret::Md5(s.to_ascii_lowercase()));
        }
        Ok(Secret::Plain(s.to_owned()))
    }
}

/// The users pgmemo knows, keyed by name.
#[derive(Debug, Clone, Default)]
pub struct Userlist {
    users: HashMap<String, Secret>,
    /// SCRAM verifiers of the plain-text entries, derived once at load (`auth_type =
    /// scram-sha-256`): deriving one per login would cost ~1 ms of CPU before any password
    /// is seen, and that delay would tell a plain-text user from a verifier or an unknown one.
    plain_verifiers: HashMap<String, ScramSecret>,
}

impl Userlist {
    /// Reads `auth_file` when the configured auth type needs it (or when it is set at all: its
    /// plain-text passwords also serve for server logins). `seed` salts the verifiers of
    /// plain-text entries as `ScramSecret::from_password_for` does.
    pub fn load_for(config: &Config, seed: &[u8]) -> Result<Userlist, String> {
        let mut userlist = match &config.auth_file {
            Some(path) => Userlist::load(path)?,
            None if config.auth_type != AuthType::Upstream => {
                return Err("auth_type other than upstream requires auth_file".to_owned())
            }
            None => Userlist::default(),
        };
        if config.auth_type == AuthType::ScramSha256 {
            userlist.derive_plain_verifiers(seed);
        }
        Ok(userlist)
    }

    /// Reads a userlist file.
    pub fn load(path: &Path) -> Result<Userlist, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read auth_file {}: {e}", path.display()))?;
        Userlist::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the userlist format; reports the first bad line by number.
    pub fn parse(text: &str) -> Result<Userlist, String> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
                continue;
            }
            let mut rest = trimmed;
            let user =
                quoted(&mut rest).ok_or_else(|| format!("line {}: expected \"user\"", i + 1))?;
            let secret =
                quoted(&mut rest).ok_or_else(|| format!("line {}: expected \"secret\"", i + 1))?;
            let secret = Secret::parse(&secret).map_err(|e| format!("line {}: {e}", i + 1))?;
            users.insert(user, secret);
        }
        Ok(Userlist {
            users,
            plain_verifiers: HashMap::new(),
        })
    }

    /// Derives the SCRAM verifier of every plain-text entry (see `plain_verifiers`).
    fn derive_plain_verifiers(&mut self, seed: &[u8]) {
        self.plain_verifiers = self
            .users
            .iter()
            .filter_map(|(user, secret)| match secret {
                Secret::Plain(p) => {
                    Some((user.clone(), ScramSecret::from_password_for(p, user, seed)))
                }
                _ => None,
            })
            .collect();
    }

    /// The SCRAM verifier of a plain-text entry, derived at load.
    pub fn plain_verifier(&self, user: &str) -> Option<&ScramSecret> {
        self.plain_verifiers.get(user)
    }

    /// The secret for a user.
    pub fn get(&self, user: &str) -> Option<&Secret> {
        self.users.get(user)
    }

    /// Whether the user is listed.
    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }
}

/// Reads one `"..."` token (with `""` as an escaped quote) from the front of `s`.
fn quoted(s: &mut &str) -> Option<String> {
    let t = s.trim_start();
    let mut chars = t.char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    let mut out = String::new();
    let mut iter = chars.peekable();
    while let Some((i, c)) = iter.next() {
        if c == '"' {
            if let Some(&(_, '"')) = iter.peek() {
                iter.next();
                out.push('"');
                continue;
            }
            *s = &t[i + 1..];
            return Some(out);
        }
        out.push(c);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_secret_kinds() {
        let scram = ScramSecret::generate("pw").to_text();
        let text = format!(
            "; comment\n\"alice\" \"plain pw\"\n\"bob\" \"md5a4c4ed29ec4a4ac1a4bb8d9fc0e6b9d8\"\n\"carol\" \"{scram}\"\n\"d\"\"q\" \"x\"\"y\"\n"
        );
        let u = Userlist::parse(&text).unwrap();
        assert_eq!(u.get("alice"), Some(&Secret::Plain("plain pw".into())));
        assert!(matches!(u.get("bob"), Some(Secret::Md5(_))));
        assert!(matches!(u.get("carol"), Some(Secret::Scram(_))));
        assert_eq!(u.get("d\"q"), Some(&Secret::Plain("x\"y".into())));
        assert!(u.get("nobody").is_none());
    }

    #[test]
    fn malformed_hashes_are_errors_not_passwords() {
        for (secret, what) in [
            ("SCRAM-SHA-256$4096:abc", "SCRAM"),
            ("md5zzzzed29ec4a4ac1a4bb8d9fc0e6b9d8", "md5"),
        ] {
            let err = Userlist::parse(&format!("\"a\" \"b\"\n\"u\" \"{secret}\"\n")).unwrap_err();
            assert!(err.contains("line 2") && err.contains(what), "{err}");
        }
        // Upper-case md5 digests are compared as PostgreSQL writes them, in lower case.
        let u = Userlist::parse("\"u\" \"md5A4C4ED29EC4A4AC1A4BB8D9FC0E6B9D8\"").unwrap();
        assert_eq!(
            u.get("u"),
            Some(&Secret::Md5("md5a4c4ed29ec4a4ac1a4bb8d9fc0e6b9d8".into()))
        );
        // A password that merely starts like one stays a password.
        let u = Userlist::parse("\"u\" \"md5 is not a hash\"").unwrap();
        assert_eq!(u.get("u"), Some(&Secret::Plain("md5 is not a hash".into())));
    }

    #[test]
    fn plain_entries_get_their_verifier_at_load() {
        let mut u =
            Userlist::parse("\"alice\" \"pw\"\n\"bob\" \"md5a4c4ed29ec4a4ac1a4bb8d9fc0e6b9d8\"")
                .unwrap();
        u.derive_plain_verifiers(b"seed");
        assert_eq!(
            u.plain_verifier("alice"),
            Some(&ScramSecret::from_password_for("pw", "alice", b"seed"))
        );
        assert_eq!(u.plain_verifier("bob"), None);
    }

    #[test]
    fn reports_bad_line() {
        let err = Userlist::parse("\"a\" \"b\"\nbroken line\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
    }
}
