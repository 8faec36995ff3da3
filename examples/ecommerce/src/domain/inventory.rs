//! Stock rules: what a SKU looks like, and whether an order can be reserved.

use std::collections::BTreeMap;

use super::UnknownStatus;
use super::events::LineItem;

/// The longest SKU accepted.
pub const MAX_SKU_LEN: usize = 64;

/// `true` for 1 to [`MAX_SKU_LEN`] ASCII letters, digits, `-`, `_` or `.`
/// (safe in a URL path segment without escaping).
pub fn is_valid_sku(sku: &str) -> bool {
    !sku.is_empty()
        && sku.len() <= MAX_SKU_LEN
        && sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The stock of one SKU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stock {
    /// Stock keeping unit.
    pub sku: String,
    /// Units that can be ordered.
    pub available: i64,
    /// Units reserved for orders.
    pub reserved: i64,
}

/// What the inventory did for an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationStatus {
    /// Its items are reserved.
    Reserved,
    /// It could not be served; nothing is reserved.
    Rejected,
    /// It was cancelled: its stock (if any) went back to available. Also
    /// recorded when the cancel arrives first, so a late `order.placed`
    /// reserves nothing.
    Released,
}

impl ReservationStatus {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationStatus::Reserved => "reserved",
            ReservationStatus::Rejected => "rejected",
            ReservationStatus::Released => "released",
        }
    }
}

impl std::str::FromStr for ReservationStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reserved" => Ok(ReservationStatus::Reserved),
            "rejected" => Ok(ReservationStatus::Rejected),
            "released" => Ok(ReservationStatus::Released),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

/// The quantity wanted per SKU, in SKU order (the order rows are locked in,
/// so two reservations never wait for each other in a cycle). A SKU named on
/// two lines is summed.
///
/// # Errors
/// A message when there are no items, a quantity is below 1 or a sum
/// overflows: such an event
/// can never be applied.
pub fn demand(items: &[LineItem]) -> Result<BTreeMap<String, i64>, String> {
    if items.is_empty() {
        return Err("the order has no items".into());
    }
    let mut demand = BTreeMap::new();
    for item in items {
        if item.quantity < 1 {
            return Err(format!(
                "sku {:?}: quantity {} is below 1",
                item.sku, item.quantity
            ));
        }
        let wanted: &mut i64 = demand.entry(item.sku.clone()).or_default();
        *wanted = wanted
            .checked_add(item.quantity)
            .ok_or_else(|| format!("sku {:?}: quantity overflows", item.sku))?;
    }
    Ok(demand)
}

/// Decides whether every SKU of `demand` can be reserved from `stock` (the
/// rows found for those SKUs). All or nothing: one unknown or short SKU
/// rejects the whole order.
///
/// # Errors
/// The reason for `inventory.rejected`, naming every SKU that is unknown or short.
pub fn check(demand: &BTreeMap<String, i64>, stock: &[Stock]) -> Result<(), String> {
    let problems: Vec<String> = demand
        .iter()
        .filter_map(
            |(sku, &wanted)| match stock.iter().find(|s| &s.sku == sku) {
                None => Some(format!("unknown sku {sku:?}")),
                Some(s) if s.available < wanted => Some(format!(
                    "insufficient stock for sku {sku:?}: {wanted} ordered, {} available",
                    s.available
                )),
                Some(_) => None,
            },
        )
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(sku: &str, quantity: i64) -> LineItem {
        LineItem {
            sku: sku.into(),
            quantity,
            unit_price_cents: 100,
        }
    }

    fn stock(sku: &str, available: i64) -> Stock {
        Stock {
            sku: sku.into(),
            available,
            reserved: 0,
        }
    }

    #[test]
    fn skus() {
        assert!(is_valid_sku("mug-01_blue.xl"));
        assert!(is_valid_sku(&"a".repeat(MAX_SKU_LEN)));
        assert!(!is_valid_sku(""));
        assert!(!is_valid_sku(&"a".repeat(MAX_SKU_LEN + 1)));
        assert!(!is_valid_sku("mug blue"));
        assert!(!is_valid_sku("mug/blue"));
        assert!(!is_valid_sku("tasse-é"));
    }

    #[test]
    fn demand_is_summed_per_sku_and_sorted() {
        let demand = demand(&[line("b", 1), line("a", 2), line("b", 3)]).unwrap();
        assert_eq!(
            demand.into_iter().collect::<Vec<_>>(),
            [("a".to_owned(), 2), ("b".to_owned(), 4)]
        );
        assert!(super::demand(&[line("a", 0)]).is_err());
        assert!(super::demand(&[]).is_err());
        assert!(super::demand(&[line("a", i64::MAX), line("a", 1)]).is_err());
    }

    #[test]
    fn all_or_nothing() {
        let want = demand(&[line("mug", 2), line("tea", 1)]).unwrap();
        assert_eq!(check(&want, &[stock("mug", 2), stock("tea", 5)]), Ok(()));
        assert_eq!(
            check(&want, &[stock("mug", 1), stock("tea", 5)]).unwrap_err(),
            "insufficient stock for sku \"mug\": 2 ordered, 1 available"
        );
        assert_eq!(
            check(&want, &[stock("mug", 1)]).unwrap_err(),
            "insufficient stock for sku \"mug\": 2 ordered, 1 available; unknown sku \"tea\""
        );
    }
}
