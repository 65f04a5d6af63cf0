//! The traffic of one simulation: the clients with their keepalive tasks, and the nemesis.

use std::sync::Arc;
use std::time::Duration;

use permit_core::{Name, SessionId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{self, Client, LeaseSlot};
use crate::cluster::Cluster;
use crate::gateway::Gateway;
use crate::nemesis::{Nemesis, FAULT_MS_MAX};
use crate::policies;
use crate::queue;
use crate::recorder::Recorder;
use crate::router::Router;

/// Clients, keepalives and nemesis, running.
pub struct Traffic {
    stop_clients: watch::Sender<bool>,
    stop_keepalives: watch::Sender<bool>,
    clients: Vec<JoinHandle<()>>,
    keepalives: Vec<JoinHandle<()>>,
    leases: Vec<(Gateway, LeaseSlot)>,
    nemesis: Option<JoinHandle<Nemesis>>,
    recorder: Arc<Recorder>,
}

impl Traffic {
    /// Starts `clients` clients on the semaphores `names`, `queue_clients` producers and
    /// consumers of the queue ([`queue`]: the first [`queue::PRODUCERS`] produce), the takers and
    /// holders of the policy semaphores if `policies` ([`policies`]), and the nemesis if
    /// `faults`.
    pub fn start(
        cluster: &Arc<Cluster>,
        router: &Arc<Router>,
        recorder: &Arc<Recorder>,
        rng: &mut StdRng,
        (clients, queue_clients, policy_clients, faults): (u32, u32, bool, bool),
        names: &[Name],
    ) -> Traffic {
        let (stop_clients, clients_stopped) = watch::channel(false);
        let (stop_keepalives, keepalives_stopped) = watch::channel(false);
        let mut traffic = Traffic {
            stop_clients,
            stop_keepalives,
            clients: Vec::new(),
            keepalives: Vec::new(),
            leases: Vec::new(),
            nemesis: None,
            recorder: recorder.clone(),
        };
        for id in 0..clients {
            let gateway = Gateway::new(cluster.clone(), recorder.clone(), id);
            let lease = LeaseSlot::default();
            let client_rng = StdRng::seed_from_u64(rng.random());
            let client = Client::new(gateway.clone(), client_rng, names.to_vec(), lease.clone());
            traffic.clients.push(tokio::spawn(client.run(clients_stopped.clone())));
            let keepalive_rng = StdRng::seed_from_u64(rng.random());
            let keepalive =
                client::keep_alive(gateway.clone(), keepalive_rng, lease.clone(), keepalives_stopped.clone());
            traffic.keepalives.push(tokio::spawn(keepalive));
            traffic.leases.push((gateway, lease));
        }
        let nemesis = Nemesis::new(
            cluster.clone(),
            router.clone(),
            recorder.clone(),
            StdRng::seed_from_u64(rng.random()),
        );
        // Queue clients, numbered after the semaphore clients, seeded after the nemesis (which
        // keeps the nemesis of each seed as it was before queues).
        for id in clients..clients + queue_clients {
            let gateway = Gateway::new(cluster.clone(), recorder.clone(), id);
            let client_rng = StdRng::seed_from_u64(rng.random());
            if id < clients + queue::PRODUCERS {
                let producer = queue::produce(gateway, client_rng, id, clients_stopped.clone());
                traffic.clients.push(tokio::spawn(producer));
                continue;
            }
            let lease = LeaseSlot::default();
            let consumer =
                queue::consume(gateway.clone(), client_rng, lease.clone(), clients_stopped.clone());
            traffic.clients.push(tokio::spawn(consumer));
            let keepalive_rng = StdRng::seed_from_u64(rng.random());
            let keepalive =
                client::keep_alive(gateway.clone(), keepalive_rng, lease.clone(), keepalives_stopped.clone());
            traffic.keepalives.push(tokio::spawn(keepalive));
            traffic.leases.push((gateway, lease));
        }
        // Policy clients, numbered and seeded after the queue clients.
        let first = clients + queue_clients;
        let policy_clients = if policy_clients { policies::TAKERS + policies::HOLDERS } else { 0 };
        for id in first..first + policy_clients {
            let gateway = Gateway::new(cluster.clone(), recorder.clone(), id);
            let client_rng = StdRng::seed_from_u64(rng.random());
            let task = match id < first + policies::TAKERS {
                true => tokio::spawn(policies::take(gateway, client_rng, clients_stopped.clone())),
                false => tokio::spawn(policies::hold(gateway, client_rng, clients_stopped.clone())),
            };
            traffic.clients.push(task);
        }
        traffic.nemesis = faults.then(|| tokio::spawn(nemesis.run(clients_stopped)));
        traffic
    }

    /// Stops the clients and the nemesis (which heals everything); keepalives go on. Returns the
    /// faults and crashes injected.
    pub async fn stop_clients_and_faults(&mut self) -> (u64, u64) {
        self.stop_clients.send_replace(true);
        let injected = match self.nemesis.take() {
            Some(nemesis) => match nemesis.await {
                Ok(nemesis) => (nemesis.injected, nemesis.crashes),
                Err(error) => {
                    self.recorder.violation(format!("the nemesis failed: {error}"));
                    (0, 0)
                }
            },
            None => (0, 0),
        };
        join_all(std::mem::take(&mut self.clients), &self.recorder, "client").await;
        injected
    }

    /// Each client's gateway and current session.
    pub fn sessions(&self) -> Vec<(Gateway, Option<SessionId>)> {
        self.leases
            .iter()
            .map(|(gateway, lease)| {
                (gateway.clone(), lease.lock().expect("lease lock").map(|lease| lease.id))
            })
            .collect()
    }

    /// Stops the keepalives: from here on every session expires.
    pub async fn stop_keepalives(&mut self) {
        self.stop_keepalives.send_replace(true);
        join_all(std::mem::take(&mut self.keepalives), &self.recorder, "keepalive").await;
    }
}

/// Waits for tasks that were told to stop; one that does not end in time is a violation (every
/// client operation is bounded).
async fn join_all(tasks: Vec<JoinHandle<()>>, recorder: &Recorder, what: &str) {
    let patience = Duration::from_millis(2 * FAULT_MS_MAX + 20_000);
    for task in tasks {
        match tokio::time::timeout(patience, task).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => recorder.violation(format!("a {what} task failed: {error}")),
            Err(_) => recorder.violation(format!("a {what} task did not stop within {patience:?}")),
        }
    }
}
