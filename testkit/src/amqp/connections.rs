//! The broker's client connections, found and force-closed by name through
//! `rabbitmqctl`.

use std::process::Command;

/// A client connection of a broker, from `rabbitmqctl list_connections pid
/// client_properties`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConnection {
    /// The Erlang pid `rabbitmqctl close_connection` takes.
    pub pid: String,
    /// The client-provided connection name (empty when it gave none).
    pub name: String,
}

/// The connections listed in `listing` (the output of `rabbitmqctl -q
/// list_connections pid client_properties`).
///
/// ```
/// use outbox_testkit::amqp::parse_connections;
///
/// let listing = "<rabbit@h.1.2.3>\t[{\"product\",\"lapin\"},{\"connection_name\",\"t.relay\"}]\n\
///                <rabbit@h.1.2.4>\t[{\"product\",\"lapin\"}]\n";
/// let found = parse_connections(listing);
/// assert_eq!(found.len(), 2);
/// assert_eq!(found[0].pid, "<rabbit@h.1.2.3>");
/// assert_eq!(found[0].name, "t.relay");
/// assert_eq!(found[1].name, "");
/// ```
pub fn parse_connections(listing: &str) -> Vec<ClientConnection> {
    const KEY: &str = "{\"connection_name\",\"";
    listing
        .lines()
        .filter_map(|line| {
            let pid = line.split_whitespace().next()?.to_owned();
            let name = line
                .find(KEY)
                .and_then(|start| {
                    let rest = &line[start + KEY.len()..];
                    rest.find('"').map(|end| rest[..end].to_owned())
                })
                .unwrap_or_default();
            Some(ClientConnection { pid, name })
        })
        .collect()
}

/// The client connections of the shared broker (`rabbitmqctl`).
///
/// # Panics
/// When `rabbitmqctl` cannot run or fails.
pub fn connections() -> Vec<ClientConnection> {
    let output = Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .unwrap_or_else(|e| {
            panic!("rabbitmqctl: {e} (install RabbitMQ with scripts/dev-services)")
        });
    assert!(
        output.status.success(),
        "rabbitmqctl list_connections failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    parse_connections(&String::from_utf8_lossy(&output.stdout))
}

/// The pid of the shared broker's connection named exactly `name`.
pub fn connection_pid(name: &str) -> Option<String> {
    connections()
        .into_iter()
        .find(|c| c.name == name)
        .map(|c| c.pid)
}

/// Force-closes (`rabbitmqctl close_connection`) every connection of the
/// shared broker whose name `matches`; returns how many it closed (one
/// may be gone between the listing and the close).
pub fn close_connections_where(matches: impl Fn(&str) -> bool) -> usize {
    connections()
        .iter()
        .filter(|c| matches(&c.name))
        .filter(|c| {
            Command::new("rabbitmqctl")
                .args(["close_connection", &c.pid, "fault injected by test"])
                .output()
                .is_ok_and(|out| out.status.success())
        })
        .count()
}

/// Force-closes the shared broker's connections whose name starts with
/// `prefix`; returns how many.
pub fn close_connections(prefix: &str) -> usize {
    close_connections_where(|name| name.starts_with(prefix))
}

/// Force-closes the shared broker's connections named exactly `name`;
/// returns how many.
pub fn close_connection(name: &str) -> usize {
    close_connections_where(|n| n == name)
}
