//! [`DeliveryOrder`] and its text in the database.

/// Whether events of one aggregate must be published in sequence order.
///
/// A property of the outbox table, not of one relay: every relay working on
/// the same table obeys the store's setting, which is reported on each
/// [`Claim`](super::Claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DeliveryOrder {
    /// Events of one aggregate (same type and id) are published in `seq`
    /// order; a failing or `Dead` event holds back the later events of its
    /// own aggregate only. The default.
    #[default]
    PerAggregate,
    /// No order: every claimable event is published as soon as possible.
    Unordered,
}

impl DeliveryOrder {
    /// Every delivery order.
    pub const ALL: [DeliveryOrder; 2] = [DeliveryOrder::PerAggregate, DeliveryOrder::Unordered];

    /// The name stored in the database and shown to operators
    /// (`"per_aggregate"`, `"unordered"`); [`FromStr`](std::str::FromStr)
    /// reads it back. The one place this text is spelled.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryOrder::PerAggregate => "per_aggregate",
            DeliveryOrder::Unordered => "unordered",
        }
    }
}

impl std::fmt::Display for DeliveryOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for DeliveryOrder {
    type Err = crate::Error;

    /// ```
    /// use outbox_core::DeliveryOrder;
    ///
    /// assert_eq!("unordered".parse::<DeliveryOrder>()?, DeliveryOrder::Unordered);
    /// assert!("Unordered".parse::<DeliveryOrder>().is_err());
    /// # Ok::<(), outbox_core::Error>(())
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeliveryOrder::ALL
            .into_iter()
            .find(|order| order.as_str() == s)
            .ok_or_else(|| crate::Error::UnknownDeliveryOrder(s.to_owned()))
    }
}

/// As its [`as_str`](DeliveryOrder::as_str) name (`"per_aggregate"`,
/// `"unordered"`), the spelling of the database and the CLI.
impl serde::Serialize for DeliveryOrder {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for DeliveryOrder {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_spells_the_database_name() {
        for order in DeliveryOrder::ALL {
            let json = serde_json::to_string(&order).unwrap();
            assert_eq!(json, format!("\"{}\"", order.as_str()));
            assert_eq!(serde_json::from_str::<DeliveryOrder>(&json).unwrap(), order);
        }
        assert!(serde_json::from_str::<DeliveryOrder>("\"PerAggregate\"").is_err());
    }
}
