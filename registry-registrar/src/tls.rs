//! mTLS with rustls (ring), certificates re-read when their files change.
//!
//! SPIRE rotates X.509 SVIDs often (an hour is common) and writes the new
//! files in place, so neither side loads its certificates once: the
//! certificate and key are re-read by a [`CertReloader`] and the CA bundle
//! by the verifiers whenever a file's modification time or size changes,
//! checked at each TLS handshake. A file that does not parse (a rotation
//! half written, a key that does not match its certificate) is reported
//! once and the previous material stays in use until the files are right.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use waypost::{Error, Result};

/// Certificate files of one side of the connection (PEM).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle the peer's certificate must chain to (for the server:
    /// the agents' CA; for an agent: the registrar's CA).
    pub ca: PathBuf,
    /// This side's certificate chain and private key. Required on the
    /// server; an agent without one is refused (`UNAUTHENTICATED`).
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// CA bundle `ca`, certificate chain `cert`, private key `key`.
    pub fn new(ca: impl Into<PathBuf>, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            ca: ca.into(),
            identity: Some((cert.into(), key.into())),
        }
    }

    /// Only a CA bundle: verify the peer, present no certificate.
    pub fn ca_only(ca: impl Into<PathBuf>) -> Self {
        Self {
            ca: ca.into(),
            identity: None,
        }
    }
}

/// The crypto provider used on both sides (ring: no system libraries).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What identifies a version of a file: modification time and size.
type Stamp = Option<(Option<SystemTime>, u64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.modified().ok(), m.len()))
}

fn read(path: &Path, what: &str) -> std::result::Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

type Loader<T> = Box<dyn Fn(&[PathBuf]) -> std::result::Result<T, String> + Send + Sync>;

struct Loaded<T> {
    stamps: Vec<Stamp>,
    value: Arc<T>,
    /// Stamps of files that failed to load (reported once).
    failed: Option<Vec<Stamp>>,
}

/// A value loaded from files and loaded again when they change.
struct Reloading<T> {
    what: &'static str,
    paths: Vec<PathBuf>,
    load: Loader<T>,
    state: Mutex<Loaded<T>>,
}

impl<T> Reloading<T> {
    fn new(what: &'static str, paths: Vec<PathBuf>, load: Loader<T>) -> Result<Self> {
        let stamps = paths.iter().map(|p| stamp(p)).collect();
        let value = load(&paths).map_err(|e| Error::invalid("tls", e))?;
        Ok(Self {
            what,
            paths,
            load,
            state: Mutex::new(Loaded {
                stamps,
                value: Arc::new(value),
                failed: None,
            }),
        })
    }

    /// The current value, re-read first when a file changed.
    fn current(&self) -> Arc<T> {
        let stamps: Vec<Stamp> = self.paths.iter().map(|p| stamp(p)).collect();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if stamps != st.stamps && st.failed.as_ref() != Some(&stamps) {
            match (self.load)(&self.paths) {
                Ok(v) => {
                    tracing::info!(what = self.what, files = ?self.paths, "reloaded TLS material");
                    st.value = Arc::new(v);
                    st.stamps = stamps;
                    st.failed = None;
                }
                Err(e) => {
                    tracing::warn!(what = self.what, error = %e, "changed TLS files do not load; keeping the previous ones");
                    st.failed = Some(stamps);
                }
            }
        }
        Arc::clone(&st.value)
    }
}

fn load_identity(
    paths: &[PathBuf],
    provider: &CryptoProvider,
) -> std::result::Result<CertifiedKey, String> {
    let (cert_path, key_path) = match paths {
        [c, k] => (c, k),
        _ => return Err("a certificate and a key are needed".to_string()),
    };
    let pem = read(cert_path, "certificate")?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("bad certificate PEM in {}: {e}", cert_path.display()))?;
    if chain.is_empty() {
        return Err(format!("no certificate in {}", cert_path.display()));
    }
    let key_pem = read(key_path, "private key")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("bad private key PEM in {}: {e}", key_path.display()))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        format!(
            "the key {} does not fit the certificate {}: {e}",
            key_path.display(),
            cert_path.display()
        )
    })
}

fn load_roots(path: &Path) -> std::result::Result<Arc<RootCertStore>, String> {
    let pem = read(path, "CA bundle")?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("bad CA PEM in {}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("bad CA certificate in {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("no CA certificate in {}", path.display()));
    }
    Ok(Arc::new(roots))
}

/// This side's certificate and key, re-read when the files change; serves
/// as the server's certificate resolver and as the client's.
pub struct CertReloader {
    inner: Reloading<CertifiedKey>,
}

