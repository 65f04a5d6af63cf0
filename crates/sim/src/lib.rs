//! A simulated 3-node Permit cluster in one process, for deterministic-time tests of the state
//! machine and the Raft glue.
//!
//! Each seed runs full `permit_server::Node`s (the segment log, snapshots, proposer, lessor,
//! expiry driver) on one current-thread tokio runtime with paused time, so simulated seconds
//! cost only the work done in them. The nodes talk through an in-memory [`router::Router`] that injects
//! seeded faults ([`nemesis`]): isolated nodes, one-way and bridge partitions, message loss,
//! slow links, crashes with restarts on the same data dir, and storage faults on each node's
//! simulated disk ([`disk`], which holds its Raft log): failed fsyncs (the node must
//! fail-stop), fsyncs that hang, and torn log tails after a power cut. Random [`client`]s run sessions,
//! acquires, releases and resizes, [`queue`] producers and consumers push, claim, ack and
//! nack, and [`policies`] takers and holders take a rated semaphore's permits and hold a
//! lock-delayed one, against whichever node believes it leads; every answer goes into a
//! [`history::History`].
//!
//! Invariants are checked as the run goes ([`observer`]: election safety, votes and applied
//! indexes that never go back, `State::verify`, equal digests at equal indexes), after healing
//! ([`liveness`]: convergence, catch-up, replicas agree, no permit lost forever), and over the
//! history ([`checker`]: tokens, capacity, leases, acknowledged holds, the queue promises and a
//! lock-delay in real time), and over the committed log as the network carried it, re-applied
//! ([`applied`]: the rate and the lock-delay on leader time, and every node's leader time at
//! every index). [`early_expiry`]
//! notes sessions that vanished from a leader before its deadline there (closes included), to
//! explain a lease violation when one is found.
//!
//! A seed replays exactly (the same history, event by event): it seeds the clients, the faults,
//! the nodes' session ids and openraft's election timeouts, and the server wakes waiters in a
//! fixed order (`tests/replay.rs` checks it). Failures print their seed and their last events;
//! see [`seeds`] for the environment variables.

#![deny(missing_docs)]

pub mod applied;
pub mod checker;
pub mod client;
pub mod cluster;
pub mod disk;
pub mod early_expiry;
pub mod faults;
pub mod gateway;
pub mod history;
pub mod liveness;
pub mod nemesis;
pub mod observer;
pub mod panics;
pub mod policies;
pub mod queue;
pub mod recorder;
mod report;
pub mod router;
pub mod scenario;
pub mod seeds;
pub mod simulation;
pub mod traffic;

pub use simulation::{run, Run, Settings};
