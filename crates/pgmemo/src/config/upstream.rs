//! The upstream URL: where PostgreSQL is and, optionally, the credentials and TLS mode pgmemo
//! uses for its own connections.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// TLS towards the upstream, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP (the default: TLS only when the URL asks for it).
    #[default]
    Disable,
    /// TLS if the server offers it, without certificate checks.
    Prefer,
    /// TLS or fail, without certificate checks.
    Require,
    /// TLS or fail; the certificate must chain to `sslrootcert`.
    VerifyCa,
    /// As `verify-ca`, and the certificate must name the host.
    VerifyFull,
}

/// `postgres://[USER[:PASSWORD]@]HOST[:PORT][/DB][?sslmode=...&sslrootcert=...]`. A `HOST`
/// starting with `/` (percent-encoded in the authority, as libpq reads it, or given as
/// `?host=/dir`) is the directory of the server's Unix-domain socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<String>,
    pub database: Option<String>,
    pub sslmode: SslMode,
    pub sslrootcert: Option<String>,
}

impl Default for UpstreamUrl {
    fn default() -> Self {
        UpstreamUrl {
            host: "127.0.0.1".to_owned(),
            port: 5432,
            user: None,
            password: None,
            database: None,
            sslmode: SslMode::Disable,
            sslrootcert: None,
        }
    }
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("invalid percent-encoding in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("invalid UTF-8 in {s:?}"))
}

/// `s` with the password of its user-info part (`user:password@`) replaced by `***`, for
/// error messages, which reach logs and the admin console's caller.
fn redacted(s: &str) -> String {
    let start = s.find("://").map_or(0, |i| i + 3);
    let authority_end = s[start..].find('/').map_or(s.len(), |i| start + i);
    let Some(at) = s[start..authority_end].rfind('@').map(|i| start + i) else {
        return s.to_owned();
    };
    match s[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &s[..start + colon], &s[at..]),
        None => s.to_owned(),
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl UpstreamUrl {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn parse(s: &str) -> Result<UpstreamUrl, String> {
        let rest = s
            .strip_prefix("postgres://")
            .or_else(|| s.strip_prefix("postgresql://"))
            .ok_or_else(|| format!("upstream {:?} must start with postgres://", redacted(s)))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (rest, None),
        };
        let mut url = UpstreamUrl::default();
        let hostport = match authority.rsplit_once('@') {
            Some((userinfo, hp)) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (userinfo, None),
                };
                if !user.is_empty() {
                    url.user = Some(percent_decode(user)?);
                }
                // Its error names the password's position only, never its characters.
                url.password = password
                    .map(percent_decode)
                    .transpose()
                    .map_err(|_| "invalid percent-encoding in the upstream URL's password")?;
                hp
            }
            None => authority,
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, p) = v6
                .split_once(']')
                .ok_or_else(|| format!("unterminated IPv6 address in {:?}", redacted(s)))?;
            (h, p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if !host.is_empty() {
            // libpq's way of naming a socket directory in a URL: `%2Fvar%2Frun%2Fpostgresql`.
            url.host = percent_decode(host)?;
        }
        if let Some(p) = port {
            url.port = p
                .parse()
                .map_err(|_| format!("invalid port {p:?} in upstream URL"))?;
        }
        if let Some(db) = path.filter(|p| !p.is_empty()) {
            url.database = Some(percent_decode(db)?);
        }
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v)?;
            match k {
                "sslmode" => {
                    url.sslmode = match v.as_str() {
                        "disable" => SslMode::Disable,
                        "allow" | "prefer" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        other => return Err(format!("invalid sslmode {other:?}")),
                    }
                }
                "sslrootcert" => url.sslrootcert = Some(v),
                "user" => url.user = Some(v),
                "password" => url.password = Some(v),
                "dbname" => url.database = Some(v),
                "host" => url.host = v,
                "port" => {
                    url.port = v.parse().map_err(|_| format!("invalid port {v:?}"))?;
                }
                other => return Err(format!("unsupported upstream URL parameter {other:?}")),
            }
        }
        if matches!(url.sslmode, SslMode::VerifyCa | SslMode::VerifyFull)
            && url.sslrootcert.is_none()
        {
            return Err("sslmode=verify-ca/verify-full needs sslrootcert=FILE".to_owned());
        }
        Ok(url)
    }

    /// The URL with the password masked, for logs and `SHOW CONFIG`.
    pub fn redacted(&self) -> String {
        let mut u = self.clone();
        if u.password.is_some() {
            u.password = Some("********".to_owned());
        }
        u.to_string()
    }
}

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("postgres://")?;
        if let Some(user) = &self.user {
            f.write_str(&percent_encode(user))?;
            if let Some(pw) = &self.password {
                write!(f, ":{}", percent_encode(pw))?;
            }
            f.write_str("@")?;
        }
        if crate::net::is_unix_socket_dir(&self.host) {
            write!(f, "{}:{}", percent_encode(&self.host), self.port)?;
        } else if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "{}:{}", self.host, self.port)?;
        }
        if let Some(db) = &self.database {
            write!(f, "/{}", percent_encode(db))?;
        }
        let mode = match self.sslmode {
            SslMode::Disable => None,
            SslMode::Prefer => Some("prefer"),
            SslMode::Require => Some("require"),
            SslMode::VerifyCa => Some("verify-ca"),
            SslMode::VerifyFull => Some("verify-full"),
        };
        let mut sep = '?';
        if let Some(m) = mode {
            write!(f, "{sep}sslmode={m}")?;
            sep = '&';
        }
        if let Some(root) = &self.sslrootcert {
            write!(f, "{sep}sslrootcert={}", percent_encode(root))?;
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for UpstreamUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        UpstreamUrl::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl Serialize for UpstreamUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn errors_never_show_the_password() {
        for bad in [
            "mysql://app:s3cret@db/x",
            "postgres://app:s3cret@[::1/x",
            "postgres://app:s3cr%zzet@db/x",
        ] {
            let e = super::UpstreamUrl::parse(bad).unwrap_err();
            assert!(!e.contains("s3cr"), "{e}");
        }
        assert_eq!(
            super::redacted("postgres://app:pw@h:5432/db?sslmode=require"),
            "postgres://app:***@h:5432/db?sslmode=require"
        );
        assert_eq!(super::redacted("postgres://h/db"), "postgres://h/db");
    }

    use super::*;

    #[test]
    fn parses_full_url() {
        let u = UpstreamUrl::parse("postgres://bob:p%40ss@db.example:6543/app?sslmode=require")
            .unwrap();
        assert_eq!(u.host, "db.example");
        assert_eq!(u.port, 6543);
        assert_eq!(u.user.as_deref(), Some("bob"));
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(u.database.as_deref(), Some("app"));
        assert_eq!(u.sslmode, SslMode::Require);
        assert_eq!(UpstreamUrl::parse(&u.to_string()).unwrap(), u);
        assert!(!u.redacted().contains("p%40ss"));
    }

    #[test]
    fn a_socket_directory_is_a_host() {
        for s in [
            "postgres://bob@%2Fvar%2Frun%2Fpostgresql:5433/app",
            "postgres://bob@/app?host=/var/run/postgresql&port=5433",
        ] {
            let u = UpstreamUrl::parse(s).unwrap();
            assert_eq!(
                (u.host.as_str(), u.port),
                ("/var/run/postgresql", 5433),
                "{s}"
            );
            assert_eq!(u.database.as_deref(), Some("app"));
            assert_eq!(UpstreamUrl::parse(&u.to_string()).unwrap(), u);
        }
    }

    #[test]
    fn defaults_and_errors() {
        let u = UpstreamUrl::parse("postgres://127.0.0.1").unwrap();
        assert_eq!(u.port, 5432);
        assert!(UpstreamUrl::parse("mysql://x").is_err());
        assert!(UpstreamUrl::parse("postgres://h:notaport").is_err());
        assert!(UpstreamUrl::parse("postgres://h?sslmode=bogus").is_err());
        assert!(UpstreamUrl::parse("postgres://h?sslmode=verify-full").is_err());
        let v6 = UpstreamUrl::parse("postgres://[::1]:5433").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 5433));
    }
}