impl CertReloader {
    /// Load `cert` (a PEM chain, leaf first) and `key` (PEM); fails when
    /// they cannot be read, parsed, or do not belong together.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Result<Self> {
        let provider = provider();
        let inner = Reloading::new(
            "certificate",
            vec![cert.into(), key.into()],
            Box::new(move |paths| load_identity(paths, &provider)),
        )?;
        Ok(Self { inner })
    }

    /// The certificate chain and key in use (re-read when changed).
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.inner.current()
    }
}

impl fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertReloader")
            .field("files", &self.inner.paths)
            .finish()
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for CertReloader {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The signature checks of a reloading verifier: those of the verifier it
/// holds now (`self.current()`).
macro_rules! signatures_of_current {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            self.current().verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            self.current().verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.current().supported_verify_schemes()
        }
    };
}

/// `Debug` of a reloading verifier: the files it reads.
macro_rules! debug_files {
    ($ty:ident) => {
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("files", &self.inner.paths)
                    .finish()
            }
        }
    };
}

/// Verifies agents' certificates against a CA bundle re-read when it
/// changes (a new [`WebPkiClientVerifier`] each time). A client without a
/// certificate passes the handshake so that the registrar can answer
/// `UNAUTHENTICATED` with a reason; one with an untrusted certificate fails
/// the handshake.
pub struct ClientCaVerifier {
    inner: Reloading<Arc<dyn ClientCertVerifier>>,
}

impl ClientCaVerifier {
    /// Trust the CAs in `ca` (PEM bundle).
    pub fn new(ca: impl Into<PathBuf>) -> Result<Self> {
        let provider = provider();
        let inner = Reloading::new(
            "client CA bundle",
            vec![ca.into()],
            Box::new(move |paths| {
                let roots = load_roots(&paths[0])?;
                WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider))
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| format!("cannot build the client verifier: {e}"))
            }),
        )?;
        Ok(Self { inner })
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(&self.inner.current())
    }
}

debug_files!(ClientCaVerifier);

impl ClientCertVerifier for ClientCaVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The roots may change under us; clients send what they have.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    signatures_of_current!();
}

/// Verifies the registrar's certificate against a CA bundle re-read when
/// it changes.
pub struct ServerCaVerifier {
    inner: Reloading<Arc<WebPkiServerVerifier>>,
}

impl ServerCaVerifier {
    /// Trust the CAs in `ca` (PEM bundle).
    pub fn new(ca: impl Into<PathBuf>) -> Result<Self> {
        let provider = provider();
        let inner = Reloading::new(
            "CA bundle",
            vec![ca.into()],
            Box::new(move |paths| {
                let roots = load_roots(&paths[0])?;
                WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                    .build()
                    .map_err(|e| format!("cannot build the server verifier: {e}"))
            }),
        )?;
        Ok(Self { inner })
    }

    fn current(&self) -> Arc<WebPkiServerVerifier> {
        Arc::clone(&self.inner.current())
    }
}

debug_files!(ServerCaVerifier);

impl ServerCertVerifier for ServerCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    signatures_of_current!();
}

/// The registrar's rustls configuration: its certificate from `files`
/// (required), agents verified against `files.ca`, ALPN `h2`.
pub fn server_config(files: &TlsFiles) -> Result<rustls::ServerConfig> {
    let (cert, key) = files
        .identity
        .as_ref()
        .ok_or_else(|| Error::invalid("tls", "the server needs a certificate and a key"))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS versions: {e}")))?
        .with_client_cert_verifier(Arc::new(ClientCaVerifier::new(&files.ca)?))
        .with_cert_resolver(Arc::new(CertReloader::new(cert, key)?));
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// An agent's rustls configuration: the registrar verified against
/// `files.ca`, this agent's certificate from `files.identity` when given,
/// ALPN `h2`.
pub fn client_config(files: &TlsFiles) -> Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS versions: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerCaVerifier::new(&files.ca)?));
    let mut cfg = match &files.identity {
        Some((cert, key)) => {
            builder.with_client_cert_resolver(Arc::new(CertReloader::new(cert, key)?))
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The SPIFFE ID (`spiffe://…` URI SAN) of a DER certificate: `Ok(None)`
/// when it has none, `Err` when it does not parse or has several.
pub fn spiffe_id(cert: &CertificateDer<'_>) -> std::result::Result<Option<String>, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("unparsable certificate: {e}"))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|e| format!("bad subjectAltName: {e}"))?;
    let Some(san) = san else { return Ok(None) };
    let mut ids = san.value.general_names.iter().filter_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) if u.starts_with("spiffe://") => Some(*u),
        _ => None,
    });
    let first = ids.next();
    if ids.next().is_some() {
        // An SVID carries exactly one SPIFFE ID.
        return Err("certificate carries more than one SPIFFE ID".to_string());
    }
    Ok(first.map(str::to_string))
}
