//! Permit's fault harness: real `permit serve` processes behind fault-injecting proxies,
//! workloads that record every call into a `permit_check::History`, nemeses that inject faults,
//! and scenarios that check the history afterwards.

pub mod client;
pub mod cluster;
pub mod proxy;
pub mod resource;
pub mod scenario;
pub mod workload;
