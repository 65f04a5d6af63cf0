//! Integration tests of the HTTP API against real `permit serve` processes.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod durability;
mod elections;
mod errors;
mod expiry;
mod formats;
mod full_disk;
mod io_errors;
mod isolation;
mod observability;
mod openapi;
mod policies;
mod queues;
mod sd_notify;
mod semaphores;
mod sessions;
mod slow_disk;
mod sync_shim;
mod tenants;
mod ui;
mod watch;

pub use common::api::{Answer, Api};
