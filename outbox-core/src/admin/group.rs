//! Failure groups: errors that differ only in numbers and ids are one
//! failure.

/// The longest normalized error kept, in bytes (cut at a char boundary).
pub const MAX_NORMALIZED_BYTES: usize = 300;

/// An error text with what varies between occurrences of the same failure
/// replaced: UUIDs by `<id>`, runs of 8 or more hex digits by `<hex>`, other
/// numbers by `<n>`, and runs of whitespace by one space; cut to
/// [`MAX_NORMALIZED_BYTES`].
///
/// ```
/// use outbox_core::admin::normalize_error;
///
/// assert_eq!(
///     normalize_error("nack for 0190f3c2-7a44-7c1e-9d2b-1f2e3d4c5b6a after 1500 ms"),
///     "nack for <id> after <n> ms",
/// );
/// assert_eq!(normalize_error("channel 7 closed:  406"), "channel <n> closed: <n>");
/// ```
pub fn normalize_error(error: &str) -> String {
    let bytes = error.as_bytes();
    let mut out = String::with_capacity(error.len().min(MAX_NORMALIZED_BYTES));
    let mut i = 0;
    while i < bytes.len() && out.len() < MAX_NORMALIZED_BYTES {
        let b = bytes[i];
        let word_start = i == 0 || !is_word(bytes[i - 1]);
        if word_start && b.is_ascii_hexdigit() {
            if let Some(len) = uuid_len(&bytes[i..]) {
                out.push_str("<id>");
                i += len;
                continue;
            }
            let hex = bytes[i..]
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .count();
            let ends_word = bytes.get(i + hex).is_none_or(|b| !is_word(*b));
            if hex >= 8 && ends_word {
                out.push_str("<hex>");
                i += hex;
                continue;
            }
        }
        if b.is_ascii_digit() {
            let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            out.push_str("<n>");
            i += digits;
            continue;
        }
        if b.is_ascii_whitespace() {
            let spaces = bytes[i..]
                .iter()
                .take_while(|b| b.is_ascii_whitespace())
                .count();
            out.push(' ');
            i += spaces;
            continue;
        }
        // Copy one whole character (the index is always at a boundary: only
        // ASCII bytes were consumed above).
        let rest = &error[i..];
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        i += c.len_utf8();
    }
    if out.len() > MAX_NORMALIZED_BYTES {
        let mut cut = MAX_NORMALIZED_BYTES;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out.trim().to_owned()
}

/// The stable id of a failure group: 16 hex digits of the FNV-1a hash of the
/// event type and the [normalized](normalize_error) error. Stable across
/// versions and processes, so a group id printed by one command can be given
/// to another.
///
/// ```
/// use outbox_core::admin::group_id;
///
/// assert_eq!(group_id("order.placed", "nack"), group_id("order.placed", "nack"));
/// assert_ne!(group_id("order.placed", "nack"), group_id("order.paid", "nack"));
/// assert_eq!(group_id("a", "b").len(), 16);
/// ```
pub fn group_id(event_type: &str, normalized_error: &str) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for b in event_type
        .bytes()
        .chain(std::iter::once(0))
        .chain(normalized_error.bytes())
    {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(PRIME);
    }
    format!("{hash:016x}")
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The length of a UUID (8-4-4-4-12 hex digits) at the start of `s`.
fn uuid_len(s: &[u8]) -> Option<usize> {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    let mut i = 0;
    for (n, len) in GROUPS.iter().enumerate() {
        if n > 0 {
            if s.get(i) != Some(&b'-') {
                return None;
            }
            i += 1;
        }
        let group = s.get(i..i + len)?;
        if !group.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        i += len;
    }
    if s.get(i).is_some_and(|b| is_word(*b)) {
        return None;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_numbers_and_hashes_are_stripped() {
        assert_eq!(
            normalize_error("NOT_FOUND - no exchange 'orders-42' in vhost '/'"),
            "NOT_FOUND - no exchange 'orders-<n>' in vhost '/'"
        );
        assert_eq!(
            normalize_error("row 0190F3C2-7A44-7C1E-9D2B-1F2E3D4C5B6A: bad"),
            "row <id>: bad"
        );
        assert_eq!(
            normalize_error("digest deadbeefcafe1234 bad"),
            "digest <hex> bad"
        );
        // Words that merely contain hex letters stay.
        assert_eq!(normalize_error("decade faded"), "decade faded");
        assert_eq!(normalize_error("  a \n\t b  "), "a b");
        assert_eq!(normalize_error("timeout after 5s"), "timeout after <n>s");
    }

    #[test]
    fn the_same_failure_with_other_ids_is_one_group() {
        let a =
            normalize_error("confirm timed out for 0190f3c2-7a44-7c1e-9d2b-1f2e3d4c5b6a (seq 17)");
        let b = normalize_error(
            "confirm timed out for 0190f3c3-0000-7c1e-9d2b-aaaaaaaaaaaa (seq 9912)",
        );
        assert_eq!(a, b);
        assert_eq!(group_id("x", &a), group_id("x", &b));
    }

    #[test]
    fn long_and_non_ascii_errors_are_cut_at_a_char_boundary() {
        let long = "é".repeat(1_000);
        let normalized = normalize_error(&long);
        assert!(normalized.len() <= MAX_NORMALIZED_BYTES);
        assert!(normalized.chars().all(|c| c == 'é'));
        assert_eq!(normalize_error(""), "");
    }
}
