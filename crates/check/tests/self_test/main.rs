//! The checker's self-test: hand-made histories with known bugs that each checker must catch,
//! correct ones it must pass, and generated correct histories (a serial reference model spread
//! over overlapping real-time intervals) that must always pass.

mod capacity;
mod cluster;
mod durability;
mod fencing;
mod generated;
mod history;
mod linearizability;
mod queue;
mod serial;
mod support;
mod tokens;
