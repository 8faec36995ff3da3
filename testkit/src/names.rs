//! Unique names for what a test creates (schemas, databases, exchanges,
//! queues, connection names), so tests run in parallel, in one process or
//! many, without sharing anything.
//!
//! A name is `<prefix>_<test>_<pid>_<n>`: the process id and a counter of
//! this process make it unique; the prefix and the test name say whose it
//! is when one is left behind. The counter starts at a value read off the
//! clock, so a process that gets the pid of an earlier, killed run is
//! unlikely to meet the names that run left behind. PostgreSQL cuts identifiers at
//! [`MAX_IDENTIFIER`] bytes, so a name is cut to that length, in the test
//! part (the unique tail stays) and at a character boundary.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1` bytes);
/// longer ones are silently cut, so two long names could meet.
pub const MAX_IDENTIFIER: usize = 63;

/// The one counter of this process behind every [`unique`] name.
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Where this process's counter starts: the clock's microseconds within a
/// one-second window (six digits at most: names stay short).
fn start() -> u32 {
    static START: OnceLock<u32> = OnceLock::new();
    *START.get_or_init(|| {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        // Below 10^6: fits a u32.
        u32::try_from(micros % 1_000_000).unwrap_or(0)
    })
}

/// `<prefix>_<test>_<pid>_<n>`, at most [`MAX_IDENTIFIER`] bytes: the test
/// part is cut (at a character boundary) when the whole would be longer,
/// never the process id or the counter.
///
/// ```
/// use outbox_testkit::names::{MAX_IDENTIFIER, unique};
///
/// let a = unique("t", "claims_are_fair");
/// let b = unique("t", "claims_are_fair");
/// assert_ne!(a, b);
/// assert!(a.starts_with(&format!("t_claims_are_fair_{}_", std::process::id())));
/// assert!(unique("t", &"é".repeat(100)).len() <= MAX_IDENTIFIER);
/// ```
pub fn unique(prefix: &str, test: &str) -> String {
    let n = u64::from(start()) + u64::from(COUNTER.fetch_add(1, Ordering::Relaxed));
    let tail = format!("_{}_{n}", std::process::id());
    let head = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}_")
    };
    let room = MAX_IDENTIFIER.saturating_sub(head.len() + tail.len());
    let mut name = head;
    name.push_str(cut(test, room));
    name.push_str(&tail);
    // A prefix that alone is too long: cut the whole (still unique for
    // prefixes shorter than the limit, which every caller's is).
    cut(&name, MAX_IDENTIFIER).to_owned()
}

/// The longest start of `name` that is at most `max` bytes and ends at a
/// character boundary.
///
/// ```
/// use outbox_testkit::names::cut;
///
/// assert_eq!(cut("abcdef", 4), "abcd");
/// assert_eq!(cut("aé", 2), "a"); // `é` is two bytes: not cut in half
/// assert_eq!(cut("short", 63), "short");
/// ```
pub fn cut(name: &str, max: usize) -> &str {
    if name.len() <= max {
        return name;
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// [`unique`], then padded with `x` to exactly [`MAX_IDENTIFIER`] bytes: the
/// longest name PostgreSQL takes, for tests of names at the limit.
///
/// ```
/// use outbox_testkit::names::{MAX_IDENTIFIER, longest};
///
/// assert_eq!(longest("t", "long").len(), MAX_IDENTIFIER);
/// ```
pub fn longest(prefix: &str, test: &str) -> String {
    let mut name = unique(prefix, test);
    name.push('_');
    while name.len() < MAX_IDENTIFIER {
        name.push('x');
    }
    cut(&name, MAX_IDENTIFIER).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_within_a_process() {
        let names: std::collections::HashSet<String> =
            (0..1_000).map(|_| unique("t", "same_test")).collect();
        assert_eq!(names.len(), 1_000);
    }

    #[test]
    fn a_long_test_name_is_cut_but_the_unique_tail_stays() {
        let test = "a".repeat(200);
        let name = unique("prefix", &test);
        assert_eq!(name.len(), MAX_IDENTIFIER);
        assert!(name.starts_with("prefix_aaa"));
        let tail = format!("_{}_", std::process::id());
        assert!(name.contains(&tail), "{name} keeps the pid");
        let other = unique("prefix", &test);
        assert_ne!(name, other, "two long names still differ");
    }

    #[test]
    fn names_are_cut_at_a_character_boundary() {
        for width in 0..4 {
            // Shift the multi-byte characters across the cut.
            let test = format!("{}{}", "a".repeat(width), "ü€𝄞".repeat(30));
            let name = unique("t", &test);
            assert!(name.len() <= MAX_IDENTIFIER, "{name}");
            assert!(
                name.len() >= MAX_IDENTIFIER - 3,
                "cut no more than a character"
            );
            assert!(std::str::from_utf8(name.as_bytes()).is_ok());
        }
        assert_eq!(cut("𝄞", 3), "");
        assert_eq!(cut("a𝄞", 4), "a");
        assert_eq!(cut("a𝄞", 5), "a𝄞");
    }

    #[test]
    fn a_short_name_is_kept_whole() {
        let name = unique("t_cli", "status");
        assert_eq!(
            name.rsplit_once('_').map(|(head, _)| head.to_owned()),
            Some(format!("t_cli_status_{}", std::process::id()))
        );
    }

    #[test]
    fn an_empty_prefix_adds_no_separator() {
        assert!(unique("", "x").starts_with(&format!("x_{}_", std::process::id())));
    }

    #[test]
    fn the_longest_name_is_exactly_the_limit() {
        assert_eq!(longest("t", "short").len(), MAX_IDENTIFIER);
        assert_eq!(longest("t", &"b".repeat(100)).len(), MAX_IDENTIFIER);
        assert_eq!(longest("t", &"é".repeat(100)).len(), MAX_IDENTIFIER);
    }
}
