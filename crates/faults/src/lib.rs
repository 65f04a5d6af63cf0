//! Permit's fault harness: real `permit serve` processes behind fault-injecting proxies,
//! workloads that record every call into a `permit_check::History`, nemeses that inject faults,
//! and scenarios that check the history afterwards.

pub mod client;
pub mod cluster;
pub mod policy;
pub mod proxy;
pub mod resource;
pub mod scenario;
pub mod upgrade;
pub mod workload;

/// Installs rustls' `ring` crypto provider as the process default unless one is installed:
/// reqwest is built with `rustls-no-provider`, and every client it builds needs one.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
