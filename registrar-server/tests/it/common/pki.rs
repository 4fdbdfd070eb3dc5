//! Certificates for tests: CAs, a server certificate for 127.0.0.1 and
//! localhost, agent certificates with SPIFFE IDs.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use waypost_registrar_server::TlsFiles;

pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The registrar's certificate: 127.0.0.1 and localhost.
    pub fn server(&self) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "registrar");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// An agent's (or operator's) certificate with SPIFFE ID `id` (none when
    /// `None`).
    pub fn client(&self, id: Option<&str>) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "agent");
        if let Some(id) = id {
            params.subject_alt_names = vec![SanType::URI(id.try_into().unwrap())];
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &*self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

impl Leaf {
    /// Write `<name>.crt` and `<name>.key` into `dir` (overwriting).
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert).unwrap();
        std::fs::write(&key, &self.key).unwrap();
        (cert, key)
    }
}

/// Write a PEM bundle of `cas` to `dir/name` (overwriting).
pub fn write_bundle(dir: &Path, name: &str, cas: &[&Ca]) -> PathBuf {
    let path = dir.join(name);
    let pem: String = cas.iter().map(|c| c.pem()).collect();
    std::fs::write(&path, pem).unwrap();
    path
}

/// A CA, its bundle and a server certificate in a temporary directory.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
    pub server_files: TlsFiles,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("test CA");
        let bundle = write_bundle(dir.path(), "ca.pem", &[&ca]);
        let (cert, key) = ca.server().write(dir.path(), "server");
        Pki {
            server_files: TlsFiles::new(bundle, cert, key),
            dir,
            ca,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Files of an agent with SPIFFE ID `id` signed by `ca`, trusting the
    /// test CA for the server.
    pub fn agent(&self, ca: &Ca, name: &str, id: Option<&str>) -> TlsFiles {
        let (cert, key) = ca.client(id).write(self.path(), name);
        TlsFiles::new(self.ca_path(), cert, key)
    }

    pub fn ca_path(&self) -> PathBuf {
        self.path().join("ca.pem")
    }
}
