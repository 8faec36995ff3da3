//! [`Role`]: what one process of the service runs.

use std::fmt;
use std::str::FromStr;

use crate::consumers;

/// What one process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Role {
    /// Everything in one process.
    #[default]
    All,
    /// The HTTP API and the orders consumer.
    Api,
    /// The outbox relay.
    Relay,
    /// The inventory consumer.
    Inventory,
    /// The loyalty consumer.
    Loyalty,
}

impl Role {
    /// Every role, as named on the command line.
    pub const NAMES: [&'static str; 5] = ["all", "api", "relay", "inventory", "loyalty"];

    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Api => "api",
            Role::Relay => "relay",
            Role::Inventory => "inventory",
            Role::Loyalty => "loyalty",
        }
    }

    pub(crate) fn runs(self, part: Role) -> bool {
        self == Role::All || self == part
    }

    /// Connections the process may open: the HTTP API holds one per
    /// request in flight, each consumer one per worker, the relay one.
    pub(crate) fn pool_size(self) -> usize {
        match self {
            Role::All => 32,
            Role::Api => 16 + consumers::CONCURRENCY,
            Role::Relay | Role::Inventory | Role::Loyalty => 2 + consumers::CONCURRENCY,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is not one of [`Role::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}; expected one of: all, api, relay, inventory, loyalty")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(Role::All),
            "api" => Ok(Role::Api),
            "relay" => Ok(Role::Relay),
            "inventory" => Ok(Role::Inventory),
            "loyalty" => Ok(Role::Loyalty),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_from_their_names() {
        for name in Role::NAMES {
            assert_eq!(name.parse::<Role>().unwrap().as_str(), name);
        }
        assert!("web".parse::<Role>().is_err());
        assert_eq!(Role::default(), Role::All);
        assert!(Role::All.runs(Role::Relay));
        assert!(!Role::Api.runs(Role::Relay));
    }
}
