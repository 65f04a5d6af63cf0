//! A throw-away CA and server certificate for the TLS rows, and the CA the API clients trust.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// The CA every API client trusts once the TLS rows made one.
static TRUSTED_CA: OnceLock<rustls::pki_types::CertificateDer<'static>> = OnceLock::new();

/// The CA made by [`TestPki::create`], if any.
pub fn trusted_ca() -> Option<&'static rustls::pki_types::CertificateDer<'static>> {
    TRUSTED_CA.get()
}

/// PEM files of a CA and a certificate for 127.0.0.1 and localhost, generated now.
pub struct TestPki {
    cert: PathBuf,
    key: PathBuf,
}

impl TestPki {
    /// Writes the files into `dir` and makes the API clients trust the CA.
    pub fn create(dir: &Path) -> anyhow::Result<TestPki> {
        std::fs::create_dir_all(dir)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "permit-bench CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?
            .signed_by(&key, &ca)?;
        let files = TestPki { cert: dir.join("server.pem"), key: dir.join("server-key.pem") };
        std::fs::write(&files.cert, cert.pem())?;
        std::fs::write(&files.key, key.serialize_pem())?;
        let _ = TRUSTED_CA.set(AsRef::<rcgen::Certificate>::as_ref(&ca).der().clone());
        Ok(files)
    }

    /// `permit serve` arguments for HTTPS with these files.
    pub fn serve_args(&self) -> Vec<String> {
        vec![
            "--tls-cert".to_owned(),
            self.cert.display().to_string(),
            "--tls-key".to_owned(),
            self.key.display().to_string(),
        ]
    }
}
