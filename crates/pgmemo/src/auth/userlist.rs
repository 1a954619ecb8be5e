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
    fn parse(s: &str) -> Secret {
        if s.len() == 35 && s.starts_with("md5") && s[3..].bytes().all(|b| b.is_ascii_hexdigit()) {
            return Secret::Md5(s.to_owned());
        }
        if let Ok(scram) = ScramSecret::parse(s) {
            return Secret::Scram(scram);
        }
        Secret::Plain(s.to_owned())
    }
}

/// The users pgmemo knows, keyed by name.
#[derive(Debug, Clone, Default)]
pub struct Userlist {
    users: HashMap<String, Secret>,
}

impl Userlist {
    /// Reads `auth_file` when the configured auth type needs it (or when it is set at all: its
    /// plain-text passwords also serve for server logins).
    pub fn load_for(config: &Config) -> Result<Userlist, String> {
        match &config.auth_file {
            Some(path) => Userlist::load(path),
            None if config.auth_type != AuthType::Upstream => {
                Err("auth_type other than upstream requires auth_file".to_owned())
            }
            None => Ok(Userlist::default()),
        }
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
            users.insert(user, Secret::parse(&secret));
        }
        Ok(Userlist { users })
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
    fn reports_bad_line() {
        let err = Userlist::parse("\"a\" \"b\"\nbroken line\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
    }
}
