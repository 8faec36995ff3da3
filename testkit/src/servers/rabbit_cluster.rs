//! [`PrivateRabbitCluster`]: three [`PrivateRabbit`] nodes joined into one
//! RabbitMQ cluster, for scenarios that stop and restart single nodes.

use std::time::Duration;

use super::PrivateRabbit;
use super::wait_for_port;

/// Three RabbitMQ nodes of their own (each with its own AMQP and
/// distribution ports and node name, the same Erlang cookie) clustered
/// together: nodes 2 and 3 `join_cluster` node 1. Quorum queues declared on
/// it get a member on each node, so they stay available while any one node
/// is stopped. Stopped and removed on drop.
#[derive(Debug)]
pub struct PrivateRabbitCluster {
    nodes: Vec<PrivateRabbit>,
}

impl PrivateRabbitCluster {
    /// Boots the three nodes in parallel (20–40 s on two cores), joins
    /// nodes 2 and 3 to node 1 and waits until every node accepts AMQP
    /// connections.
    pub fn start() -> PrivateRabbitCluster {
        let nodes: Vec<PrivateRabbit> = (0..3).map(|_| PrivateRabbit::spawn()).collect();
        for node in &nodes {
            node.await_startup();
        }
        let first = nodes[0].node().to_owned();
        for node in &nodes[1..] {
            node.ctl(&["stop_app"]);
            node.ctl(&["join_cluster", &first]);
            node.ctl(&["start_app"]);
            node.ctl(&["await_startup"]);
        }
        let cluster = PrivateRabbitCluster { nodes };
        let status = cluster.nodes[0].ctl(&["cluster_status", "--formatter", "json"]);
        for node in &cluster.nodes {
            assert!(
                status.contains(node.node()),
                "{} is not in the cluster: {status}",
                node.node()
            );
        }
        cluster
    }

    /// Node `i` (0, 1 or 2).
    pub fn node(&self, i: usize) -> &PrivateRabbit {
        &self.nodes[i]
    }

    /// How many nodes (3).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always `false`: a cluster has nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`'s URL, `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Every node's URL, comma-separated, in node order: what a client
    /// that knows the whole cluster is given (`AMQP_URL`).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(PrivateRabbit::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `rabbitmqctl stop_app` on node `i`: its client connections drop and
    /// its port closes; the other two keep the cluster (and every quorum
    /// queue) running.
    pub fn stop_node(&self, i: usize) {
        self.nodes[i].stop_app();
    }

    /// `rabbitmqctl start_app` on node `i`; waits until it accepts AMQP
    /// connections again and has rejoined.
    pub fn start_node(&self, i: usize) {
        let node = &self.nodes[i];
        node.ctl(&["start_app"]);
        wait_for_port(
            node.port(),
            Duration::from_secs(60),
            "the restarted RabbitMQ cluster node",
        );
        node.ctl(&["await_startup"]);
    }

    /// The names of the client connections starting with `prefix`, on
    /// every running node (each node lists its own).
    pub fn connections(&self, prefix: &str) -> Vec<String> {
        let mut all = Vec::new();
        for node in &self.nodes {
            if std::net::TcpStream::connect(("127.0.0.1", node.port())).is_ok() {
                all.extend(node.connections(prefix));
            }
        }
        all
    }

    /// `rabbitmqctl list_queues name type members online --formatter json`
    /// on node `i`: a JSON array of `{"name", "type", "members", "online"}`.
    pub fn queues(&self, i: usize) -> String {
        self.nodes[i].ctl(&[
            "list_queues",
            "name",
            "type",
            "members",
            "online",
            "--formatter",
            "json",
        ])
    }
}
