//! TLS settings: the server's rustls configuration (HTTPS, optional client certificates) and the
//! rustls configuration of a node's connections to its peers (`crate::peer_conn`: Raft RPCs,
//! forwarded requests, health probes).
//!
//! The crypto provider is rustls' `ring` provider, installed as the process default by
//! `install_crypto_provider`: it builds with `cc` alone (no cmake, no C++), which keeps a clean
//! build short on small machines, and it is the provider rustls was audited with first. See
//! `docs/security.md` ("## TLS").

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The first byte of a TLS record carrying a handshake (a ClientHello starts with it).
pub(crate) const TLS_HANDSHAKE_BYTE: u8 = 0x16;

/// Idle pooled connections to peers are dropped after this long, before a peer's
/// header-read timeout (10 s by default) closes them under a request about to be sent.
pub(crate) const PEER_POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// Largest PEM file read for a certificate, key or CA bundle.
const PEM_BYTES_MAX: u64 = 1 << 20;

/// TLS files of a node, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM certificate chain the node presents (to clients, and to peers as its client identity).
    pub cert: PathBuf,
    /// PEM private key of `cert`.
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these PEM CAs.
    pub client_ca: Option<PathBuf>,
    /// PEM CAs that sign the peers' certificates; defaults to `client_ca`, then to the system's
    /// roots.
    pub peer_ca: Option<PathBuf>,
}

impl TlsConfig {
    /// The CA bundle peers are verified against, if one was given.
    fn peer_ca_file(&self) -> Option<&Path> {
        self.peer_ca.as_deref().or(self.client_ca.as_deref())
    }
}

/// Installs rustls' `ring` provider as the process default, once; later calls do nothing.
/// Every reqwest client in the process needs a default provider (reqwest is built with
/// `rustls-no-provider`).
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race against another thread installing one is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Reads a PEM file, refusing absurd sizes.
fn read_pem(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    let meta =
        std::fs::metadata(path).map_err(|e| anyhow::anyhow!("cannot read {what} {}: {e}", path.display()))?;
    anyhow::ensure!(meta.len() <= PEM_BYTES_MAX, "{what} {} is larger than 1 MiB", path.display());
    std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {what} {}: {e}", path.display()))
}

/// Every certificate in a PEM file (at least one).
fn load_certs(path: &Path, what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{what} {}: {e}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{what} {} holds no PEM certificate", path.display());
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let pem = read_pem(path, "TLS key")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| anyhow::anyhow!("TLS key {}: {e}", path.display()))
}

/// A root store of every certificate in a PEM file.
fn load_roots(path: &Path, what: &str) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path, what)? {
        roots.add(cert).map_err(|e| anyhow::anyhow!("{what} {}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// The server's rustls configuration: its certificate, HTTP/1.1 by ALPN, and client
/// certificates required when `client_ca` is set.
///
/// # Errors
/// A message naming the file that cannot be read or does not match.
pub(crate) fn server_config(tls: &TlsConfig) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    install_crypto_provider();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
    let builder = match &tls.client_ca {
        Some(path) => {
            let roots = Arc::new(load_roots(path, "client CA")?);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| anyhow::anyhow!("client CA {}: {e}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config =
        builder.with_single_cert(load_certs(&tls.cert, "TLS certificate")?, load_key(&tls.key)?).map_err(
            |e| anyhow::anyhow!("TLS certificate {} and key {}: {e}", tls.cert.display(), tls.key.display()),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The rustls configuration a node reaches its peers with (`crate::peer_conn`: Raft RPCs,
/// forwarded requests, health probes): the peer CA as roots when given, else the system's roots
/// through the platform verifier; the node's own certificate as its client identity; HTTP/1.1
/// by ALPN.
///
/// # Errors
/// A message naming the file that cannot be read or does not match.
pub(crate) fn peer_client_config(tls: &TlsConfig) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use rustls_platform_verifier::BuilderVerifierExt;
    install_crypto_provider();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
    let builder = match tls.peer_ca_file() {
        Some(ca) => builder.with_root_certificates(load_roots(ca, "peer CA")?),
        None => builder.with_platform_verifier().map_err(|e| anyhow::anyhow!("the system's roots: {e}"))?,
    };
    let mut config = builder
        .with_client_auth_cert(load_certs(&tls.cert, "TLS certificate")?, load_key(&tls.key)?)
        .map_err(|e| {
            anyhow::anyhow!("TLS certificate {} and key {}: {e}", tls.cert.display(), tls.key.display())
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The URL scheme of a node with `tls`: `https` when it has TLS. It is the scheme of its peers'
/// URLs too: a cluster's nodes all serve TLS or none does.
pub(crate) fn scheme(tls: Option<&TlsConfig>) -> &'static str {
    if tls.is_some() {
        "https"
    } else {
        "http"
    }
}
