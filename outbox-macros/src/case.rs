//! The default event type naming rule and the name checks shared by
//! `aggregate` and `event_type`.
//!
//! The default event type is `<aggregate>.<snake_case name>`, where the name is
//! the struct's (or the variant's) name with a leading aggregate name dropped:
//! aggregate `order` and struct `OrderPlaced` give `order.placed`.

/// The default event type for a struct or variant named `name` of `aggregate`.
///
/// `name` should already be unraw (`r#Type` → `Type`).
pub(crate) fn default_event_type(aggregate: &str, name: &str) -> String {
    let rest = strip_aggregate_prefix(name, aggregate).unwrap_or(name);
    format!("{aggregate}.{}", snake_case(rest))
}

/// `name` without a leading `aggregate` (compared case-insensitively with the
/// aggregate's PascalCase form, so `order_line` matches `OrderLine`).
///
/// Only drops the aggregate at a word boundary (what follows must start with an
/// uppercase letter), and never drops the whole name: with aggregate `order`,
/// `OrderPlaced` → `Placed`, but `Orderly` and `Order` are kept as they are.
fn strip_aggregate_prefix<'n>(name: &'n str, aggregate: &str) -> Option<&'n str> {
    let prefix = pascal_case(aggregate);
    if prefix.is_empty() {
        return None;
    }
    let head = name.get(..prefix.len())?;
    let rest = name.get(prefix.len()..)?;
    let at_word_boundary = rest.chars().next().is_some_and(char::is_uppercase);
    (head.eq_ignore_ascii_case(&prefix) && at_word_boundary).then_some(rest)
}

/// `order_line`, `order-line` or `order.line` → `OrderLine`.
fn pascal_case(name: &str) -> String {
    name.split(['_', '-', '.'])
        .flat_map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .into_iter()
                .flat_map(char::to_uppercase)
                .chain(chars)
        })
        .collect()
}

/// `PaymentCaptured` → `payment_captured`, `HTTPRequestSent` → `http_request_sent`.
pub(crate) fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).and_then(|p| chars.get(p)).copied();
            let next = chars.get(i + 1).copied();
            let starts_word = match prev {
                None | Some('_') => false,
                Some(p) if p.is_lowercase() || p.is_ascii_digit() => true,
                Some(p) if p.is_uppercase() => next.is_some_and(char::is_lowercase),
                Some(_) => false,
            };
            if starts_word {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The first character of `name` that is not allowed in an aggregate or event
/// type (allowed: ASCII letters and digits, `_`, `.` and `-`).
pub(crate) fn first_invalid_char(name: &str) -> Option<char> {
    name.chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
}

/// How to show an invalid character in an error message.
pub(crate) fn describe_char(c: char) -> String {
    if c == ' ' {
        "a space".to_owned()
    } else if c.is_whitespace() {
        format!("whitespace ({c:?})")
    } else {
        format!("`{c}`")
    }
}

#[cfg(test)]
mod tests {
    use super::{default_event_type, first_invalid_char, pascal_case, snake_case};

    #[test]
    fn snake_case_splits_words() {
        assert_eq!(snake_case("Placed"), "placed");
        assert_eq!(snake_case("PaymentCaptured"), "payment_captured");
        assert_eq!(snake_case("HTTPRequestSent"), "http_request_sent");
        assert_eq!(snake_case("ItemV2Added"), "item_v2_added");
        assert_eq!(snake_case("Version2"), "version2");
        assert_eq!(snake_case("Already_Split"), "already_split");
        assert_eq!(snake_case("lower"), "lower");
    }

    #[test]
    fn pascal_case_joins_words() {
        assert_eq!(pascal_case("order"), "Order");
        assert_eq!(pascal_case("order_line"), "OrderLine");
        assert_eq!(pascal_case("order-line"), "OrderLine");
        assert_eq!(pascal_case("shop.order"), "ShopOrder");
        assert_eq!(pascal_case(""), "");
    }

    #[test]
    fn default_event_type_drops_the_aggregate_prefix() {
        assert_eq!(default_event_type("order", "OrderPlaced"), "order.placed");
        assert_eq!(
            default_event_type("order_line", "OrderLineAdded"),
            "order_line.added"
        );
        assert_eq!(
            default_event_type("order", "PaymentCaptured"),
            "order.payment_captured"
        );
        assert_eq!(default_event_type("order", "Placed"), "order.placed");
        assert_eq!(default_event_type("ORDER", "OrderPlaced"), "ORDER.placed");
    }

    #[test]
    fn default_event_type_keeps_whole_words() {
        assert_eq!(default_event_type("order", "Order"), "order.order");
        assert_eq!(default_event_type("order", "Orderly"), "order.orderly");
        assert_eq!(
            default_event_type("order", "OrderlyShutdown"),
            "order.orderly_shutdown"
        );
        assert_eq!(default_event_type("", "Placed"), ".placed");
    }

    #[test]
    fn invalid_chars_are_found() {
        assert_eq!(first_invalid_char("order.placed-v2_x"), None);
        assert_eq!(first_invalid_char("order placed"), Some(' '));
        assert_eq!(first_invalid_char("order/placed"), Some('/'));
        assert_eq!(first_invalid_char("ordér"), Some('é'));
    }
}
