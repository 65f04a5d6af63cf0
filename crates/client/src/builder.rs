//! [`ClientBuilder`]: a [`Client`] with TLS settings (a private CA, a client certificate).

use std::path::Path;
use std::sync::Arc;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::transport::{TlsOptions, Transport};

/// Largest PEM file the builder reads.
const PEM_BYTES_MAX: u64 = 1 << 20;

/// Builds a [`Client`] with options; [`Client::builder`] makes one.
///
/// # Examples
///
/// A cluster served over HTTPS with a private CA and client certificates:
///
/// ```no_run
/// let client = permit_client::Client::builder(["https://10.0.0.1:7376", "https://10.0.0.2:7376"])
///     .ca_file("ca.pem")?
///     .identity_files("client.pem", "client-key.pem")?
///     .build()?;
/// # Ok::<(), permit_client::Error>(())
/// ```
#[derive(Debug)]
pub struct ClientBuilder {
    urls: Vec<String>,
    tls: TlsOptions,
}

impl ClientBuilder {
    pub(crate) fn new(urls: Vec<String>) -> ClientBuilder {
        ClientBuilder { urls, tls: TlsOptions::default() }
    }

    /// Trusts the CA certificates in this PEM text for `https://` endpoints. Once any CA is
    /// given, only the given CAs are trusted (not the system's roots).
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> ClientBuilder {
        self.tls.ca_pems.push(pem.into());
        self
    }

    /// Like [`ClientBuilder::ca_pem`], reading the PEM file at `path`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the file cannot be read.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<ClientBuilder> {
        let pem = read_pem(path.as_ref(), "CA file")?;
        Ok(self.ca_pem(pem))
    }

    /// Presents this client certificate (PEM chain) and its private key (PEM) to servers that
    /// require one (`--tls-client-ca`).
    pub fn identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> ClientBuilder {
        let mut identity = cert.into();
        identity.push(b'\n');
        identity.extend(key.into());
        self.tls.identity = Some(identity);
        self
    }

    /// Like [`ClientBuilder::identity_pem`], reading the two PEM files.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a file cannot be read.
    pub fn identity_files(self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<ClientBuilder> {
        let cert = read_pem(cert.as_ref(), "client certificate")?;
        let key = read_pem(key.as_ref(), "client key")?;
        Ok(self.identity_pem(cert, key))
    }

    /// The client.
    ///
    /// # Errors
    /// [`Error::InvalidEndpoint`] for a bad URL; [`Error::InvalidArgument`] for PEM text that
    /// holds no usable certificate or key.
    pub fn build(self) -> Result<Client> {
        Ok(Client { transport: Arc::new(Transport::new(&self.urls, &self.tls)?), batcher: Arc::default() })
    }
}

/// Reads a PEM file, refusing absurd sizes.
fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>> {
    let invalid =
        |reason: String| Error::InvalidArgument { message: format!("{what} {}: {reason}", path.display()) };
    let meta = std::fs::metadata(path).map_err(|e| invalid(e.to_string()))?;
    if meta.len() > PEM_BYTES_MAX {
        return Err(invalid("larger than 1 MiB".to_owned()));
    }
    std::fs::read(path).map_err(|e| invalid(e.to_string()))
}
