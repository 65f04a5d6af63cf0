//! `permit-leader`: every answer names the leader's URL, and the Rust client given several
//! endpoints sends its requests there instead of through a follower.

use std::time::Duration;

use permit_client::Client;

use crate::common::Cluster;
use crate::Api;

/// A counter of the node at `url` (summed over its label sets), 0 when absent.
async fn counter(url: &str, name: &str) -> f64 {
    let body = Api::at(url).get("/metrics").await.body.as_str().unwrap_or_default().to_owned();
    body.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn leader_header(http: &reqwest::Client, url: &str, path: &str) -> (Option<String>, Option<String>) {
    let answer = http.get(format!("{url}{path}")).send().await.expect("an answer");
    let header = |name: &str| answer.headers().get(name).and_then(|v| Some(v.to_str().ok()?.to_owned()));
    (header("permit-leader"), header("permit-node"))
}

#[tokio::test]
async fn every_node_names_the_leader_and_the_client_sends_its_requests_there() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(5)).await.expect("a leader");
    let urls = cluster.urls();
    let follower = (leader + 1) % urls.len();
    // Every node names the leader, on the answers it gives itself and on forwarded ones (which
    // the leader answered: `permit-node` is the leader's id).
    for url in &urls {
        let (named, _) = leader_header(&cluster.http, url, "/v1/health").await;
        assert_eq!(named.as_deref(), Some(urls[leader].as_str()), "health of {url}");
        let (named, node) = leader_header(&cluster.http, url, "/v1/semaphores").await;
        assert_eq!(named.as_deref(), Some(urls[leader].as_str()), "semaphore list via {url}");
        assert_eq!(node, Some((leader + 1).to_string()), "semaphore list via {url}");
    }

    // A client that lists a follower first sends its first request there, learns the leader
    // from the answer, and sends the rest to the leader: the follower forwards one request.
    let forwarded_before = counter(&urls[follower], "permit_forwarded_requests_total").await;
    let mut endpoints = vec![urls[follower].clone()];
    endpoints.extend(urls.iter().filter(|u| **u != urls[follower]).cloned());
    let client = Client::with_endpoints(&endpoints).unwrap();
    client.put_semaphore("hint", 1).await.unwrap();
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    for _ in 0..5 {
        let hold = session.acquire("hint", 1).await.unwrap_or_else(|e| panic!("{e}"));
        hold.release().await.unwrap();
    }
    session.close().await.unwrap();
    let forwarded = counter(&urls[follower], "permit_forwarded_requests_total").await - forwarded_before;
    assert_eq!(forwarded, 1.0, "requests the follower forwarded for a client that follows the hint");
    // The forward was timed.
    assert!(counter(&urls[follower], "permit_forward_duration_seconds_count").await >= 1.0);

    // A hint naming a node that is not one of the client's endpoints is ignored: a client of
    // the followers alone keeps working through them.
    let followers: Vec<String> = urls.iter().filter(|u| **u != urls[leader]).cloned().collect();
    let client = Client::with_endpoints(&followers).unwrap();
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let hold = session.acquire("hint", 1).await.unwrap_or_else(|e| panic!("{e}"));
    hold.release().await.unwrap();
    session.close().await.unwrap();
    assert_eq!(client.endpoints(), followers.as_slice());
}
