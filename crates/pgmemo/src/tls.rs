//! TLS on both sides: the acceptor offered to clients that send SSLRequest, and the client
//! configuration pgmemo uses towards the upstream when its URL asks for `sslmode`.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::{ClientTlsMode, Config, SslMode, UpstreamUrl};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut BufReader::new(f)).collect();
    let certs =
        certs.map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate found in {}", path.display()));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    rustls_pemfile::private_key(&mut BufReader::new(f))
        .map_err(|e| format!("cannot read private key from {}: {e}", path.display()))?
        .ok_or_else(|| format!("no private key found in {}", path.display()))
}

/// What pgmemo offers clients that ask for TLS.
#[derive(Clone)]
pub struct ClientTls {
    /// Accepts TLS handshakes with the configured certificate.
    pub acceptor: TlsAcceptor,
    /// Whether plain-text clients are refused.
    pub required: bool,
}

impl ClientTls {
    /// Builds the acceptor when `tls_cert_file`/`tls_key_file` are set and TLS is not disabled.
    pub fn from_config(config: &Config) -> Result<Option<ClientTls>, String> {
        if config.client_tls_sslmode == ClientTlsMode::Disable {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) else {
            if config.client_tls_sslmode == ClientTlsMode::Require {
                return Err(
                    "client_tls_sslmode = require needs tls_cert_file and tls_key_file".into(),
                );
            }
            return Ok(None);
        };
        let server_config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| format!("invalid TLS certificate or key: {e}"))?;
        Ok(Some(ClientTls {
            acceptor: TlsAcceptor::from(Arc::new(server_config)),
            required: config.client_tls_sslmode == ClientTlsMode::Require,
        }))
    }
}

/// How pgmemo speaks TLS to the upstream.
#[derive(Clone)]
pub struct UpstreamTls {
    /// The rustls client, with the verification the sslmode asks for.
    pub connector: TlsConnector,
    /// Whether a server that declines TLS is an error (`require` and stricter).
    pub required: bool,
}

impl UpstreamTls {
    /// The name checked against the certificate (verify-full) and sent as SNI for a
    /// connection to `host`: the host connected to, which a `[databases]` entry may make
    /// another than the upstream URL's.
    pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
        ServerName::try_from(host.to_owned())
            .map_err(|e| format!("invalid upstream host name {host:?}: {e}"))
    }

    /// `None` for `sslmode=disable`. A connection through a Unix-domain socket never uses it,
    /// as libpq never tries TLS there whatever the sslmode (see `ServerConn::open`); a
    /// `[databases]` entry's TCP host does, also when the URL's host is a socket directory.
    pub fn from_url(url: &UpstreamUrl) -> Result<Option<UpstreamTls>, String> {
        let verifier: Arc<dyn ServerCertVerifier> = match url.sslmode {
            SslMode::Disable => return Ok(None),
            SslMode::Prefer | SslMode::Require => Arc::new(AcceptAnyCert(provider())),
            SslMode::VerifyCa | SslMode::VerifyFull => {
                let path = url
                    .sslrootcert
                    .as_deref()
                    .ok_or("sslrootcert is required")?;
                let mut roots = rustls::RootCertStore::empty();
                for c in load_certs(Path::new(path))? {
                    roots
                        .add(c)
                        .map_err(|e| format!("invalid root certificate: {e}"))?;
                }
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .map_err(|e| e.to_string())?;
                Arc::new(ChainVerifier {
                    inner,
                    check_name: url.sslmode == SslMode::VerifyFull,
                })
            }
        };
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        if !crate::net::is_unix_socket_dir(&url.host) {
            UpstreamTls::server_name(&url.host)?;
        }
        Ok(Some(UpstreamTls {
            connector: TlsConnector::from(Arc::new(config)),
            required: url.sslmode != SslMode::Prefer,
        }))
    }
}

/// `sslmode=require`: encryption without authentication of the server, as libpq does.
#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca` / `verify-full`: the chain must lead to `sslrootcert`; the host name is checked
/// only for `verify-full`.
#[derive(Debug)]
struct ChainVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            // Recent rustls 0.23 releases report a name mismatch as `NotValidForNameContext`.
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
