//! Loyalty rules.

/// Cents per loyalty point.
pub const CENTS_PER_POINT: i64 = 100;

/// Points a paid order earns: one per full 100 cents of its total.
pub fn points_for(total_cents: i64) -> i64 {
    total_cents.max(0) / CENTS_PER_POINT
}

/// Whether an order's points count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwardStatus {
    /// Added to the customer's points.
    Awarded,
    /// Taken back (the order was cancelled); also recorded, with 0 points,
    /// when the cancel of a paid order arrives before its payment, so the
    /// late `order.paid` awards nothing.
    Revoked,
}

impl AwardStatus {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            AwardStatus::Awarded => "awarded",
            AwardStatus::Revoked => "revoked",
        }
    }
}

impl std::str::FromStr for AwardStatus {
    type Err = super::UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "awarded" => Ok(AwardStatus::Awarded),
            "revoked" => Ok(AwardStatus::Revoked),
            other => Err(super::UnknownStatus(other.to_owned())),
        }
    }
}

/// The points one paid order earned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Award {
    /// Whose points.
    pub customer_id: uuid::Uuid,
    /// How many.
    pub points: i64,
    /// Whether they count.
    pub status: AwardStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_point_per_full_hundred_cents() {
        assert_eq!(points_for(0), 0);
        assert_eq!(points_for(99), 0);
        assert_eq!(points_for(100), 1);
        assert_eq!(points_for(2499), 24);
        assert_eq!(points_for(-500), 0);
    }
}
