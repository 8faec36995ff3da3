//! Loopback ports for servers a test starts itself.

use std::net::TcpListener;

/// A port nobody listens on right now, on 127.0.0.1 (the OS picks it; it
/// is free until someone else binds it, so bind it soon).
///
/// # Panics
/// When the OS has no loopback port to give.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port();
        assert_ne!(port, 0);
        let listener = TcpListener::bind(("127.0.0.1", port));
        assert!(listener.is_ok(), "port {port} was free: {listener:?}");
    }
}
